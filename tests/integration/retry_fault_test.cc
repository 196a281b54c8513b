// The client library's retry policy against a server that dies: logitd (cpu
// backend) on a fixed loopback port is killed with SIGKILL in the middle of a
// job of Logits calls and started again on the same port. The job finishes:
// retries ride over UNAVAILABLE, and on NOT_FOUND (the new process has no
// weights) the job registers its weights again, one from its own copy and one
// from the safetensors file the server reads. Every result is exact. Calls
// that are not idempotent are never retried.
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

constexpr std::int64_t kV = 48;
constexpr std::int64_t kK = 64;
constexpr std::int64_t kM = 4;

absl::StatusOr<ServerProcess> StartOnPort(int port, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--backend=cpu"};
  all.insert(all.end(), args.begin(), args.end());
  return StartServerOnPort(port, all);
}

client::ClientOptions RetryingOptions() {
  client::ClientOptions options;
  options.retry = client::RetryPolicy::Enabled();
  options.timeout = absl::Seconds(60);
  return options;
}

// A weight the job uses and knows how to bring back after a server restart.
struct JobWeight {
  std::string label;
  Tensor w;
  std::string file;  // relative to --weights_dir; empty: registered from `w`
  std::string handle;
  int registrations = 0;
};

absl::Status RegisterJobWeight(client::Client& c, JobWeight& jw) {
  absl::StatusOr<client::WeightInfo> info = jw.file.empty()
                                                ? c.RegisterWeight(jw.w, jw.label)
                                                : c.LoadWeight(jw.file, "lm_head.weight", jw.label);
  if (!info.ok()) return info.status();
  // Handles come from the bytes: the same weight gets the same handle from
  // the new process.
  if (!jw.handle.empty() && info->handle != jw.handle) {
    return absl::InternalError(absl::StrCat(jw.label, ": handle changed from ", jw.handle, " to ",
                                            info->handle, " after registering again"));
  }
  jw.handle = info->handle;
  ++jw.registrations;
  return absl::OkStatus();
}

