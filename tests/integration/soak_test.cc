// Soak: many client threads against one logitd (cpu backend, loopback) for a
// bounded time, mixing Logits, non-accumulating Backward, RegisterWeight /
// ReleaseWeight of small per-thread weights, and calls cancelled by deadlines
// of a few milliseconds. Every result is checked bit for bit against exact
// integer references; the only errors allowed are DEADLINE_EXCEEDED or
// CANCELLED on the calls given a short deadline. The server's resident memory
// after the load and a settle must be within 10% of its value after a warm-up
// phase (same load, so allocator pools are primed first).
//
// LOGITD_SOAK_SECONDS (default 60) and LOGITD_SOAK_THREADS (default 32) make
// it longer or wider by hand; LOGITD_SOAK_SERVER names another logitd binary.
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

// Shapes: small enough that 32 threads make progress on two cores.
constexpr std::int64_t kK = 256;
constexpr std::int64_t kV = 256;      // the shared weight
constexpr std::int64_t kM = 8;        // rows of a normal call
constexpr std::int64_t kVBig = 4096;  // the weight of the calls that get cancelled
constexpr std::int64_t kMBig = 64;
constexpr std::int64_t kVOwn = 16;  // per-thread weights
constexpr int kInputs = 4;          // distinct inputs per thread
constexpr absl::Duration kShortDeadline = absl::Milliseconds(3);

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out = 0;
  if (v == nullptr || !absl::SimpleAtoi(v, &out) || out <= 0) return fallback;
  return out;
}

// VmRSS of `pid` in KiB, or -1.
std::int64_t RssKib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      std::int64_t kib = -1;
      if (fields >> kib) return kib;
    }
  }
  return -1;
}

enum Op { kLogits, kBackward, kRegister, kRelease, kCancelLogits, kCancelBackward, kOps };
const char* const kOpNames[kOps] = {"Logits",        "Backward",    "RegisterWeight",
                                    "ReleaseWeight", "Logits(3ms)", "Backward(3ms)"};

struct Tally {
  std::atomic<std::uint64_t> ok[kOps] = {};
  std::atomic<std::uint64_t> cancelled[kOps] = {};
  std::atomic<std::uint64_t> unexpected[kOps] = {};
  std::atomic<std::uint64_t> wrong = {0};
  std::atomic<std::uint64_t> data_loss = {0};
  absl::Mutex mu;
  std::vector<std::string> first_errors ABSL_GUARDED_BY(mu);

  void Error(Op op, const std::string& what) {
    unexpected[op].fetch_add(1);
    absl::MutexLock lock(&mu);
    if (first_errors.size() < 10) first_errors.push_back(absl::StrCat(kOpNames[op], ": ", what));
  }
  void Wrong(Op op, const std::string& what) {
    wrong.fetch_add(1);
    Error(op, absl::StrCat("wrong result: ", what));
  }
  void Status(Op op, const absl::Status& s, bool cancellation_induced) {
    if (s.ok()) {
      ok[op].fetch_add(1);
    } else if (cancellation_induced && (s.code() == absl::StatusCode::kDeadlineExceeded ||
                                        s.code() == absl::StatusCode::kCancelled)) {
      cancelled[op].fetch_add(1);
    } else {
      if (s.code() == absl::StatusCode::kDataLoss) data_loss.fetch_add(1);
      Error(op, s.ToString());
    }
  }
  std::uint64_t Sum(const std::atomic<std::uint64_t> (&a)[kOps]) const {
    std::uint64_t n = 0;
    for (const auto& v : a) n += v.load();
    return n;
  }
};

// Inputs and exact references shared by all threads (the big, cancelled
// calls) or owned by one thread.
struct Shared {
  Tensor w = IntBf16({kV, kK}, 1);
  Tensor w_big = IntBf16({kVBig, kK}, 2);
  std::string handle, handle_big;
  Tensor x_big = IntBf16({kMBig, kK}, 3);
  Tensor dy_big = IntFp32({kMBig, kVBig}, 4);
  std::vector<std::int64_t> y_big, dx_big, dw_big;
};

