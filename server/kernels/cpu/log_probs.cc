// LogProbs on the cpu: blocks of kBlasRows rows, each a walk of its own
// over the vocabulary (cpu/walks.cc; the cross-entropy's first pass does
// the same).
#include "server/kernels/ops/log_probs.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "server/kernels/cpu/cpu_backend_class.h"
#include "server/kernels/cpu/cpu_blas.h"
#include "server/kernels/cpu/walks.h"
#include "server/kernels/kernel_table.h"

namespace logitd::kernels {

using cpu::CpuBackend;

template <>
struct KernelOf<CpuBackend, LogProbsArgs> {
  static absl::Status Run(CpuBackend& /*backend*/, const LogProbsArgs& args, Timing* timing) {
    const auto start = std::chrono::steady_clock::now();
    const cpu::CpuWeight* cw = cpu::AsCpuWeight(*args.weight);
    if (cw == nullptr) return ForeignWeightError("log probs", "cpu", *args.weight);
    const cpu::CpuWeight& w = *cw;
    LOGITD_RETURN_IF_ERROR(cpu::CheckBlasRows("log probs", args.m));
    for (std::int64_t r0 = 0; r0 < args.m; r0 += cpu::kBlasRows) {
      const LogProbsArgs block =
          LogProbsRowsOf(args, w.k(), r0, std::min(cpu::kBlasRows, args.m - r0));
      LOGITD_RETURN_IF_ERROR(cpu::LogProbsRows(w, block));
    }
    cpu::SetTiming(timing, start);
    return absl::OkStatus();
  }
};

LOGITD_KERNEL(CpuBackend, LogProbsArgs);

}  // namespace logitd::kernels
