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
      return cpu::CreateCpuBackend(options);

    case BackendKind::kCuda: {
#ifdef LOGITD_HAVE_CUDA
      absl::StatusOr<std::unique_ptr<Backend>> created = cuda::CreateCudaBackend(options);
      if (created.ok() && why != nullptr) *why = "cuda: requested with --backend=cuda";
      return created;
#else
      return absl::FailedPreconditionError(
          "this logitd was built without the cuda backend (LOGITD_WITH_CUDA=OFF)");
#endif
    }

    case BackendKind::kAuto: {
#ifdef LOGITD_HAVE_CUDA
      absl::StatusOr<std::unique_ptr<Backend>> created = cuda::CreateCudaBackend(options);
      if (created.ok()) {
        if (why != nullptr) {
          *why = absl::StrCat("auto: CUDA device ", options.device, " (",
                              (*created)->Info().device_name, ") visible; using cuda");
        }
        return created;
      }
      // Only "no usable device" falls back. A bad --device, or a device that
      // is there but failed, is an error the operator should see rather than
      // a silent switch to a much slower backend.
      const absl::StatusCode code = created.status().code();
      if (code != absl::StatusCode::kFailedPrecondition && code != absl::StatusCode::kUnavailable) {
        return created.status();
      }
      if (why != nullptr) {
        *why = absl::StrCat("auto: no CUDA device visible (", created.status().message(),
                            "); using cpu");
      }
#else
      if (why != nullptr) {
        *why =
            "auto: this logitd was built without the cuda backend (LOGITD_WITH_CUDA=OFF); "
            "using cpu";
      }
#endif
      return cpu::CreateCpuBackend(options);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend kind ", static_cast<int>(options.kind)));
}

}  // namespace logitd::kernels
