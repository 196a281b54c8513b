#include "server/kernels/device_health.h"

#include <chrono>
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
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

absl::Status DeviceHealth::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cause_;
}

bool DeviceHealth::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !cause_.ok();
}

void DeviceHealth::MarkLost(const absl::Status& cause) {
  absl::Status reported;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(health_->mu_);
    health_->running_.erase(id_);
  }
  health_ = nullptr;
}

DeviceHealth::Watch DeviceHealth::Begin(std::string what) {
  if (timeout_ <= absl::ZeroDuration()) return Watch();
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t id = next_id_++;
  running_.emplace(id, Running{std::move(what), absl::Now()});
  return Watch(this, id);
}

void DeviceHealth::WatchdogLoop() {
  // Looks four times per timeout (at most every 250 ms), so a hang is
  // reported within 1.25 timeouts.
  const absl::Duration period = std::min(timeout_ / 4, absl::Milliseconds(250));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(period), [this] { return stopping_; });
    if (stopping_ || !cause_.ok()) continue;
    const absl::Time now = absl::Now();
    for (const auto& [id, r] : running_) {
      if (now - r.since <= timeout_) continue;
      const absl::Status hung = absl::DeadlineExceededError(absl::StrFormat(
          "%s has not finished after %s (device_timeout %s): the device is presumed hung", r.what,
          absl::FormatDuration(absl::Trunc(now - r.since, absl::Milliseconds(1))),
          absl::FormatDuration(timeout_)));
      lock.unlock();
      MarkLost(hung);
      lock.lock();
      break;
    }
  }
}

}  // namespace logitd::kernels
