// CreateBackend, the one place that knows every backend. It lives apart from
// backend.cc because the backends link that (the contract they share) and
// this links the backends.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/kernels/backend.h"
#include "server/kernels/cpu/cpu_backend.h"

#ifdef LOGITD_HAVE_CUDA
#include "server/kernels/cuda/cuda_backend.h"
#endif

namespace logitd::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options,
                                                       std::string* why) {
  switch (options.kind) {
    case BackendKind::kCpu:
      if (why != nullptr) *why = "cpu: requested with --backend=cpu";
      return CreateCpuBackend(options);

    case BackendKind::kCuda: {
#ifdef LOGITD_HAVE_CUDA
      absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(options);
      if (cuda.ok() && why != nullptr) *why = "cuda: requested with --backend=cuda";
      return cuda;
#else
      return absl::FailedPreconditionError(
          "this logitd was built without the cuda backend (LOGITD_WITH_CUDA=OFF)");
#endif
    }

    case BackendKind::kAuto: {
#ifdef LOGITD_HAVE_CUDA
      absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend(options);
      if (cuda.ok()) {
        if (why != nullptr) {
          *why = absl::StrCat("auto: CUDA device ", options.device, " (",
                              (*cuda)->Info().device_name, ") visible; using cuda");
        }
        return cuda;
      }
      // Only "no usable device" falls back. A bad --device, or a device that
      // is there but failed, is an error the operator should see rather than
      // a silent switch to a much slower backend.
      const absl::StatusCode code = cuda.status().code();
      if (code != absl::StatusCode::kFailedPrecondition && code != absl::StatusCode::kUnavailable) {
        return cuda.status();
      }
      if (why != nullptr) {
        *why =
            absl::StrCat("auto: no CUDA device visible (", cuda.status().message(), "); using cpu");
      }
#else
      if (why != nullptr) {
        *why =
            "auto: this logitd was built without the cuda backend (LOGITD_WITH_CUDA=OFF); "
            "using cpu";
      }
#endif
      return CreateCpuBackend(options);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend kind ", static_cast<int>(options.kind)));
}

}  // namespace logitd::kernels