TEST(RetryFaultTest, JobSurvivesKillAndRestart) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::filesystem::path weights_dir = dir / "weights";
  std::filesystem::create_directories(weights_dir);

  JobWeight uploaded{"uploaded", IntBf16({kV, kK}, 11), "", "", 0};
  JobWeight loaded{"loaded", IntBf16({kV, kK}, 12), "head.safetensors", "", 0};
  ASSERT_TRUE(
      WriteSafetensors((weights_dir / loaded.file).string(), {{"lm_head.weight", &loaded.w}}).ok());

  const int port = UnusedPort();
  ASSERT_GT(port, 0);
  const std::vector<std::string> args = {absl::StrCat("--weights_dir=", weights_dir.string())};
  absl::StatusOr<ServerProcess> server = StartOnPort(port, args);
  ASSERT_TRUE(server.ok()) << server.status();
  const pid_t first_pid = server->pid();

  absl::StatusOr<std::unique_ptr<client::Client>> made =
      client::Client::Create(absl::StrCat("127.0.0.1:", port), RetryingOptions());
  ASSERT_TRUE(made.ok()) << made.status();
  client::Client& c = **made;
  ASSERT_TRUE(RegisterJobWeight(c, uploaded).ok());
  ASSERT_TRUE(RegisterJobWeight(c, loaded).ok());

  // Inputs and exact references, computed once.
  constexpr int kInputs = 8;
  std::vector<Tensor> xs;
  std::vector<std::vector<std::int64_t>> want_uploaded, want_loaded;
  for (int i = 0; i < kInputs; ++i) {
    xs.push_back(IntBf16({kM, kK}, 100 + static_cast<std::uint32_t>(i)));
    want_uploaded.push_back(ExactNT(xs.back(), uploaded.w));
    want_loaded.push_back(ExactNT(xs.back(), loaded.w));
  }

  std::atomic<int> done{0};
  std::atomic<bool> restarted{false};
  std::atomic<int> done_at_kill{-1};
  std::atomic<bool> killer_failed{false};
  absl::Time killed_at, restarted_at, back_at;
  std::string killer_error;

  // Kills the server once the job is under way, keeps it down long enough for
  // calls to fail and back off, and starts a new one on the same port.
  std::thread killer([&] {
    while (done.load() < 40) absl::SleepFor(absl::Milliseconds(1));
    done_at_kill = done.load();
    killed_at = absl::Now();
    ::kill(server->pid(), SIGKILL);
    while (server->Running()) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(700));
    absl::StatusOr<ServerProcess> again = StartOnPort(port, args);
    if (!again.ok()) {
      killer_error = again.status().ToString();
      killer_failed = true;
      return;
    }
    *server = *std::move(again);
    restarted_at = absl::Now();
    restarted = true;
  });

  // The job: alternate the two weights; results must be exact. It runs until
  // 100 calls after the restart, or gives up after a minute.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  int after_restart = 0;
  int not_found = 0;
  int failures = 0;
  std::string first_failure;
  for (int i = 0; after_restart < 100 && !killer_failed && absl::Now() < give_up; ++i) {
    JobWeight& jw = (i % 2 == 0) ? uploaded : loaded;
    const int k = i % kInputs;
    absl::StatusOr<Tensor> y = c.Logits(xs[static_cast<std::size_t>(k)], jw.handle);
    if (y.status().code() == absl::StatusCode::kNotFound) {
      // The new process has no weights: bring this one back and redo the call.
      ++not_found;
      absl::Status s = RegisterJobWeight(c, jw);
      ASSERT_TRUE(s.ok()) << s;
      y = c.Logits(xs[static_cast<std::size_t>(k)], jw.handle);
    }
    if (!y.ok()) {
      if (failures++ == 0) first_failure = y.status().ToString();
      continue;
    }
    const auto& want = (&jw == &uploaded) ? want_uploaded : want_loaded;
    ASSERT_TRUE(Fp32EqualsExact(*y, want[static_cast<std::size_t>(k)], {kM, kV}))
        << jw.label << " call " << i;
    ++done;
    if (restarted && after_restart++ == 0) back_at = absl::Now();
  }
  killer.join();
  ASSERT_FALSE(killer_failed) << killer_error;
  ASSERT_TRUE(restarted);
  EXPECT_NE(server->pid(), first_pid);

  const client::CallStats stats = c.call_stats();
  std::printf(
      "server down for %s (killed, then restarted on port %d); the job's first result "
      "from the new server came %s after the kill\n",
      absl::FormatDuration(absl::Trunc(restarted_at - killed_at, absl::Milliseconds(1))).c_str(),
      port, absl::FormatDuration(absl::Trunc(back_at - killed_at, absl::Milliseconds(1))).c_str());
  std::printf(
      "job: %d exact Logits results (server killed after %d), %d NOT_FOUND, "
      "re-registered uploaded %dx loaded %dx; client calls=%llu attempts=%llu "
      "retries=%llu exhausted=%llu\n",
      done.load(), done_at_kill.load(), not_found, uploaded.registrations - 1,
      loaded.registrations - 1, static_cast<unsigned long long>(stats.calls),
      static_cast<unsigned long long>(stats.attempts),
      static_cast<unsigned long long>(stats.retries),
      static_cast<unsigned long long>(stats.exhausted));
  EXPECT_EQ(failures, 0) << "first failure: " << first_failure;
  EXPECT_EQ(after_restart, 100);
  // The outage was ridden over by retries, not by failed calls.
  EXPECT_GT(stats.retries, 0u);
  EXPECT_EQ(stats.attempts, stats.calls + stats.retries);
  EXPECT_EQ(stats.exhausted, 0u);
  EXPECT_EQ(stats.data_loss, 0u);
  // Both weights came back: one from the client's copy, one from the file.
  EXPECT_EQ(uploaded.registrations, 2);
  EXPECT_EQ(loaded.registrations, 2);
  EXPECT_EQ(not_found, 2);
  absl::StatusOr<std::vector<client::WeightInfo>> list = c.ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 2u);
}

