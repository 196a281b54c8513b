#include "server/kernels/device_health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace logitd::kernels {

DeviceHealth::DeviceHealth(absl::Duration timeout, std::function<void(const absl::Status&)> lost)
    : timeout_(timeout), lost_callback_(std::move(lost)) {
  if (timeout_ > absl::ZeroDuration()) watchdog_ = std::thread([this] { WatchdogLoop(); });
}

DeviceHealth::~DeviceHealth() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (watchdog_.joinable()) watchdog_.join();
}

absl::Status DeviceHealth::status() const {
  absl::MutexLock lock(&mu_);
  return cause_;
}

bool DeviceHealth::lost() const {
  absl::MutexLock lock(&mu_);
  return !cause_.ok();
}

void DeviceHealth::MarkLost(const absl::Status& cause) {
  absl::Status reported;
  {
    absl::MutexLock lock(&mu_);
    if (!cause_.ok()) return;
    cause_ = absl::UnavailableError(
        absl::StrCat("device lost: ", cause.message().empty() ? "unknown cause" : cause.message()));
    reported = cause_;
  }
  if (lost_callback_) lost_callback_(reported);
}

DeviceHealth::Watch& DeviceHealth::Watch::operator=(Watch&& o) noexcept {
  if (this != &o) {
    End();
    health_ = o.health_;
    id_ = o.id_;
    o.health_ = nullptr;
  }
  return *this;
}

void DeviceHealth::Watch::End() {
  if (health_ == nullptr) return;
  {
    absl::MutexLock lock(&health_->mu_);
    health_->running_.erase(id_);
  }
  health_ = nullptr;
}

DeviceHealth::Watch DeviceHealth::Begin(std::string what) {
  if (timeout_ <= absl::ZeroDuration()) return Watch();
  absl::MutexLock lock(&mu_);
  const std::uint64_t id = next_id_++;
  running_.emplace(id, Running{std::move(what), absl::Now()});
  return Watch(this, id);
}

void DeviceHealth::WatchdogLoop() {
  // Looks four times per timeout (at most every 250 ms), so a hang is
  // reported within 1.25 timeouts.
  const absl::Duration period = std::min(timeout_ / 4, absl::Milliseconds(250));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Until stopped or the period ends.
    const absl::Time wake = absl::Now() + period;
    while (!stopping_ && !cv_.WaitWithDeadline(&mu_, wake)) {
    }
    if (stopping_ || !cause_.ok()) continue;
    const absl::Time now = absl::Now();
    for (const auto& [id, r] : running_) {
      if (now - r.since <= timeout_) continue;
      const absl::Status hung = absl::DeadlineExceededError(absl::StrFormat(
          "%s has not finished after %s (device_timeout %s): the device is presumed hung", r.what,
          absl::FormatDuration(absl::Trunc(now - r.since, absl::Milliseconds(1))),
          absl::FormatDuration(timeout_)));
      mu_.Unlock();
      MarkLost(hung);
      mu_.Lock();
      break;
    }
  }
}

}  // namespace logitd::kernels
