#include "server/service/shared/shared_state.h"

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/service/faults/fault_backend.h"

namespace logitd::service {
namespace {

std::shared_ptr<Authenticator> DefaultAuthenticator() {
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(AuthOptions{});
  return auth.ok() ? std::shared_ptr<Authenticator>(std::move(*auth)) : nullptr;
}

}  // namespace

SharedState::SharedState(std::unique_ptr<kernels::Backend> backend, ServiceOptions options)
    : faults_(std::make_shared<FaultInjector>(options.faults)),
      backend_(WithOutputFaults(std::move(backend), faults_)),
      options_(options),
      auth_(options.auth != nullptr ? options.auth : DefaultAuthenticator()),
      registry_(options.weight_budget_bytes),
      admission_(options.admission),
      shm_(options.shm),
      runner_(auth_.get(), backend_.get(), options.metrics) {}

std::string PinShmRegion(kernels::Backend& backend, ShmMapping* mapping) {
  // Page-locked, the device copies to and from the region at full speed;
  // a region that cannot be stays usable at the pageable rate.
  const absl::Time pin_start = absl::Now();
  absl::StatusOr<std::shared_ptr<void>> pin =
      backend.PinHostMemory(mapping->base(), static_cast<std::size_t>(mapping->bytes()));
  if (!pin.ok()) {
    return absl::StrCat("not page-locked (", pin.status().message(),
                        "): device copies use the pageable path");
  }
  if (*pin == nullptr) return "not page-locked (the backend has no device)";
  mapping->set_pin(*std::move(pin));
  return absl::StrCat("page-locked in ", absl::FormatDuration(absl::Now() - pin_start));
}

}  // namespace logitd::service
