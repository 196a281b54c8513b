#include "tests/support/fake_backend.h"

#include <atomic>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"
#include "server/kernels/ops/cast.h"
#include "server/kernels/ops/cross_entropy.h"
#include "server/kernels/ops/log_probs.h"

namespace logitd::testing {
namespace {

// A weight that keeps no bytes: only its shape and the accumulating
// Backward/CrossEntropy calls since its gradient was last zeroed.
class FakeWeight final : public kernels::Weight {
 public:
  using kernels::Weight::Weight;
  std::uint64_t weight_bytes() const override {
    return static_cast<std::uint64_t>(v()) * static_cast<std::uint64_t>(k()) * 2;
  }
  std::uint64_t gradient_bytes() const override {
    return accumulated_ever_ ? static_cast<std::uint64_t>(v()) * static_cast<std::uint64_t>(k()) * 4
                             : 0;
  }
  void Accumulate() {
    accumulated_ever_ = true;
    ++accumulated_;
  }
  std::uint64_t TakeAccumulated(bool zero) {
    return zero ? accumulated_.exchange(0) : accumulated_.load();
  }

 private:
  std::atomic<bool> accumulated_ever_{false};
  std::atomic<std::uint64_t> accumulated_{0};
};

void Zero(void* p, std::int64_t elements, DType dtype) {
  if (p != nullptr) std::memset(p, 0, static_cast<std::size_t>(elements) * ElementSize(dtype));
}

}  // namespace

void FakeBackend::FailWith(FakeMethod method, absl::Status status) {
  absl::MutexLock lock(&mu_);
  failures_[method] = std::move(status);
}

void FakeBackend::Block(FakeMethod method) {
  absl::MutexLock lock(&mu_);
  blocked_[method] = true;
}

void FakeBackend::Release(FakeMethod method) {
  absl::MutexLock lock(&mu_);
  blocked_[method] = false;
}

void FakeBackend::ReleaseAll() {
  absl::MutexLock lock(&mu_);
  blocked_.clear();
}

bool FakeBackend::WaitUntilBlocked(FakeMethod method, int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto enough = [this, method, n]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_[method] >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

void FakeBackend::SetHealth(absl::Status status) {
  absl::MutexLock lock(&mu_);
  health_ = std::move(status);
}

int FakeBackend::calls(FakeMethod method) const {
  absl::MutexLock lock(&mu_);
  const auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

absl::Status FakeBackend::Enter(FakeMethod method) {
  absl::MutexLock lock(&mu_);
  ++calls_[method];
  ++waiting_[method];
  const auto released = [this, method]()
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !blocked_[method]; };
  mu_.Await(absl::Condition(&released));
  --waiting_[method];
  const auto it = failures_.find(method);
  return it == failures_.end() ? absl::OkStatus() : it->second;
}

kernels::BackendInfo FakeBackend::Info() const {
  kernels::BackendInfo info;
  info.backend = "fake";
  info.device_name = "fake device";
  info.multiprocessor_count = 1;
  info.algo_choices = kernels::kAlgoChoicesFixed;
  return info;
}

absl::Status FakeBackend::Health() const {
  absl::MutexLock lock(&mu_);
  return health_;
}

absl::StatusOr<kernels::HostBuffer> FakeBackend::DoAllocateHost(std::size_t bytes) {
  auto* data = new (std::nothrow) std::byte[bytes == 0 ? 1 : bytes];
  if (data == nullptr) {
    return absl::ResourceExhaustedError("fake backend: out of host memory");
  }
  return kernels::HostBuffer(data, bytes, [](std::byte* d) { delete[] d; });
}

absl::StatusOr<std::shared_ptr<kernels::Weight>> FakeBackend::DoLoadWeight(const Bf16Bits* /*w*/,
                                                                           std::int64_t v,
                                                                           std::int64_t k) {
  if (absl::Status s = Enter(FakeMethod::kLoadWeight); !s.ok()) return s;
  return std::make_shared<FakeWeight>(v, k);
}

absl::Status FakeBackend::FakeLogits(const kernels::Weight& w, const kernels::LogitsArgs& args) {
  if (absl::Status s = Enter(FakeMethod::kLogits); !s.ok()) return s;
  const std::int64_t n = args.m * w.v();
  for (std::int64_t i = 0; i < n; ++i) {
    const float y = args.alpha * static_cast<float>(i);
    if (args.out_dtype == DType::kBf16) {
      static_cast<Bf16Bits*>(args.y)[i] = FloatToBf16(y);
    } else {
      static_cast<float*>(args.y)[i] = y;
    }
  }
  return absl::OkStatus();
}

absl::Status FakeBackend::FakeBackward(kernels::Weight& w, const kernels::BackwardArgs& args) {
  if (absl::Status s = Enter(FakeMethod::kBackward); !s.ok()) return s;
  Zero(args.dx, args.m * w.k(), args.dx_dtype);
  if (args.accumulate_dw) {
    static_cast<FakeWeight&>(w).Accumulate();
  } else {
    Zero(args.dw, w.v() * w.k(), args.dw_dtype);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> FakeBackend::DoFetchGradient(kernels::Weight& w, float* out,
                                                           bool zero_after_fetch) {
  if (absl::Status s = Enter(FakeMethod::kFetchGradient); !s.ok()) return s;
  Zero(out, w.v() * w.k(), DType::kFp32);
  return static_cast<FakeWeight&>(w).TakeAccumulated(zero_after_fetch);
}

absl::Status FakeBackend::DoZeroGradient(kernels::Weight& w) {
  if (absl::Status s = Enter(FakeMethod::kZeroGradient); !s.ok()) return s;
  static_cast<FakeWeight&>(w).TakeAccumulated(/*zero=*/true);
  return absl::OkStatus();
}

absl::Status FakeBackend::DoKernel(const kernels::KernelOp& op, const void* args,
                                   kernels::Timing* /*timing*/) {
  if (&op == &kernels::KernelOpOf<kernels::LogitsArgs>()) {
    const auto& logits = *static_cast<const kernels::LogitsArgs*>(args);
    return FakeLogits(*logits.weight, logits);
  }
  if (&op == &kernels::KernelOpOf<kernels::BackwardArgs>()) {
    const auto& backward = *static_cast<const kernels::BackwardArgs*>(args);
    return FakeBackward(*backward.weight, backward);
  }
  if (&op == &kernels::KernelOpOf<kernels::CastArgs>()) {
    if (absl::Status s = Enter(FakeMethod::kCast); !s.ok()) return s;
    const auto& cast = *static_cast<const kernels::CastArgs*>(args);
    for (std::int64_t i = 0; i < cast.n; ++i) cast.out[i] = FloatToBf16(cast.in[i]);
    return absl::OkStatus();
  }
  if (&op == &kernels::KernelOpOf<kernels::LogProbsArgs>()) {
    if (absl::Status s = Enter(FakeMethod::kLogProbs); !s.ok()) return s;
    const auto& lp = *static_cast<const kernels::LogProbsArgs*>(args);
    for (std::int64_t i = 0; i < lp.m; ++i) {
      if (lp.logprob != nullptr) lp.logprob[i] = -1.0f;
      if (lp.lse != nullptr) lp.lse[i] = 0.0f;
      if (lp.entropy != nullptr) lp.entropy[i] = 0.0f;
      if (lp.rank != nullptr) lp.rank[i] = 0;
      for (std::int64_t j = 0; j < lp.top_k; ++j) {
        lp.topk_ids[i * lp.top_k + j] = static_cast<std::int32_t>(j);
        lp.topk_logprobs[i * lp.top_k + j] = -1.0f;
      }
    }
    return absl::OkStatus();
  }
  if (&op == &kernels::KernelOpOf<kernels::CrossEntropyArgs>()) {
    if (absl::Status s = Enter(FakeMethod::kCrossEntropy); !s.ok()) return s;
    const auto& ce = *static_cast<const kernels::CrossEntropyArgs*>(args);
    kernels::Weight& w = *ce.weight;
    for (std::int64_t i = 0; i < ce.m; ++i) {
      ce.loss[i] = ce.targets[i] == ce.ignore_index ? 0.0f : 1.0f;
      if (ce.lse != nullptr) ce.lse[i] = 0.0f;
    }
    Zero(ce.dx, ce.m * w.k(), ce.dx_dtype);
    if (ce.accumulate_dw) {
      static_cast<FakeWeight&>(w).Accumulate();
    } else {
      Zero(ce.dw, w.v() * w.k(), DType::kFp32);
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("fake backend has no ", op.name, " kernel"));
}

}  // namespace logitd::testing
