#include "server/service/state/admission.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace logitd::service {
namespace {

// How often a waiting call looks at its cancellation flag.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);

}  // namespace

AdmissionTicket::AdmissionTicket(AdmissionTicket&& o) noexcept
    : owner_(std::exchange(o.owner_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      waited_(o.waited_),
      tenant_(std::move(o.tenant_)) {}

AdmissionTicket& AdmissionTicket::operator=(AdmissionTicket&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = std::exchange(o.owner_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    waited_ = o.waited_;
    tenant_ = std::move(o.tenant_);
  }
  return *this;
}

AdmissionTicket::~AdmissionTicket() { Reset(); }

void AdmissionTicket::Reset() {
  if (owner_ != nullptr) owner_->Release(bytes_, tenant_);
  owner_ = nullptr;
  bytes_ = 0;
}

RequestAdmission::RequestAdmission(AdmissionOptions options) : options_(options) {}

bool RequestAdmission::FitsLocked(std::uint64_t bytes) const {
  const bool slot = options_.max_concurrent_requests == 0 ||
                    stats_.requests_in_flight < options_.max_concurrent_requests;
  return slot && bytes <= options_.memory_bytes - stats_.bytes_in_flight;
}

absl::StatusOr<AdmissionTicket> RequestAdmission::Admit(absl::string_view what, std::uint64_t bytes,
                                                        absl::Time deadline,
                                                        const std::function<bool()>& cancelled,
                                                        absl::string_view tenant) {
  if (bytes > options_.memory_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: the call needs %d bytes of request memory, more than the server's whole budget of "
        "%d bytes (server flag --request_memory_bytes); split it into smaller calls",
        what, bytes, options_.memory_bytes));
  }
  const absl::Time start = absl::Now();
  const absl::Time limit = std::min(deadline, start + options_.max_wait);
  absl::MutexLock lock(&mu_);
  bool queued = false;
  while (!FitsLocked(bytes)) {
    queued = true;
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          absl::StrFormat("%s: cancelled while waiting for admission", what));
    }
    const absl::Time now = absl::Now();
    if (now >= limit) {
      const std::string in_use = absl::StrFormat(
          "%d of %d bytes of request memory held by %d calls (limit %d concurrent calls)",
          stats_.bytes_in_flight, options_.memory_bytes, stats_.requests_in_flight,
          options_.max_concurrent_requests);
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "%s: the call's deadline passed after %s waiting for %d bytes of request memory; %s",
            what, absl::FormatDuration(now - start), bytes, in_use));
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: waited %s for %d bytes of request memory and a request slot; %s (server flags "
          "--request_memory_bytes, --max_concurrent_requests); retry later",
          what, absl::FormatDuration(now - start), bytes, in_use));
    }
    released_.WaitWithDeadline(&mu_, std::min(limit, now + kCancelPoll));
  }
  for (AdmissionStats* s : {&stats_, &tenants_[std::string(tenant)]}) {
    s->bytes_in_flight += bytes;
    s->requests_in_flight += 1;
    s->bytes_high_water = std::max(s->bytes_high_water, s->bytes_in_flight);
    s->requests_high_water = std::max(s->requests_high_water, s->requests_in_flight);
  }
  return AdmissionTicket(this, bytes, queued ? absl::Now() - start : absl::ZeroDuration(),
                         std::string(tenant));
}

void RequestAdmission::Release(std::uint64_t bytes, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  for (AdmissionStats* s : {&stats_, &tenants_[std::string(tenant)]}) {
    s->bytes_in_flight -= bytes;
    s->requests_in_flight -= 1;
  }
  released_.SignalAll();
}

AdmissionStats RequestAdmission::TenantStats(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  const auto it = tenants_.find(tenant);
  return it == tenants_.end() ? AdmissionStats{} : it->second;
}

AdmissionStats RequestAdmission::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace logitd::service
