// A device that can no longer be used, end to end through the real logitd:
// the test-only device faults (--test_fault=device_faults) make one Cast trap
// on the device (a sticky error, as a kernel fault or ECC error leaves the
// CUDA context) or hang it past --device_timeout. Then health turns
// NOT_SERVING within a second, every call gets UNAVAILABLE naming the cause,
// the log says so once, and the process exits with status 75 so that its
// supervisor restarts it; a retrying client finishes its job with exact
// results across that restart. On the cpu backend the faults are simulated
// (CI runs that); with LOGITD_TEST_BACKEND=cuda in the environment (the
// cuda. variant) the same tests fault a real GPU, and skip where none is
// visible.
#include <sys/wait.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

const std::string kBackend = TestBackend();
constexpr int kExitDeviceLost = 75;
// The trigger values of backend.h (kTestDeviceTrap, kTestDeviceHang).
constexpr std::uint32_t kTrap = 0x7fbadbadu;
constexpr std::uint32_t kHang = 0x7fbadbacu;

Tensor Trigger(std::uint32_t bits) {
  Tensor t(DType::kFp32, {16});
  for (std::int64_t i = 0; i < 16; ++i) t.data<float>()[i] = static_cast<float>(i);
  t.data<float>()[0] = BitsToFloat(bits);
  return t;
}

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> args = {absl::StrCat("--backend=", kBackend),
                                   "--test_fault=device_faults"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Starts the server, or explains why the test cannot run here.
absl::StatusOr<ServerProcess> StartFaultyServer(std::vector<std::string> extra) {
  return ServerProcess::Start(ServerBinary(), Args(std::move(extra)));
}

#define START_OR_SKIP(var, extra)                                         \
  absl::StatusOr<ServerProcess> var##_started = StartFaultyServer(extra); \
  if (!var##_started.ok() && kBackend == "cuda") {                        \
    GTEST_SKIP() << "no cuda backend here: " << var##_started.status();   \
  }                                                                       \
  ASSERT_TRUE(var##_started.ok()) << var##_started.status();              \
  ServerProcess& var = *var##_started

std::unique_ptr<client::Client> Connect(const std::string& address,
                                        client::ClientOptions options = {}) {
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Create(address, std::move(options));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Exact logits of integer operands through `c`.
::testing::AssertionResult ExactLogits(client::Client& c, const std::string& handle,
                                       const Tensor& w, const Tensor& x) {
  absl::StatusOr<Tensor> y = c.Logits(x, handle);
  if (!y.ok()) return ::testing::AssertionFailure() << y.status();
  return Fp32EqualsExact(*y, ExactNT(x, w), {x.dim(0), w.dim(0)});
}

// Whether the server's health says NOT_SERVING by `deadline`; *serving is
// the last status seen.
bool NotServingBy(const std::string& address, absl::Time deadline, int* serving) {
  for (;;) {
    if (HealthCheck(address, "", serving) == grpc::StatusCode::OK && *serving == 2) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

int Occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST(DeviceLostTest, FaultTurnsHealthNotServingCallsUnavailableAndExits75) {
  START_OR_SKIP(server, {});
  auto c = Connect(server.address());
  ASSERT_NE(c, nullptr);
  const Tensor w = IntBf16({130, 257}, 1);
  absl::StatusOr<client::WeightInfo> info = c->RegisterWeight(w, "w");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(ExactLogits(*c, info->handle, w, IntBf16({5, 257}, 2)));
  int serving = -1;
  ASSERT_EQ(HealthCheck(server.address(), "", &serving), grpc::StatusCode::OK);
  EXPECT_EQ(serving, 1);

  absl::StatusOr<Tensor> trapped = c->CastToBf16(Trigger(kTrap));
  ASSERT_FALSE(trapped.ok());
  EXPECT_EQ(trapped.status().code(), absl::StatusCode::kUnavailable) << trapped.status();
  EXPECT_TRUE(absl::StrContains(trapped.status().message(), "device lost")) << trapped.status();
  const absl::Time failed_at = absl::Now();

  // NOT_SERVING within a second.
  EXPECT_TRUE(NotServingBy(server.address(), failed_at + absl::Seconds(1), &serving))
      << "health still " << serving << " 1 s after the fault";

  // Every call that needs the device: UNAVAILABLE, naming the cause (or, once
  // the port has closed, UNAVAILABLE from the channel).
  absl::StatusOr<Tensor> after = c->Logits(IntBf16({5, 257}, 3), info->handle);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();

  const std::optional<int> status = server.WaitExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "logitd still runs 30 s after its device was lost\n"
                                  << server.Log();
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), kExitDeviceLost) << server.Log();
  const std::string log = server.Log();
  EXPECT_EQ(Occurrences(log, "Not serving; in-flight calls have"), 1) << log;
  // The cause, as the backend saw it: the trap's own error on a GPU, the
  // simulated fault's name on the cpu backend.
  EXPECT_TRUE(absl::StrContains(
      log, kBackend == "cuda" ? "cudaErrorLaunchFailure" : "test fault device_trap"))
      << log;
}

TEST(DeviceLostTest, HungCallIsReportedAndTheServerExits75) {
  START_OR_SKIP(server, {"--device_timeout=2s"});
  auto c = Connect(server.address());
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  absl::Status hung_status;
  std::thread caller([&] { hung_status = c->CastToBf16(Trigger(kHang)).status(); });
  // The watchdog looks four times per timeout: NOT_SERVING within 2.5 s of
  // the timeout, whatever the hung call is doing.
  int serving = -1;
  EXPECT_TRUE(NotServingBy(server.address(), start + absl::Seconds(6), &serving))
      << "health " << serving;
  const std::optional<int> status = server.WaitExit(absl::Seconds(40));
  caller.join();
  EXPECT_FALSE(hung_status.ok());
  EXPECT_EQ(hung_status.code(), absl::StatusCode::kUnavailable) << hung_status;
  ASSERT_TRUE(status.has_value()) << server.Log();
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), kExitDeviceLost) << server.Log();
  EXPECT_TRUE(absl::StrContains(server.Log(), "presumed hung")) << server.Log();
}

// The supervisor's part (systemd's Restart=on-failure, Kubernetes' restart):
// whenever logitd exits with 75 it is started again on the same port. A
// client with the retry policy runs a job of exact Logits calls while another
// client faults the device once; the job finishes, every result exact,
// registering its weight again when the new process does not know it.
TEST(DeviceLostTest, RetryingClientFinishesItsJobAcrossARestart) {
  const int port = UnusedPort();
  absl::StatusOr<ServerProcess> first = StartServerOnPort(port, Args({}));
  if (!first.ok() && kBackend == "cuda") GTEST_SKIP() << first.status();
  ASSERT_TRUE(first.ok()) << first.status();
  ServerProcess server = *std::move(first);
  std::atomic<bool> job_done{false};
  std::atomic<int> restarts{0};
  std::atomic<int> other_exits{0};
  std::thread supervisor([&] {
    while (!job_done) {
      const std::optional<int> status = server.WaitExit(absl::Milliseconds(100));
      if (!status.has_value()) continue;
      if (!WIFEXITED(*status) || WEXITSTATUS(*status) != kExitDeviceLost) {
        ++other_exits;
        return;
      }
      absl::StatusOr<ServerProcess> again = StartServerOnPort(port, Args({}));
      if (!again.ok()) {
        ++other_exits;
        return;
      }
      server = *std::move(again);
      ++restarts;
    }
  });

  client::ClientOptions options;
  options.retry = client::RetryPolicy::Enabled();
  options.timeout = absl::Seconds(60);
  auto job = Connect(absl::StrCat("127.0.0.1:", port), options);
  auto other = Connect(absl::StrCat("127.0.0.1:", port));
  ASSERT_NE(job, nullptr);
  ASSERT_NE(other, nullptr);
  const Tensor w = IntBf16({257, 130}, 4);
  std::string handle;
  auto register_weight = [&]() -> absl::Status {
    absl::StatusOr<client::WeightInfo> info = job->RegisterWeight(w, "job");
    if (info.ok()) handle = info->handle;
    return info.status();
  };
  ASSERT_TRUE(register_weight().ok());
  int exact = 0;
  int reregistered = 0;
  for (int call = 0; call < 30; ++call) {
    if (call == 10) {
      absl::StatusOr<Tensor> trapped = other->CastToBf16(Trigger(kTrap));
      EXPECT_EQ(trapped.status().code(), absl::StatusCode::kUnavailable) << trapped.status();
    }
    const Tensor x = IntBf16({3, 130}, 100 + static_cast<std::uint32_t>(call));
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 20) << "call " << call << " never succeeded";
      absl::StatusOr<Tensor> y = job->Logits(x, handle);
      if (y.ok()) {
        EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {3, 257})) << "call " << call;
        ++exact;
        break;
      }
      if (y.status().code() == absl::StatusCode::kNotFound) {
        // A new process: the weight is registered again (same bytes, same handle).
        ++reregistered;
        for (int r = 0; r < 20 && !register_weight().ok(); ++r)
          absl::SleepFor(absl::Milliseconds(250));
        continue;
      }
      // UNAVAILABLE that outlasted the policy's retries (the restart takes a
      // moment): try again.
      ASSERT_EQ(y.status().code(), absl::StatusCode::kUnavailable) << y.status();
      absl::SleepFor(absl::Milliseconds(250));
    }
  }
  job_done = true;
  supervisor.join();
  EXPECT_EQ(exact, 30);
  EXPECT_EQ(restarts.load(), 1);
  EXPECT_EQ(other_exits.load(), 0);
  EXPECT_GE(reregistered, 1);
  server.Stop();
}

}  // namespace
}  // namespace logitd::testing