struct ThreadData {
  std::vector<Tensor> x, dy;
  std::vector<std::vector<std::int64_t>> y, dx, dw;
  std::vector<Tensor> own;
  std::vector<std::vector<std::int64_t>> own_y;  // own[j] against x[0]
  // A failed release (an error already counted) left own[j] registered.
  bool left_behind[2] = {false, false};
};

ThreadData MakeThreadData(const Shared& shared, int t) {
  ThreadData d;
  const std::uint32_t seed = 1000u + 100u * static_cast<std::uint32_t>(t);
  for (int i = 0; i < kInputs; ++i) {
    d.x.push_back(IntBf16({kM, kK}, seed + static_cast<std::uint32_t>(i)));
    d.dy.push_back(IntFp32({kM, kV}, seed + 50 + static_cast<std::uint32_t>(i)));
    d.y.push_back(ExactNT(d.x.back(), shared.w));
    d.dx.push_back(ExactNN(d.dy.back(), shared.w));
    d.dw.push_back(ExactTN(d.dy.back(), d.x.back()));
  }
  // Content unique to the thread, so that no other thread's registration of
  // the same bytes changes what a release frees.
  for (int j = 0; j < 2; ++j) {
    d.own.push_back(IntBf16({kVOwn, kK}, seed + 80 + static_cast<std::uint32_t>(j)));
    d.own_y.push_back(ExactNT(d.x[0], d.own.back()));
  }
  return d;
}

// One client thread's loop until `stop`.
void Worker(const Shared& shared, ThreadData& d, client::Client& c, client::Client& short_c, int t,
            const std::atomic<bool>& stop, Tally& tally) {
  std::mt19937 rng(7000u + static_cast<std::uint32_t>(t));
  std::uniform_int_distribution<int> pick(0, 99);
  client::BackwardOptions bw;
  bw.dx_dtype = DType::kFp32;  // exact for these integer sums; bf16 would round
  while (!stop.load(std::memory_order_relaxed)) {
    const int r = pick(rng);
    const std::size_t i = static_cast<std::size_t>(pick(rng) % kInputs);
    if (r < 45) {
      absl::StatusOr<Tensor> y = c.Logits(d.x[i], shared.handle);
      tally.Status(kLogits, y.status(), false);
      if (y.ok() && !Fp32EqualsExact(*y, d.y[i], {kM, kV})) tally.Wrong(kLogits, "y");
    } else if (r < 70) {
      absl::StatusOr<client::BackwardResult> b = c.Backward(d.dy[i], d.x[i], shared.handle, bw);
      tally.Status(kBackward, b.status(), false);
      if (b.ok() && (!b->dx || !b->dw || !Fp32EqualsExact(*b->dx, d.dx[i], {kM, kK}) ||
                     !Fp32EqualsExact(*b->dw, d.dw[i], {kV, kK}))) {
        tally.Wrong(kBackward, "dx/dw");
      }
    } else if (r < 85) {
      // Register a weight of this thread's, use it once, release it.
      const std::size_t j = i % 2;
      absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(d.own[j], "own");
      tally.Status(kRegister, info.status(), false);
      if (!info.ok()) continue;
      // A release that failed (already counted) leaves a registration behind.
      if (!d.left_behind[j] && (info->already_registered || info->registrations != 1)) {
        tally.Wrong(kRegister, absl::StrCat("registrations=", info->registrations));
      }
      absl::StatusOr<Tensor> y = c.Logits(d.x[0], info->handle);
      tally.Status(kLogits, y.status(), false);
      if (y.ok() && !Fp32EqualsExact(*y, d.own_y[j], {kM, kVOwn})) tally.Wrong(kLogits, "own y");
      absl::StatusOr<std::uint64_t> freed = c.ReleaseWeight(info->handle, d.left_behind[j]);
      tally.Status(kRelease, freed.status(), false);
      d.left_behind[j] = !freed.ok();
      if (freed.ok() && *freed != d.own[j].nbytes()) {
        tally.Wrong(kRelease, absl::StrCat("freed ", *freed, " bytes"));
      }
    } else if (r < 93) {
      absl::StatusOr<Tensor> y = short_c.Logits(shared.x_big, shared.handle_big);
      tally.Status(kCancelLogits, y.status(), true);
      if (y.ok() && !Fp32EqualsExact(*y, shared.y_big, {kMBig, kVBig})) {
        tally.Wrong(kCancelLogits, "y");
      }
    } else {
      absl::StatusOr<client::BackwardResult> b =
          short_c.Backward(shared.dy_big, shared.x_big, shared.handle_big, bw);
      tally.Status(kCancelBackward, b.status(), true);
      if (b.ok() && (!b->dx || !b->dw || !Fp32EqualsExact(*b->dx, shared.dx_big, {kMBig, kK}) ||
                     !Fp32EqualsExact(*b->dw, shared.dw_big, {kVBig, kK}))) {
        tally.Wrong(kCancelBackward, "dx/dw");
      }
    }
  }
}

