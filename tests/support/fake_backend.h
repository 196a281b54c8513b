// A kernels::Backend for in-process service tests: no arithmetic worth the
// name, but results a test can predict, and hooks that a real device does
// not offer on demand. A test can make a method fail with a status of its
// choosing, make its calls wait until released (for cancellation, deadlines
// and admission), mark the device lost, and count the calls that reached it.
//
// What it computes:
//   Logits:        y[i, j] = alpha * (i * V + j), in the requested dtype
//                  (bf16 rounded to nearest even);
//   Backward:      dX and dW zero-filled; accumulate_dw counts the call;
//   FetchGradient: zeros, and the accumulating calls since the last zeroing;
//   Cast:          the exact fp32 -> bf16 cast (FloatToBf16);
//   CrossEntropy:  loss[i] = 1 for every counted token, 0 for ignored ones;
//                  lse[i] = 0; dX and dW zero-filled;
//   LogProbs:      logprob -1, lse, entropy and rank 0, top-k ids 0, 1, ...
// For results that must be right, use the cpu backend instead
// (in_process_server.h: CpuBackend()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/kernels/backend.h"

namespace logitd::testing {

// The methods a test can fail, block and count.
enum class FakeMethod {
  kLoadWeight,
  kLogits,
  kBackward,
  kFetchGradient,
  kZeroGradient,
  kCast,
  kCrossEntropy,
  kLogProbs,
};

class FakeBackend final : public kernels::Backend {
 public:
  FakeBackend() = default;

  // From now on `method` returns `status` (OK: works again). A call blocked
  // in it fails with the status once it is released.
  void FailWith(FakeMethod method, absl::Status status);
  // From now on calls to `method` wait, once counted, until Release(method).
  void Block(FakeMethod method);
  // Lets the calls waiting in `method` go, and later ones through.
  void Release(FakeMethod method);
  // Release() of every method. A server cannot shut down while a call waits
  // here (it joins the calls' threads): tests that block release first.
  void ReleaseAll();
  // Waits until `n` calls wait in `method`; false if `timeout` passes first.
  bool WaitUntilBlocked(FakeMethod method, int n, absl::Duration timeout);
  // What Health() returns: UNAVAILABLE marks the device lost.
  void SetHealth(absl::Status status);

  // Calls that reached `method` (failed and blocked ones included).
  int calls(FakeMethod method) const;

  kernels::BackendInfo Info() const override;
  absl::Status Health() const override;
  std::uint64_t DeviceBytesInUse() const override { return 0; }

 protected:
  absl::StatusOr<kernels::HostBuffer> DoAllocateHost(std::size_t bytes) override;
  absl::StatusOr<std::shared_ptr<kernels::Weight>> DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                                std::int64_t k) override;
  absl::StatusOr<std::uint64_t> DoFetchGradient(kernels::Weight& w, float* out,
                                                bool zero_after_fetch) override;
  absl::Status DoZeroGradient(kernels::Weight& w) override;
  // The operations' kernels (kernels/kernel.h): logits alpha * i for the
  // i-th element; backward dX and dW 0; the cast, exact; the
  // cross-entropy: loss 1 per counted token, lse 0, dX and dW 0; LogProbs:
  // logprob -1, lse and entropy 0, top-k ids 0, 1, ..., rank 0.
  absl::Status DoKernel(const kernels::KernelOp& op, const void* args,
                        kernels::Timing* timing) override;

 private:
  absl::Status FakeLogits(const kernels::Weight& w, const kernels::LogitsArgs& args);
  absl::Status FakeBackward(kernels::Weight& w, const kernels::BackwardArgs& args);
  // Counts the call, waits while `method` is blocked, and returns the
  // status it was told to fail with (OK when none).
  absl::Status Enter(FakeMethod method);

  mutable absl::Mutex mu_;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  std::map<FakeMethod, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::map<FakeMethod, bool> blocked_ ABSL_GUARDED_BY(mu_);
  std::map<FakeMethod, int> waiting_ ABSL_GUARDED_BY(mu_);
  std::map<FakeMethod, int> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::testing
