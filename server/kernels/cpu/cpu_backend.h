// The cpu backend: the embedded default where no GPU is present. bf16
// operands are widened to fp32 exactly and OpenBLAS sgemm accumulates in
// fp32, so it keeps the same numerical contract as the cuda backend.
#pragma once

#include <memory>

#include "server/kernels/backend.h"

namespace logitd::kernels::cpu {

// Sets OpenBLAS's thread count from options.cpu_threads when it is > 0 (a
// process-wide setting: OpenBLAS has one thread pool).
std::unique_ptr<Backend> CreateCpuBackend(const BackendOptions& options);

}  // namespace logitd::kernels::cpu
