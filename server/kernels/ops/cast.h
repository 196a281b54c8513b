// The cast: out[i] = bf16(in[i]), round to nearest even, the cast Backward
// applies to dY. Kernels: cpu/cast.cc, cuda/cast.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "logitd/bf16.h"
#include "server/kernels/kernel.h"

namespace logitd::kernels {

struct CastArgs {
  static constexpr absl::string_view kName = "cast to bf16";
  const float* in = nullptr;  // [n] fp32
  std::int64_t n = 0;         // 0: nothing to do (in and out may be null)
  Bf16Bits* out = nullptr;    // [n] bf16
};

inline absl::Status CheckArgs(const CastArgs& args) {
  if (args.n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cast to bf16: expected n >= 0, got ", args.n));
  }
  if (args.n > 0 && (args.in == nullptr || args.out == nullptr)) {
    return absl::InvalidArgumentError("cast to bf16: in or out is null");
  }
  return absl::OkStatus();
}

inline std::vector<KernelOutput> OutputsOf(const CastArgs& args) {
  return {{"output", DType::kBf16, reinterpret_cast<std::byte*>(args.out),
           static_cast<std::size_t>(args.n) * sizeof(Bf16Bits)}};
}

}  // namespace logitd::kernels