TEST(SoakTest, ConcurrentMixedLoad) {
  const int seconds = EnvInt("LOGITD_SOAK_SECONDS", 60);
  const int threads = EnvInt("LOGITD_SOAK_THREADS", 32);
  const absl::Duration warmup = absl::Seconds(std::max(10, std::min(30, seconds / 6)));
  const absl::Duration settle = absl::Seconds(3);

  // LOGITD_SOAK_SERVER runs another logitd binary (e.g. a build with a change
  // under test) instead of this build's.
  const char* other = std::getenv("LOGITD_SOAK_SERVER");
  // glibc raises its mmap threshold each time a large mmapped block is freed
  // (up to 32 MiB), after which tensor buffers come from the heap arenas and
  // stay resident: RSS then climbs to a plateau that depends on which of the
  // server's threads happened to allocate what. A fixed threshold keeps
  // tensor-sized buffers in mmap, returned to the system when freed, so that
  // RSS follows the memory the server really holds. (Set it yourself to
  // override; the server inherits the environment.)
  setenv("MALLOC_MMAP_THRESHOLD_", "131072", /*overwrite=*/0);
  absl::StatusOr<ServerProcess> process = ServerProcess::Start(
      other != nullptr && *other != '\0' ? std::string(other) : ServerBinary(), {"--backend=cpu"});
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<std::unique_ptr<client::Client>> admin_client =
      client::Client::Create(process->address());
  ASSERT_TRUE(admin_client.ok()) << admin_client.status();
  auto server =
      std::make_unique<SharedServer>(SharedServer{*std::move(process), *std::move(admin_client)});
  client::Client& admin = *server->client;

  Shared shared;
  shared.y_big = ExactNT(shared.x_big, shared.w_big);
  shared.dx_big = ExactNN(shared.dy_big, shared.w_big);
  shared.dw_big = ExactTN(shared.dy_big, shared.x_big);
  {
    absl::StatusOr<client::WeightInfo> a = admin.RegisterWeight(shared.w, "shared");
    ASSERT_TRUE(a.ok()) << a.status();
    shared.handle = a->handle;
    absl::StatusOr<client::WeightInfo> b = admin.RegisterWeight(shared.w_big, "shared_big");
    ASSERT_TRUE(b.ok()) << b.status();
    shared.handle_big = b->handle;
  }

  std::vector<ThreadData> data;
  std::vector<std::unique_ptr<client::Client>> clients, short_clients;
  for (int t = 0; t < threads; ++t) {
    data.push_back(MakeThreadData(shared, t));
    client::ClientOptions options;
    options.own_connection = (t % 4 == 0);  // some threads on a connection of their own
    absl::StatusOr<std::unique_ptr<client::Client>> c = server->NewClient(options);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
    options.timeout = kShortDeadline;
    absl::StatusOr<std::unique_ptr<client::Client>> s = server->NewClient(options);
    ASSERT_TRUE(s.ok()) << s.status();
    short_clients.push_back(*std::move(s));
  }

  const pid_t pid = server->process.pid();
  auto run_phase = [&](absl::Duration length, Tally& tally) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        Worker(shared, data[static_cast<std::size_t>(t)], *clients[static_cast<std::size_t>(t)],
               *short_clients[static_cast<std::size_t>(t)], t, stop, tally);
      });
    }
    absl::SleepFor(length);
    stop = true;
    for (std::thread& th : pool) th.join();
  };

  const std::int64_t rss_start = RssKib(pid);
  Tally warm;
  run_phase(warmup, warm);
  absl::SleepFor(settle);
  const std::int64_t rss_warm = RssKib(pid);

  Tally load;
  const absl::Time load_start = absl::Now();
  run_phase(absl::Seconds(seconds), load);
  const absl::Duration load_time = absl::Now() - load_start;
  absl::SleepFor(settle);
  const std::int64_t rss_end = RssKib(pid);

  std::printf("soak: %d threads, %s warm-up, %s load (%s measured), cpu backend\n", threads,
              absl::FormatDuration(warmup).c_str(),
              absl::FormatDuration(absl::Seconds(seconds)).c_str(),
              absl::FormatDuration(absl::Trunc(load_time, absl::Milliseconds(1))).c_str());
  std::printf("%-16s %10s %10s %10s %10s\n", "rpc", "ok", "cancelled", "unexpected", "ok/s");
  const double secs = absl::ToDoubleSeconds(load_time);
  for (int op = 0; op < kOps; ++op) {
    std::printf("%-16s %10llu %10llu %10llu %10.1f\n", kOpNames[op],
                static_cast<unsigned long long>(load.ok[op].load()),
                static_cast<unsigned long long>(load.cancelled[op].load()),
                static_cast<unsigned long long>(load.unexpected[op].load()),
                static_cast<double>(load.ok[op].load()) / secs);
  }
  std::printf("wrong results %llu, data loss %llu (warm-up: %llu ok, %llu unexpected)\n",
              static_cast<unsigned long long>(load.wrong.load()),
              static_cast<unsigned long long>(load.data_loss.load()),
              static_cast<unsigned long long>(warm.Sum(warm.ok)),
              static_cast<unsigned long long>(warm.Sum(warm.unexpected)));
  std::printf(
      "server VmRSS: %lld KiB at start, %lld KiB after warm-up, %lld KiB after load "
      "(%+.1f%%)\n",
      static_cast<long long>(rss_start), static_cast<long long>(rss_warm),
      static_cast<long long>(rss_end),
      100.0 * static_cast<double>(rss_end - rss_warm) / static_cast<double>(rss_warm));
  std::fflush(stdout);

  for (Tally* tally : {&warm, &load}) {
    absl::MutexLock lock(&tally->mu);
    for (const std::string& e : tally->first_errors) ADD_FAILURE() << e;
  }
  EXPECT_EQ(load.Sum(load.unexpected), 0u);
  EXPECT_EQ(warm.Sum(warm.unexpected), 0u);
  EXPECT_EQ(load.wrong.load(), 0u);
  EXPECT_EQ(load.data_loss.load(), 0u);
  // Every kind of call made progress, and the short deadlines did cancel.
  for (int op = 0; op < kOps; ++op) {
    if (op == kCancelLogits || op == kCancelBackward) continue;
    EXPECT_GT(load.ok[op].load(), 0u) << kOpNames[op];
  }
  EXPECT_GT(load.cancelled[kCancelLogits].load() + load.cancelled[kCancelBackward].load(), 0u);
  std::uint64_t client_data_loss = 0;
  for (const auto& c : clients) client_data_loss += c->call_stats().data_loss;
  for (const auto& c : short_clients) client_data_loss += c->call_stats().data_loss;
  EXPECT_EQ(client_data_loss, 0u);

  ASSERT_GT(rss_warm, 0);
  ASSERT_GT(rss_end, 0);
#if defined(__SANITIZE_ADDRESS__)
  // The server of this build is instrumented too: its freed memory sits in
  // ASan's quarantine, so resident memory says nothing about leaks (LeakSanitizer does).
  std::printf("AddressSanitizer build: the RSS bound is not checked\n");
#else
  EXPECT_LE(static_cast<double>(rss_end), 1.10 * static_cast<double>(rss_warm))
      << "server RSS grew from " << rss_warm << " KiB to " << rss_end << " KiB";
#endif

  // Only the two shared weights are left: every per-thread weight went.
  absl::StatusOr<std::vector<client::WeightInfo>> list = admin.ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 2u);
  EXPECT_TRUE(ServerAnswers(admin)) << server->process.Log();
}

}  // namespace
}  // namespace logitd::testing
