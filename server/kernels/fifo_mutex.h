// A mutex that is handed out in the order it was asked for (a ticket lock).
// std::mutex lets the thread that just unlocked take it again before the
// threads already waiting, so that a call made of many short holds (a row
// block each) can keep a shared resource while another call waits for
// seconds. The backends queue for their one sgemm at a time (cpu) and for a
// stream context (cuda) through this, so every wait is bounded by the work
// queued before it. BasicLockable: use it with std::lock_guard.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace logitd::kernels {

class FifoMutex {
 public:
  FifoMutex() = default;
  FifoMutex(const FifoMutex&) = delete;
  FifoMutex& operator=(const FifoMutex&) = delete;

  void lock() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t ticket = next_++;
    turn_.wait(lock, [&] { return serving_ == ticket; });
  }

  void unlock() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++serving_;
    }
    turn_.notify_all();
  }

  // Callers that hold it or wait for it (for tests).
  std::uint64_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_ - serving_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable turn_;
  std::uint64_t next_ = 0;     // the ticket the next caller gets
  std::uint64_t serving_ = 0;  // the ticket that holds the mutex
};

}  // namespace logitd::kernels
