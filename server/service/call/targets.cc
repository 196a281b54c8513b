// The part of plans.h that runs once a call's tensors have arrived: the
// targets checked and widened, and the cross-entropy's gradient scale and
// reduced loss.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/service/call/plans.h"

namespace logitd::service {

absl::StatusOr<std::int64_t> ConvertTargets(const Tensor& targets, std::int64_t v,
                                            std::int64_t ignore_index,
                                            std::vector<std::int64_t>* out) {
  return ConvertTargets(targets.dtype(), targets.bytes(), targets.numel(), v, ignore_index, out);
}

absl::StatusOr<std::int64_t> ConvertTargets(DType dtype, const std::byte* data, std::int64_t n,
                                            std::int64_t v, std::int64_t ignore_index,
                                            std::vector<std::int64_t>* out) {
  out->resize(static_cast<std::size_t>(n));
  return ConvertTargetRows(dtype, data, 0, n, v, ignore_index, out->data());
}

absl::StatusOr<std::int64_t> ConvertTargetRows(DType dtype, const std::byte* data, std::int64_t r0,
                                               std::int64_t rows, std::int64_t v,
                                               std::int64_t ignore_index, std::int64_t* out) {
  if (dtype != DType::kInt32 && dtype != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("targets: expected dtype INT32 or INT64, got ", DTypeName(dtype)));
  }
  const std::size_t size = dtype == DType::kInt32 ? 4 : 8;
  for (std::int64_t i = r0; i < r0 + rows; ++i) {
    // memcpy: a slice of a shared-memory region need not be aligned.
    if (dtype == DType::kInt32) {
      std::int32_t t;
      std::memcpy(&t, data + static_cast<std::size_t>(i) * size, 4);
      out[i] = t;
    } else {
      std::memcpy(&out[i], data + static_cast<std::size_t>(i) * size, 8);
    }
  }
  std::int64_t counted = 0;
  for (std::int64_t i = r0; i < r0 + rows; ++i) {
    const std::int64_t t = out[i];
    if (t == ignore_index) continue;
    if (t < 0 || t >= v) {
      return absl::InvalidArgumentError(absl::StrCat("targets[", i, "] = ", t,
                                                     ": expected a token id in [0, ", v,
                                                     ") or ignore_index ", ignore_index));
    }
    ++counted;
  }
  return counted;
}

float CrossEntropyGradScale(const CrossEntropyPlan& plan, std::int64_t counted) {
  if (plan.reduction != Reduction::kMean || counted == 0) return plan.grad_scale;
  return plan.grad_scale / static_cast<float>(counted);
}

float ReduceLoss(const CrossEntropyPlan& plan, const float* loss, std::int64_t m,
                 std::int64_t counted) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < m; ++i) sum += static_cast<double>(loss[i]);
  if (plan.reduction != Reduction::kMean) return static_cast<float>(sum);
  if (counted == 0) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(sum / static_cast<double>(counted));
}

}  // namespace logitd::service
