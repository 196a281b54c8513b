// Checks of request headers against the contract, as pure functions so that
// every bad-input class can be tested without gRPC: dtypes, ranks, shapes
// against the weight, overflow of shape products, the per-call byte limit,
// and the defaults for unspecified output dtypes and alpha.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"

namespace logitd::service {

// The registered weight a request runs against.
struct WeightDims {
  std::int64_t v = 0;
  std::int64_t k = 0;
  // How messages name it: "'lm_head' [32768, 4096]".
  std::string label;
};

// A weight upload's header, checked: BF16, rank 2 [V, K], no overflow.
struct WeightPlan {
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::uint64_t bytes = 0;
};
absl::StatusOr<WeightPlan> ValidateRegisterWeight(const v1::RegisterWeightHeader& header);

struct LogitsPlan {
  std::int64_t m = 0;
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
  std::uint64_t x_bytes = 0;
  std::uint64_t y_bytes = 0;
};
// InvalidArgument for a bad x, out dtype or alpha; ResourceExhausted when x
// and y together exceed max_request_bytes.
absl::StatusOr<LogitsPlan> ValidateLogits(const v1::LogitsHeader& header, const WeightDims& weight,
                                          std::uint64_t max_request_bytes);

struct BackwardPlan {
  std::int64_t m = 0;
  DType dy_dtype = DType::kFp32;
  bool want_dx = false;
  bool want_dw = false;
  bool accumulate_dw = false;
  DType dx_dtype = DType::kBf16;
  DType dw_dtype = DType::kFp32;
  std::uint64_t dy_bytes = 0;
  std::uint64_t x_bytes = 0;
  // 0 when the tensor is not returned.
  std::uint64_t dx_bytes = 0;
  std::uint64_t dw_bytes = 0;
  // True when dW travels back (wanted and not accumulated).
  bool returns_dw() const { return want_dw && !accumulate_dw; }
};
absl::StatusOr<BackwardPlan> ValidateBackward(const v1::BackwardHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes);

struct CastPlan {
  std::vector<std::int64_t> shape;
  std::int64_t n = 0;
  std::uint64_t in_bytes = 0;
  std::uint64_t out_bytes = 0;
};
absl::StatusOr<CastPlan> ValidateCast(const v1::CastHeader& header,
                                      std::uint64_t max_request_bytes);

// A weight_handle/handle field: InvalidArgument when empty (a missing field,
// not an unknown handle, which the registry reports as NotFound).
absl::Status ValidateHandle(absl::string_view handle);

}  // namespace logitd::service
