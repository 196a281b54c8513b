// The cuda backend's factory. No CUDA headers here: the service and the
// backend factory include this from plain C++ code, and the binary still
// starts where no driver is installed (the factory then says why it cannot).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/kernels/backend.h"

namespace logitd::kernels::cuda {

// FailedPrecondition, with the reason, when no CUDA device is visible or the
// driver cannot be used, so that --backend=auto falls back to cpu;
// InvalidArgument for a bad options.device.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace logitd::kernels::cuda