// Against a server that is gone: idempotent calls are retried up to the
// policy's attempts, calls that change server state are sent once.
TEST(RetryFaultTest, OnlyIdempotentCallsAreRetried) {
  const int port = UnusedPort();
  ASSERT_GT(port, 0);
  absl::StatusOr<ServerProcess> server = StartOnPort(port, {});
  ASSERT_TRUE(server.ok()) << server.status();

  client::ClientOptions options;
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(10);
  options.retry.max_backoff = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<client::Client>> made =
      client::Client::Create(server->address(), options);
  ASSERT_TRUE(made.ok()) << made.status();
  client::Client& c = **made;

  const Tensor w = IntBf16({kV, kK}, 21);
  const Tensor x = IntBf16({kM, kK}, 22);
  const Tensor dy = IntBf16({kM, kV}, 23);
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "w");
  ASSERT_TRUE(info.ok()) << info.status();
  client::BackwardOptions accumulate;
  accumulate.accumulate_dw = true;
  accumulate.want_dx = false;
  ASSERT_TRUE(c.Backward(dy, x, info->handle, accumulate).ok());

  ::kill(server->pid(), SIGKILL);
  while (server->Running()) absl::SleepFor(absl::Milliseconds(5));

  // Each call: how many attempts it may make against a dead server.
  struct Case {
    std::string what;
    std::function<absl::Status()> call;
    std::uint64_t attempts;
  };
  client::BackwardOptions plain;
  const std::vector<Case> cases = {
      {"accumulating Backward",
       [&] { return c.Backward(dy, x, info->handle, accumulate).status(); }, 1},
      {"FetchGradient(zero_after_fetch)",
       [&] { return c.FetchGradient(info->handle, true).status(); }, 1},
      {"ReleaseWeight", [&] { return c.ReleaseWeight(info->handle).status(); }, 1},
      {"Backward", [&] { return c.Backward(dy, x, info->handle, plain).status(); }, 3},
      {"Logits", [&] { return c.Logits(x, info->handle).status(); }, 3},
      {"FetchGradient", [&] { return c.FetchGradient(info->handle, false).status(); }, 3},
      {"ZeroGradient", [&] { return c.ZeroGradient(info->handle); }, 3},
      {"RegisterWeight", [&] { return c.RegisterWeight(w, "w").status(); }, 3},
      {"Info", [&] { return c.Info().status(); }, 3},
  };
  for (const Case& k : cases) {
    const client::CallStats before = c.call_stats();
    const absl::Status s = k.call();
    const client::CallStats after = c.call_stats();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << k.what << ": " << s;
    EXPECT_EQ(after.attempts - before.attempts, k.attempts) << k.what;
    EXPECT_EQ(after.retries - before.retries, k.attempts - 1) << k.what;
    EXPECT_EQ(after.not_retried - before.not_retried, k.attempts == 1 ? 1u : 0u) << k.what;
    EXPECT_EQ(after.exhausted - before.exhausted, k.attempts == 1 ? 0u : 1u) << k.what;
  }
}

// Retries are off unless asked for, and a retrying call stops at its deadline.
TEST(RetryFaultTest, OffByDefaultAndBoundedByDeadline) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedPort());
  absl::StatusOr<std::unique_ptr<client::Client>> plain = client::Client::Create(address);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->Info().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*plain)->call_stats().attempts, 1u);
  EXPECT_EQ((*plain)->call_stats().retries, 0u);

  client::ClientOptions options;
  options.retry.max_attempts = 0;  // only the deadline bounds it
  options.timeout = absl::Milliseconds(1500);
  absl::StatusOr<std::unique_ptr<client::Client>> retrying =
      client::Client::Create(address, options);
  ASSERT_TRUE(retrying.ok()) << retrying.status();
  const absl::Time start = absl::Now();
  const absl::Status s = (*retrying)->Info().status();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LE(took, absl::Milliseconds(1500) + absl::Milliseconds(500));
  // Backoffs of about 100, 200, 400 ms fit before the deadline, 800 does not.
  EXPECT_GE((*retrying)->call_stats().retries, 2u);
  EXPECT_LE((*retrying)->call_stats().retries, 4u);
  EXPECT_EQ((*retrying)->call_stats().exhausted, 1u);

  options.retry.multiplier = 0.5;
  EXPECT_EQ(client::Client::Create(address, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A response whose digest does not match is DATA_LOSS, counted, and never
// retried (the soak test relies on the counter).
TEST(RetryFaultTest, WrongDigestIsCountedAsDataLossAndNotRetried) {
#ifndef LOGITD_TEST_FAULTS_ENABLED
  GTEST_SKIP() << "logitd built without LOGITD_ENABLE_TEST_FAULTS: --test_fault is refused";
#endif
  absl::StatusOr<std::unique_ptr<SharedServer>> server =
      SharedServer::Start({"--test_fault=digest"}, RetryingOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(IntBf16({kV, kK}, 31), "w");
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<Tensor> y = c.Logits(IntBf16({kM, kK}, 32), info->handle);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kDataLoss) << y.status();
  const client::CallStats stats = c.call_stats();
  EXPECT_EQ(stats.data_loss, 1u);
  EXPECT_EQ(stats.retries, 0u);
  EXPECT_EQ(stats.attempts, stats.calls);
}

}  // namespace
}  // namespace logitd::testing
