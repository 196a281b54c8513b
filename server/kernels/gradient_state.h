// A weight's fp32 gradient buffer [V, K], which accumulating calls
// (Backward and CrossEntropy with accumulate_dw) add to, and the count of
// those calls since it was last zeroed: the state every backend keeps per
// weight. The buffer is created on the first accumulation, zero-filled, by a
// callback that allocates it where the backend keeps it (host memory on cpu,
// device memory on cuda), so that a weight that is never trained costs
// nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace logitd::kernels {

// Buffer is the backend's owning handle of the memory (movable; freed by its
// destructor). Everything that reads or writes the buffer or the count holds
// a Lock for as long as its work on the buffer runs (to the end of the
// device's work on cuda), so that a fetch never sees part of a call's dW and
// each call counts once.
template <typename Buffer>
class GradientState {
 public:
  // `bytes`: the size of the buffer the creation callback returns, which
  // bytes() reports once it exists.
  explicit GradientState(std::uint64_t bytes) : bytes_(bytes) {}
  GradientState(const GradientState&) = delete;
  GradientState& operator=(const GradientState&) = delete;

  // Bytes held for the buffer: 0 until it is created. Takes no lock, so a
  // long accumulation does not hold up the callers that only count memory.
  std::uint64_t bytes() const { return created_.load(std::memory_order_relaxed) ? bytes_ : 0; }

  class Lock {
   public:
    // A Lock holds the state's mutex from Acquire to its destruction; a move
    // hands it on (the moved-from Lock holds nothing).
    Lock(Lock&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
    Lock& operator=(Lock&& o) noexcept {
      if (this != &o) {
        Release();
        state_ = std::exchange(o.state_, nullptr);
      }
      return *this;
    }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    ~Lock() { Release(); }

    // The buffer, or null before the first accumulation.
    Buffer* buffer() const {
      state_->mu_.AssertHeld();
      return state_->buffer_ ? &*state_->buffer_ : nullptr;
    }
    // The buffer, created first when there is none yet by `create`, a
    // callable returning absl::StatusOr<Buffer> of zero-filled memory;
    // create's error when it fails (and then there is still no buffer).
    template <typename Create>
    absl::StatusOr<Buffer*> GetOrCreate(Create&& create) {
      state_->mu_.AssertHeld();
      if (!state_->buffer_) {
        absl::StatusOr<Buffer> fresh = std::forward<Create>(create)();
        if (!fresh.ok()) return fresh.status();
        state_->buffer_.emplace(*std::move(fresh));
        state_->calls_ = 0;
        state_->created_.store(true, std::memory_order_relaxed);
      }
      return &*state_->buffer_;
    }

    // Accumulating calls since the buffer was last zeroed.
    std::uint64_t calls() const {
      state_->mu_.AssertHeld();
      return state_->calls_;
    }
    // One more accumulating call has added all of its dW.
    void CountCall() {
      state_->mu_.AssertHeld();
      ++state_->calls_;
    }
    // The buffer has been zeroed.
    void ResetCalls() {
      state_->mu_.AssertHeld();
      state_->calls_ = 0;
    }

   private:
    friend class GradientState;
    // The thread-safety analysis cannot follow a lock that moves with its
    // holder, so taking and giving back the mutex go unchecked; the accessors
    // above assert it held instead.
    explicit Lock(GradientState* state) ABSL_NO_THREAD_SAFETY_ANALYSIS : state_(state) {
      state_->mu_.Lock();
    }
    void Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (state_ != nullptr) state_->mu_.Unlock();
      state_ = nullptr;
    }

    GradientState* state_;  // null once moved from
  };

  // Waits for the buffer and the count to be free.
  Lock Acquire() { return Lock(this); }

 private:
  const std::uint64_t bytes_;
  absl::Mutex mu_;
  std::optional<Buffer> buffer_ ABSL_GUARDED_BY(mu_);
  std::uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> created_{false};
};

}  // namespace logitd::kernels
