// Client::Impl: the channel, the stubs and the retry loop every call of
// logitd::client::Client goes through. Internal to the client library
// (client.cc makes it; tensor_calls.cc uses it).
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"

namespace logitd::client {

// The calls of one spread call's parts (RunSpread), so that the first part
// to fail cancels the others instead of letting them run to their end. A
// part's thread joins the group for as long as it runs (ScopedCallGroup);
// Impl::Call adds each attempt's context to its thread's group.
class CallGroup {
 public:
  // A call of the group's; cancelled at once when the group is.
  void Add(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      context->TryCancel();
      return;
    }
    contexts_.push_back(context);
  }
  void Remove(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), context), contexts_.end());
  }
  // Cancels every call of the group, and those it makes from now on.
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* c : contexts_) c->TryCancel();
  }

  // The group of this thread's calls, if any.
  static CallGroup*& Current() {
    thread_local CallGroup* current = nullptr;
    return current;
  }

 private:
  // The group's calls in flight, and whether it is cancelled; mu_ guards
  // both.
  absl::Mutex mu_;
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class ScopedCallGroup {
 public:
  explicit ScopedCallGroup(CallGroup* group) : before_(CallGroup::Current()) {
    CallGroup::Current() = group;
  }
  ~ScopedCallGroup() { CallGroup::Current() = before_; }
  ScopedCallGroup(const ScopedCallGroup&) = delete;
  ScopedCallGroup& operator=(const ScopedCallGroup&) = delete;

 private:
  CallGroup* const before_;
};

struct Client::Impl {
  ClientOptions options;
  std::string address;
  // LogitsOptions.connections: the Clients of the further connections, and
  // the weights' block rows seen so far (ListWeights), by handle; spread_mu
  // guards both.
  absl::Mutex spread_mu;
  std::vector<std::unique_ptr<Client>> spread ABSL_GUARDED_BY(spread_mu);
  std::map<std::string, WeightInfo> weights_seen ABSL_GUARDED_BY(spread_mu);
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Logitd::Stub> stub;
  // The calls that stream tensors back, made as raw streams (RawCall).
  std::unique_ptr<grpc::GenericStub> generic;

  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> attempts{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> exhausted{0};
  std::atomic<std::uint64_t> not_retried{0};
  std::atomic<std::uint64_t> data_loss{0};

  // Deadline and credentials for one attempt.
  void Prepare(grpc::ClientContext& context, absl::Time deadline) const {
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
    if (!options.auth_token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", options.auth_token));
    }
  }

  // Runs one call: `attempt` sends the whole request on the fresh context it
  // is given and returns the call's result (absl::Status or absl::StatusOr).
  // An attempt that fails with UNAVAILABLE is sent again, after a backoff, when
  // the call is `idempotent` and options.retry allows another attempt before
  // the call's deadline. Every RPC goes through here, so the policy and its
  // counters live in one place.
  template <typename Attempt>
  auto Call(bool idempotent, Attempt attempt) {
    const RetryPolicy& policy = options.retry;
    const absl::Time start = absl::Now();
    const absl::Time deadline = options.timeout == absl::InfiniteDuration()
                                    ? absl::InfiniteFuture()
                                    : start + options.timeout;
    calls.fetch_add(1, std::memory_order_relaxed);
    absl::Duration backoff = policy.initial_backoff;
    for (int n = 1;; ++n) {
      attempts.fetch_add(1, std::memory_order_relaxed);
      grpc::ClientContext context;
      Prepare(context, deadline);
      CallGroup* const group = CallGroup::Current();
      if (group != nullptr) group->Add(&context);
      auto result = attempt(context);
      if (group != nullptr) group->Remove(&context);
      const absl::Status status = StatusOf(result);
      if (status.code() == absl::StatusCode::kDataLoss) {
        data_loss.fetch_add(1, std::memory_order_relaxed);
      }
      if (status.code() != absl::StatusCode::kUnavailable) return result;
      if (!idempotent) {
        not_retried.fetch_add(1, std::memory_order_relaxed);
        return result;
      }
      if (policy.max_attempts == 1) return result;
      const absl::Duration sleep = Jittered(std::min(backoff, policy.max_backoff), policy.jitter);
      if ((policy.max_attempts > 0 && n >= policy.max_attempts) ||
          absl::Now() + sleep >= deadline) {
        exhausted.fetch_add(1, std::memory_order_relaxed);
        result = decltype(result)(absl::UnavailableError(absl::StrFormat(
            "%s (gave up after %d attempts in %s)", status.message(), n,
            absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))))));
        return result;
      }
      // Wait on the channel rather than only on the clock: that makes gRPC
      // try to reconnect (and notice that it can) while the client sleeps.
      // A channel that fails calls at once does not do so by itself soon
      // enough to be ready when the backoff ends.
      const absl::Time wake = absl::Now() + sleep;
      channel->WaitForConnected(absl::ToChronoTime(wake));
      absl::SleepFor(wake - absl::Now());
      backoff = std::min(backoff * policy.multiplier, policy.max_backoff);
      retries.fetch_add(1, std::memory_order_relaxed);
    }
  }

  static absl::Status StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static absl::Status StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }

  // `d` scaled by a uniform factor in [1 - jitter, 1 + jitter].
  static absl::Duration Jittered(absl::Duration d, double jitter) {
    if (jitter <= 0) return d;
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_real_distribution<double> factor(1.0 - jitter, 1.0 + jitter);
    return d * factor(rng);
  }
};

// The options of a cross-entropy or LogProbs call in a header, always sent
// (the defaults live in the options structs, not on the wire): ignore_index,
// reduction, z_loss, logit_softcap, grad_scale; ignore_index, temperature,
// logit_softcap, vocab_size. Tensors, wants and shm are left alone.
// The alerts of a verify result or a recorded run.
std::vector<Alert> AlertsOf(const google::protobuf::RepeatedPtrField<v1::Alert>& alerts);
// A recording's comparison with its baseline run, and the header's selector
// of that run.
RunComparison ComparisonOf(const v1::RunComparison& rc);
void SetBaselineSelector(const BaselineSelector& b, v1::BaselineSelector* out);

void SetCrossEntropyOptions(const CrossEntropyOptions& options, v1::CrossEntropyHeader* h);
void SetLogProbsOptions(const LogProbsOptions& options, v1::LogProbsHeader* h);

}  // namespace logitd::client
