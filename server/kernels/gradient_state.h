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
#include <mutex>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"

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
    Lock(Lock&&) noexcept = default;
    Lock& operator=(Lock&&) noexcept = default;

    // The buffer, or null before the first accumulation.
    Buffer* buffer() const { return state_->buffer_ ? &*state_->buffer_ : nullptr; }
    // The buffer, created first when there is none yet by `create`, a
    // callable returning absl::StatusOr<Buffer> of zero-filled memory;
    // create's error when it fails (and then there is still no buffer).
    template <typename Create>
    absl::StatusOr<Buffer*> GetOrCreate(Create&& create) {
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
    std::uint64_t calls() const { return state_->calls_; }
    // One more accumulating call has added all of its dW.
    void CountCall() { ++state_->calls_; }
    // The buffer has been zeroed.
    void ResetCalls() { state_->calls_ = 0; }

   private:
    friend class GradientState;
    explicit Lock(GradientState* state) : state_(state), lock_(state->mu_) {}

    GradientState* state_;
    std::unique_lock<std::mutex> lock_;
  };

  // Waits for the buffer and the count to be free.
  Lock Acquire() { return Lock(this); }

 private:
  const std::uint64_t bytes_;
  std::mutex mu_;
  std::optional<Buffer> buffer_;  // under mu_
  std::uint64_t calls_ = 0;       // under mu_
  std::atomic<bool> created_{false};
};

}  // namespace logitd::kernels
