// The device's health as the backends see it: lost for good after an error
// that poisons its context, or after one call's device work outlives the
// configured timeout (a watchdog thread looks). Used by both backends; no
// CUDA here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace logitd::kernels {

class DeviceHealth {
 public:
  // `lost` is told once, with the cause, from whichever thread finds it
  // (the watchdog's included). A zero `timeout` starts no watchdog.
  DeviceHealth(absl::Duration timeout, std::function<void(const absl::Status&)> lost);
  ~DeviceHealth();
  DeviceHealth(const DeviceHealth&) = delete;
  DeviceHealth& operator=(const DeviceHealth&) = delete;

  // OK, or Unavailable naming the cause once lost.
  absl::Status status() const;
  bool lost() const;
  // Marks the device lost: the first cause wins and is the one reported.
  // The status becomes Unavailable: "device lost: <cause's message>".
  void MarkLost(const absl::Status& cause);

  // Device work of one call, from construction to destruction; the watchdog
  // marks the device lost when one lasts longer than the timeout.
  class Watch {
   public:
    Watch() = default;
    Watch(Watch&& o) noexcept : health_(o.health_), id_(o.id_) { o.health_ = nullptr; }
    Watch& operator=(Watch&& o) noexcept;
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    ~Watch() { End(); }
    void End();

   private:
    friend class DeviceHealth;
    Watch(DeviceHealth* health, std::uint64_t id) : health_(health), id_(id) {}
    DeviceHealth* health_ = nullptr;
    std::uint64_t id_ = 0;
  };
  // `what` names the work in the report ("logits(M=16,V=32768,K=4096)").
  Watch Begin(std::string what);

  absl::Duration timeout() const { return timeout_; }

 private:
  struct Running {
    std::string what;
    absl::Time since;
  };
  void WatchdogLoop();

  const absl::Duration timeout_;
  const std::function<void(const absl::Status&)> lost_callback_;
  // mu_ guards the cause, the watchdog's stop and the work running; cv_
  // wakes the watchdog to stop.
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Status cause_ ABSL_GUARDED_BY(mu_);  // OK until lost
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::uint64_t, Running> running_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

}  // namespace logitd::kernels
