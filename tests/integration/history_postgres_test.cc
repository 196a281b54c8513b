// The history on a PostgreSQL server (Debian's, started by the test) shared
// by two logitd replicas: both migrate one new database as they start at
// once, sixteen clients record through both at once and every
// acknowledged run is listed by each replica; a run recorded through one
// replica is the baseline of a Verify through the other; a replica killed
// mid-write loses no acknowledged run; a server that does not answer stops
// logitd at start with the reason, its password not said.
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/common/seeded_tensors.h"
#include "tests/integration/integration_util.h"
#include "tests/support/scratch_postgres.h"

namespace logitd::testing {
namespace {

using client::RunLabels;
using client::VerifyArgs;
using client::VerifyOperation;
using client::VerifyResult;
using ::testing::HasSubstr;

std::unique_ptr<client::Client> Connect(const ServerProcess& server) {
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(server.address());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// The runs a replica lists for the caller, every page.
std::set<std::int64_t> ListedRuns(client::Client& c) {
  std::set<std::int64_t> listed;
  client::ListRunsArgs page;
  page.page_size = 1000;
  for (;;) {
    absl::StatusOr<client::ListRunsResult> r = c.ListRuns(page);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return listed;
    for (const client::RunSummary& run : r->runs) {
      EXPECT_TRUE(listed.insert(run.run_id).second) << run.run_id;
      EXPECT_EQ(run.candidates.size(), 1u) << run.run_id;
    }
    if (r->next_before_run_id == 0) return listed;
    page.before_run_id = r->next_before_run_id;
  }
}

TEST(HistoryPostgresTest, TwoReplicasOnOneServerLoseNoRunAndShareBaselines) {
  absl::StatusOr<std::unique_ptr<ScratchPostgres>> pg = ScratchPostgres::Start();
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::StatusOr<std::string> uri = (*pg)->NewDatabase("shared");
  ASSERT_TRUE(uri.ok()) << uri.status();
  // Both start at once on the new database: one migrates it, the other
  // waits for the lock and finds it done.
  std::vector<std::optional<ServerProcess>> replicas(2);
  {
    std::vector<std::thread> starting;
    for (auto& replica : replicas) {
      starting.emplace_back([&] {
        absl::StatusOr<ServerProcess> p =
            ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--history=" + *uri});
        EXPECT_TRUE(p.ok()) << p.status();
        if (p.ok()) replica.emplace(*std::move(p));
      });
    }
    for (std::thread& t : starting) t.join();
  }
  ASSERT_TRUE(replicas[0].has_value() && replicas[1].has_value());
  EXPECT_THAT(replicas[0]->Log(), HasSubstr("history: recording runs in PostgreSQL at"));
  const Tensor w = NormalBf16({40, 48}, 51);
  std::vector<std::string> handles;
  for (auto& replica : replicas) {
    std::unique_ptr<client::Client> c = Connect(*replica);
    absl::StatusOr<client::WeightInfo> info = c->RegisterWeight(w, "shared-w");
    ASSERT_TRUE(info.ok()) << info.status();
    handles.push_back(info->handle);
  }

  // Sixteen clients, eight through each replica, ten runs each.
  std::mutex mu;
  std::vector<std::int64_t> acknowledged;
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t) {
    clients.emplace_back([&, t] {
      std::unique_ptr<client::Client> c = Connect(*replicas[t % 2]);
      for (std::uint32_t i = 0; i < 10 && c != nullptr; ++i) {
        VerifyArgs args;
        args.operation = VerifyOperation::kLogits;
        args.weight_handle = handles[t % 2];
        const Tensor x = NormalBf16({3, 48}, 1000 * t + i);
        args.x = x;
        absl::StatusOr<Tensor> y = c->Logits(x, args.weight_handle);
        ASSERT_TRUE(y.ok()) << y.status();
        args.candidates["y"] = *y;
        args.record = RunLabels{"p", absl::StrCat("c", t), "main", absl::StrCat("r", i)};
        absl::StatusOr<VerifyResult> r = c->Verify(args);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->record_error, "");
        std::lock_guard<std::mutex> lock(mu);
        acknowledged.push_back(r->run_id);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  ASSERT_EQ(acknowledged.size(), 160u);
  const std::set<std::int64_t> want(acknowledged.begin(), acknowledged.end());
  EXPECT_EQ(want.size(), acknowledged.size());
  for (auto& replica : replicas) {
    std::unique_ptr<client::Client> c = Connect(*replica);
    EXPECT_EQ(ListedRuns(*c), want);
  }

  // A run recorded through replica 0 is the baseline of a Verify through
  // replica 1: the same inputs and bits, identical.
  std::vector<std::unique_ptr<client::Client>> c;
  for (auto& replica : replicas) c.push_back(Connect(*replica));
  VerifyArgs args;
  args.operation = VerifyOperation::kLogits;
  const Tensor x = NormalBf16({4, 48}, 77);
  args.x = x;
  args.weight_handle = handles[0];
  absl::StatusOr<Tensor> y = c[0]->Logits(x, handles[0]);
  ASSERT_TRUE(y.ok()) << y.status();
  args.candidates["y"] = *y;
  args.record = RunLabels{"p", "shared", "main", "r1"};
  absl::StatusOr<VerifyResult> first = c[0]->Verify(args);
  ASSERT_TRUE(first.ok()) << first.status();
  args.weight_handle = handles[1];
  args.record = RunLabels{"p", "shared", "dev", "r2"};
  args.compare = client::BaselineSelector{"main", "", 0, "", false};
  absl::StatusOr<VerifyResult> second = c[1]->Verify(args);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->comparison.has_value());
  EXPECT_EQ(second->comparison->baseline_run_id, first->run_id);
  EXPECT_EQ(second->comparison->baseline_labels.ref, "r1");
  ASSERT_EQ(second->comparison->candidates.size(), 1u);
  EXPECT_EQ(second->comparison->candidates[0].bits, "identical");
}

// kill -9 of a replica while sixteen clients record through it and the
// other: every run either acknowledged is listed by the survivor and by the
// replica started again, none twice.
TEST(HistoryPostgresTest, AReplicaKilledMidWriteLosesNoAcknowledgedRun) {
  absl::StatusOr<std::unique_ptr<ScratchPostgres>> pg = ScratchPostgres::Start();
  ASSERT_TRUE(pg.ok()) << pg.status();
  absl::StatusOr<std::string> uri = (*pg)->NewDatabase("killed");
  ASSERT_TRUE(uri.ok()) << uri.status();
  const std::vector<std::string> args = {"--backend=cpu", "--history=" + *uri};
  absl::StatusOr<ServerProcess> doomed = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  absl::StatusOr<ServerProcess> survivor = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  const Tensor w = NormalBf16({40, 48}, 61);
  std::vector<std::string> handles;
  for (ServerProcess* p : {&*doomed, &*survivor}) {
    absl::StatusOr<client::WeightInfo> info = Connect(*p)->RegisterWeight(w, "w");
    ASSERT_TRUE(info.ok()) << info.status();
    handles.push_back(info->handle);
  }
  RecordingClients clients(
      16, [&](int t) { return Connect(t % 2 == 0 ? *doomed : *survivor); },
      [&](int t, std::uint32_t i, client::Client& c) -> absl::StatusOr<std::int64_t> {
        const Tensor x = NormalBf16({3, 48}, 100 * t + i % 50);
        absl::StatusOr<Tensor> y = c.Logits(x, handles[t % 2]);
        if (!y.ok()) return y.status();
        VerifyArgs a;
        a.operation = VerifyOperation::kLogits;
        a.weight_handle = handles[t % 2];
        a.x = x;
        a.candidates["y"] = *y;
        a.record = RunLabels{"p", absl::StrCat("c", t), "main", ""};
        absl::StatusOr<VerifyResult> r = c.Verify(a);
        if (!r.ok()) return r.status();
        return r->run_id;
      });
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_EQ(kill(doomed->pid(), SIGKILL), 0);
  absl::SleepFor(absl::Milliseconds(300));  // the survivor goes on recording
  const std::vector<std::int64_t> acknowledged = clients.Stop();
  doomed->WaitExit(absl::Seconds(10));
  ASSERT_GT(acknowledged.size(), 16u);
  const std::set<std::int64_t> want(acknowledged.begin(), acknowledged.end());
  EXPECT_EQ(want.size(), acknowledged.size());
  absl::StatusOr<ServerProcess> again = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(again.ok()) << again.status();
  for (ServerProcess* p : {&*survivor, &*again}) {
    const std::set<std::int64_t> listed = ListedRuns(*Connect(*p));
    for (std::int64_t id : want) EXPECT_EQ(listed.count(id), 1u) << id;
  }
}

TEST(HistoryPostgresTest, AServerThatDoesNotAnswerStopsLogitdAtStartWithTheReason) {
  // A port nothing listens on: a server started and stopped.
  int port = 0;
  {
    absl::StatusOr<std::unique_ptr<ScratchPostgres>> pg = ScratchPostgres::Start();
    ASSERT_TRUE(pg.ok()) << pg.status();
    port = (*pg)->port();
  }
  const std::string uri = absl::StrCat("postgresql://logitd:s3cret@127.0.0.1:", port, "/h");
  absl::StatusOr<ServerProcess> p =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--history=" + uri});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("logitd:***@127.0.0.1"));
  EXPECT_THAT(p.status().message(), HasSubstr("cannot connect"));
  EXPECT_THAT(p.status().message(), ::testing::Not(HasSubstr("s3cret")));
}

}  // namespace
}  // namespace logitd::testing
