// Admission of tensor calls against the server's request memory and its cap
// on concurrent requests. A call declares, once its header is validated and
// before any of its buffers exist, the bytes it will hold (the tensors it
// receives, the outputs and scratch the service allocates for it); it is
// admitted when that fits next to the calls in flight, waits while it does
// not, and is refused with a clear status when it never can or the wait runs
// out. What it was granted is held by an AdmissionTicket and given back when
// the ticket goes, so every way out of a handler (error, cancellation,
// deadline, success) returns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace logitd::service {

struct AdmissionOptions {
  // Calls holding request memory at once; 0 means no cap.
  std::uint32_t max_concurrent_requests = 64;
  // Bytes all admitted calls may hold together.
  std::uint64_t memory_bytes = std::uint64_t{16} << 30;
  // Longest a call waits for admission when its deadline is later (or none).
  absl::Duration max_wait = absl::Seconds(30);
};

// What ServerInfo reports.
struct AdmissionStats {
  std::uint64_t bytes_in_flight = 0;
  std::uint64_t bytes_high_water = 0;
  std::uint32_t requests_in_flight = 0;
  std::uint32_t requests_high_water = 0;
};

class RequestAdmission;

// One admitted call's share. Move-only; returns it when destroyed.
class AdmissionTicket {
 public:
  AdmissionTicket() = default;
  AdmissionTicket(AdmissionTicket&& o) noexcept;
  AdmissionTicket& operator=(AdmissionTicket&& o) noexcept;
  AdmissionTicket(const AdmissionTicket&) = delete;
  AdmissionTicket& operator=(const AdmissionTicket&) = delete;
  ~AdmissionTicket();

  bool active() const { return owner_ != nullptr; }
  std::uint64_t bytes() const { return bytes_; }
  // Time spent waiting for admission; zero when admitted at once.
  absl::Duration waited() const { return waited_; }

 private:
  friend class RequestAdmission;
  AdmissionTicket(RequestAdmission* owner, std::uint64_t bytes, absl::Duration waited,
                  std::string tenant)
      : owner_(owner), bytes_(bytes), waited_(waited), tenant_(std::move(tenant)) {}
  void Reset();

  RequestAdmission* owner_ = nullptr;
  std::uint64_t bytes_ = 0;
  absl::Duration waited_ = absl::ZeroDuration();
  std::string tenant_;
};

class RequestAdmission {
 public:
  explicit RequestAdmission(AdmissionOptions options);
  RequestAdmission(const RequestAdmission&) = delete;
  RequestAdmission& operator=(const RequestAdmission&) = delete;

  // Admits a call (`what`, e.g. "logits", for messages) that will hold
  // `bytes`. Waits while the concurrency cap or the memory budget is taken
  // by other calls, until `deadline` (the call's) or max_wait, whichever
  // comes first, and returns early when `cancelled` says so (polled).
  //   ResourceExhausted: `bytes` exceeds the whole budget (at once), or the
  //     wait ran out before the call's deadline.
  //   DeadlineExceeded: the call's deadline passed while it waited.
  //   Cancelled: `cancelled` returned true while it waited.
  // The call is counted for `tenant` as well (TenantStats).
  absl::StatusOr<AdmissionTicket> Admit(absl::string_view what, std::uint64_t bytes,
                                        absl::Time deadline, const std::function<bool()>& cancelled,
                                        absl::string_view tenant = "");

  AdmissionStats Stats() const;
  // The same figures for the calls of one tenant only.
  AdmissionStats TenantStats(absl::string_view tenant) const;
  const AdmissionOptions& options() const { return options_; }

 private:
  friend class AdmissionTicket;
  void Release(std::uint64_t bytes, const std::string& tenant);
  bool FitsLocked(std::uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AdmissionOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar released_;
  AdmissionStats stats_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, AdmissionStats, std::less<>> tenants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::service
