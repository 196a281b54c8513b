// The server's history through the real binary and client: a Verify that
// asks to be recorded gets a run id, ListRuns gives the run back with its
// labels, platform and each candidate's figures as the verdict said them,
// newest first, filtered and a page at a time; the runs outlive a restart on
// the same file; two tenants see only their own; a server with
// --history=none refuses both with FAILED_PRECONDITION and still verifies
// what asks for no record; bad labels are INVALID_ARGUMENT before any work.
#include <signal.h>
#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/common/seeded_tensors.h"
#include "tests/integration/integration_util.h"
#include "tests/support/run_logitctl.h"

namespace logitd::testing {
namespace {

using client::ListRunsArgs;
using client::RunLabels;
using client::VerifyArgs;
using client::VerifyOperation;
using client::VerifyResult;
using ::testing::HasSubstr;

std::unique_ptr<client::Client> Connect(const ServerProcess& server,
                                        const std::string& token = "") {
  client::ClientOptions o;
  o.auth_token = token;
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(server.address(), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// A logits Verify of logitd's own output of random x over w (registered),
// recorded under `labels` when given.
absl::StatusOr<VerifyResult> VerifyOwnLogits(client::Client& c, const std::string& handle,
                                             std::uint32_t seed,
                                             const std::optional<RunLabels>& labels) {
  const Tensor x = NormalBf16({5, 48}, seed);
  absl::StatusOr<Tensor> y = c.Logits(x, handle);
  if (!y.ok()) return y.status();
  VerifyArgs args;
  args.operation = VerifyOperation::kLogits;
  args.weight_handle = handle;
  args.x = x;
  args.candidates["y"] = *y;
  args.record = labels;
  return c.Verify(args);
}

std::string Register(client::Client& c, const Tensor& w) {
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "history-w");
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->handle : "";
}

// A server with a history file and a registered weight [50, K], with X
// [6, K] and logitd's own Y written for logitctl (x.safetensors,
// y.safetensors) and Y with the last mantissa bit of its element 7 flipped
// (f.safetensors: other bits, still within the bound).
struct LogitctlSetup {
  TempDir dir;
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<client::Client> client;
  std::string handle;
  std::string at;  // --server=...

  // logitctl verify --op=logits of X and `candidate` (a file of dir), then `more`.
  LogitctlRun Verify(const std::string& candidate, const std::vector<std::string>& more) const {
    std::vector<std::string> all = {at,
                                    "verify",
                                    "--op=logits",
                                    "--x=" + (dir / "x.safetensors"),
                                    "--weight=" + handle,
                                    "--candidate=" + (dir / candidate)};
    all.insert(all.end(), more.begin(), more.end());
    return RunLogitctl(all);
  }
};

std::unique_ptr<LogitctlSetup> SetUpLogitctl(std::uint32_t seed, std::int64_t k) {
  auto s = std::make_unique<LogitctlSetup>();
  absl::StatusOr<ServerProcess> p = ServerProcess::Start(
      ServerBinary(), {"--backend=cpu", "--history=" + (s->dir / "h.sqlite3")});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  s->server = std::make_unique<ServerProcess>(*std::move(p));
  s->at = "--server=" + s->server->address();
  s->client = Connect(*s->server);
  const Tensor x = NormalBf16({6, k}, seed), w = NormalBf16({50, k}, seed + 1);
  s->handle = Register(*s->client, w);
  absl::StatusOr<Tensor> y = s->client->Logits(x, s->handle);
  EXPECT_TRUE(y.ok()) << y.status();
  if (!y.ok()) return nullptr;
  EXPECT_TRUE(WriteSafetensors(s->dir / "x.safetensors", {{"x", &x}}).ok());
  EXPECT_TRUE(WriteSafetensors(s->dir / "y.safetensors", {{"y", &*y}}).ok());
  std::uint32_t bits;
  std::memcpy(&bits, &y->data<float>()[7], sizeof bits);
  bits ^= 1u;
  std::memcpy(&y->data<float>()[7], &bits, sizeof bits);
  EXPECT_TRUE(WriteSafetensors(s->dir / "f.safetensors", {{"y", &*y}}).ok());
  return s;
}

TEST(HistoryTest, VerifyRecordsRunsThatListRunsGivesBackAcrossARestart) {
  TempDir dir;
  const std::string file = dir / "history.sqlite3";
  const std::vector<std::string> args = {"--backend=cpu", "--history=" + file};
  absl::StatusOr<ServerProcess> server = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(server->Log(), HasSubstr("history: recording runs in " + file));
  std::unique_ptr<client::Client> c = Connect(*server);
  ASSERT_NE(c, nullptr);
  const std::string handle = Register(*c, NormalBf16({70, 48}, 1));

  // Not asked: nothing recorded.
  absl::StatusOr<VerifyResult> plain = VerifyOwnLogits(*c, handle, 2, std::nullopt);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->run_id, 0);
  // Three recorded runs on two branches.
  std::vector<VerifyResult> recorded;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<VerifyResult> r = VerifyOwnLogits(
        *c, handle, 10 + i,
        RunLabels{"lm-head", "logits-5x48", i < 2 ? "main" : "dev", absl::StrCat("commit", i)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->run_id, 0);
    recorded.push_back(*std::move(r));
  }
  EXPECT_LT(recorded[0].run_id, recorded[1].run_id);

  absl::StatusOr<client::ServerInfo> info = c->Info();
  ASSERT_TRUE(info.ok());
  absl::StatusOr<client::ListRunsResult> all = c->ListRuns(ListRunsArgs{});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->runs.size(), 3u);
  EXPECT_EQ(all->next_before_run_id, 0);
  const client::RunSummary& newest = all->runs[0];
  EXPECT_EQ(newest.run_id, recorded[2].run_id);
  EXPECT_EQ(newest.labels.project, "lm-head");
  EXPECT_EQ(newest.labels.case_name, "logits-5x48");
  EXPECT_EQ(newest.labels.branch, "dev");
  EXPECT_EQ(newest.labels.ref, "commit2");
  EXPECT_EQ(newest.operation, "logits");
  EXPECT_EQ(newest.inputs_xxh3, recorded[2].inputs_xxh3);
  EXPECT_EQ(newest.verdict, recorded[2].verdict);
  EXPECT_EQ(newest.backend, "cpu");
  EXPECT_EQ(newest.device, info->device_name);
  EXPECT_FALSE(newest.logitd_version.empty());
  EXPECT_GT(newest.recorded_unix_micros, 0);
  ASSERT_EQ(newest.candidates.size(), 1u);
  const client::CandidateVerdict& said = recorded[2].candidates[0];
  const client::CandidateSummary& kept = newest.candidates[0];
  EXPECT_EQ(kept.name, "y");
  EXPECT_EQ(kept.verdict, said.verdict);
  EXPECT_EQ(kept.xxh3, said.xxh3);
  EXPECT_EQ(kept.elements, said.elements);
  EXPECT_EQ(kept.worst_bound_fraction, said.worst_bound_fraction);
  EXPECT_EQ(kept.bitwise_equal_fraction, said.bitwise_equal_fraction);
  EXPECT_EQ(kept.max_ulp, said.max_ulp);
  EXPECT_EQ(kept.effective_bits, said.precision_class.effective_bits);

  // Filtered, and a page at a time.
  ListRunsArgs main_only;
  main_only.branch = "main";
  EXPECT_EQ(c->ListRuns(main_only)->runs.size(), 2u);
  ListRunsArgs other;
  other.project = "another";
  EXPECT_TRUE(c->ListRuns(other)->runs.empty());
  ListRunsArgs page;
  page.page_size = 2;
  absl::StatusOr<client::ListRunsResult> first = c->ListRuns(page);
  ASSERT_EQ(first->runs.size(), 2u);
  EXPECT_EQ(first->next_before_run_id, recorded[1].run_id);
  page.before_run_id = first->next_before_run_id;
  absl::StatusOr<client::ListRunsResult> second = c->ListRuns(page);
  ASSERT_EQ(second->runs.size(), 1u);
  EXPECT_EQ(second->runs[0].run_id, recorded[0].run_id);
  EXPECT_EQ(second->next_before_run_id, 0);
  page.page_size = 1001;
  EXPECT_EQ(c->ListRuns(page).status().code(), absl::StatusCode::kInvalidArgument);

  // Bad labels: refused before the work, nothing recorded.
  absl::StatusOr<VerifyResult> no_case =
      VerifyOwnLogits(*c, handle, 20, RunLabels{"lm-head", "", "", ""});
  EXPECT_EQ(no_case.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_case.status().message(), HasSubstr("record.case_name"));
  EXPECT_EQ(c->ListRuns(ListRunsArgs{})->runs.size(), 3u);

  // The same file after a restart.
  c.reset();
  ASSERT_EQ(server->Stop(), 0) << server->Log();
  absl::StatusOr<ServerProcess> again = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(again.ok()) << again.status();
  c = Connect(*again);
  absl::StatusOr<client::ListRunsResult> after = c->ListRuns(ListRunsArgs{});
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->runs.size(), 3u);
  EXPECT_EQ(after->runs[0].run_id, recorded[2].run_id);
  EXPECT_EQ(after->runs[2].labels.ref, "commit0");
}

TEST(HistoryTest, EachTenantSeesItsOwnRuns) {
  TempDir dir;
  const std::string tokens = dir / "tokens";
  {
    FILE* f = std::fopen(tokens.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("token-a tenant-a\ntoken-b tenant-b\n", f);
    std::fclose(f);
  }
  absl::StatusOr<ServerProcess> server = ServerProcess::Start(
      ServerBinary(),
      {"--backend=cpu", "--history=" + (dir / "h.sqlite3"), "--auth_tokens=" + tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> a = Connect(*server, "token-a");
  std::unique_ptr<client::Client> b = Connect(*server, "token-b");
  const std::string handle_a = Register(*a, NormalBf16({33, 48}, 3));
  const std::string handle_b = Register(*b, NormalBf16({33, 48}, 3));
  ASSERT_TRUE(VerifyOwnLogits(*a, handle_a, 4, RunLabels{"p", "c", "", ""}).ok());
  ASSERT_TRUE(VerifyOwnLogits(*a, handle_a, 5, RunLabels{"p", "c", "", ""}).ok());
  ASSERT_TRUE(VerifyOwnLogits(*b, handle_b, 6, RunLabels{"p", "c", "", ""}).ok());
  EXPECT_EQ(a->ListRuns(ListRunsArgs{})->runs.size(), 2u);
  EXPECT_EQ(b->ListRuns(ListRunsArgs{})->runs.size(), 1u);
}

TEST(HistoryTest, AServerWithoutHistoryRefusesToRecordAndToListButStillVerifies) {
  absl::StatusOr<ServerProcess> server =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--history=none"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> c = Connect(*server);
  const std::string handle = Register(*c, NormalBf16({40, 48}, 7));
  absl::StatusOr<VerifyResult> recorded =
      VerifyOwnLogits(*c, handle, 8, RunLabels{"p", "c", "", ""});
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(recorded.status().message(), HasSubstr("--history=none"));
  absl::StatusOr<client::ListRunsResult> runs = c->ListRuns(ListRunsArgs{});
  EXPECT_EQ(runs.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<VerifyResult> plain = VerifyOwnLogits(*c, handle, 9, std::nullopt);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->passed());
  EXPECT_EQ(plain->run_id, 0);
}

// A Verify compared with a recorded run: the same bits are "identical",
// one ulp off "different_within_bounds", far off "different_outside_bounds",
// with the figures' deltas; other inputs are said; a baseline that is not
// there is NOT_FOUND before any work, and compare without record is
// INVALID_ARGUMENT.
TEST(HistoryTest, AVerifyComparedWithARecordedRunSaysWhatChanged) {
  TempDir dir;
  absl::StatusOr<ServerProcess> server =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--history=" + (dir / "h.sqlite3")});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> c = Connect(*server);
  const std::string handle = Register(*c, NormalBf16({64, 48}, 31));
  const Tensor x = NormalBf16({5, 48}, 32);
  absl::StatusOr<Tensor> y = c->Logits(x, handle);
  ASSERT_TRUE(y.ok()) << y.status();
  const auto verify = [&](const Tensor& candidate, const Tensor& inputs, const std::string& branch,
                          std::optional<client::BaselineSelector> compare) {
    VerifyArgs args;
    args.operation = VerifyOperation::kLogits;
    args.weight_handle = handle;
    args.x = inputs;
    args.candidates["y"] = candidate;
    args.record = RunLabels{"p", "logits", branch, ""};
    args.compare = std::move(compare);
    return c->Verify(args);
  };
  absl::StatusOr<VerifyResult> base = verify(*y, x, "main", std::nullopt);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_FALSE(base->comparison.has_value());

  absl::StatusOr<VerifyResult> same =
      verify(*y, x, "dev", client::BaselineSelector{"main", "", 0, "", false});
  ASSERT_TRUE(same.ok()) << same.status();
  ASSERT_TRUE(same->comparison.has_value());
  EXPECT_EQ(same->comparison->baseline_run_id, base->run_id);
  EXPECT_EQ(same->comparison->baseline_labels.branch, "main");
  EXPECT_TRUE(same->comparison->same_inputs);
  EXPECT_EQ(same->comparison->platform_difference, "");
  ASSERT_EQ(same->comparison->candidates.size(), 1u);
  EXPECT_EQ(same->comparison->candidates[0].bits, "identical");
  EXPECT_EQ(same->comparison->candidates[0].max_ulp_delta, 0);

  Tensor ulp(DType::kFp32, y->shape());
  std::memcpy(ulp.bytes(), y->bytes(), y->nbytes());
  float* v = ulp.data<float>();
  v[7] = std::nextafter(v[7], 1e30f);
  absl::StatusOr<VerifyResult> off =
      verify(ulp, x, "dev", client::BaselineSelector{"main", "", 0, "", false});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->comparison->candidates[0].bits, "different_within_bounds");
  EXPECT_EQ(off->comparison->candidates[0].max_ulp_delta, 1);
  EXPECT_EQ(off->comparison->candidates[0].changed_blocks, std::vector<std::int64_t>{0});
  EXPECT_EQ(off->comparison->candidates[0].rows, 5);
  v[7] = 1e30f;
  absl::StatusOr<VerifyResult> far =
      verify(ulp, x, "dev", client::BaselineSelector{"", "", base->run_id, "", false});
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_EQ(far->verdict, "outside_bounds");
  EXPECT_EQ(far->comparison->candidates[0].bits, "different_outside_bounds");
  EXPECT_GT(far->comparison->candidates[0].worst_bound_fraction_delta, 1);
  // The branch's latest run is the one before this one.
  absl::StatusOr<VerifyResult> latest =
      verify(*y, x, "dev", client::BaselineSelector{"dev", "", 0, "", false});
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->comparison->baseline_run_id, far->run_id);
  EXPECT_EQ(latest->comparison->candidates[0].bits, "different_outside_bounds");
  // Other inputs are said.
  const Tensor x2 = NormalBf16({5, 48}, 33);
  absl::StatusOr<Tensor> y2 = c->Logits(x2, handle);
  absl::StatusOr<VerifyResult> other =
      verify(*y2, x2, "dev", client::BaselineSelector{"main", "", 0, "", false});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->comparison->same_inputs);

  // A promoted run, by its name.
  ASSERT_TRUE(c->PromoteRun(base->run_id, "golden").ok());
  EXPECT_EQ(c->PromoteRun(9999, "golden").code(), absl::StatusCode::kNotFound);
  absl::StatusOr<VerifyResult> golden =
      verify(*y, x, "dev", client::BaselineSelector{"", "", 0, "golden", false});
  ASSERT_TRUE(golden.ok()) << golden.status();
  EXPECT_EQ(golden->comparison->baseline_run_id, base->run_id);
  EXPECT_EQ(golden->comparison->candidates[0].bits, "identical");

  absl::StatusOr<VerifyResult> none =
      verify(*y, x, "dev", client::BaselineSelector{"nope", "", 0, "", false});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(),
              HasSubstr("no recorded run of project 'p', case 'logits' on branch 'nope'"));
  VerifyArgs unrecorded;
  unrecorded.operation = VerifyOperation::kLogits;
  unrecorded.weight_handle = handle;
  unrecorded.x = x;
  unrecorded.candidates["y"] = *y;
  unrecorded.compare = client::BaselineSelector{"main", "", 0, "", false};
  EXPECT_EQ(c->Verify(unrecorded).status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing was recorded by the refused calls.
  EXPECT_EQ(c->ListRuns(ListRunsArgs{})->runs.size(), 7u);
}

// A server a test starts without a --history flag keeps its history in the
// test's own folder, not in the machine's state directory.
TEST(HistoryTest, ATestServerWithoutAHistoryFlagKeepsItsHistoryInItsOwnFolder) {
  absl::StatusOr<ServerProcess> server = ServerProcess::Start(ServerBinary(), {"--backend=cpu"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> c = Connect(*server);
  const std::string handle = Register(*c, NormalBf16({40, 48}, 43));
  absl::StatusOr<VerifyResult> r = VerifyOwnLogits(*c, handle, 7, RunLabels{"p", "own", "", ""});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->run_id, 0);
  EXPECT_TRUE(std::filesystem::exists(server->dir() + "/history.sqlite3")) << server->dir();
}

// kill -9 while clients record runs: after a restart on the same file,
// every run whose id a client got back is listed, none twice, and the file
// passes SQLite's integrity check.
TEST(HistoryTest, EveryAcknowledgedRunSurvivesAKillMidWrite) {
  TempDir dir;
  const std::string file = dir / "h.sqlite3";
  const std::vector<std::string> args = {"--backend=cpu", "--history=" + file};
  absl::StatusOr<ServerProcess> server = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> setup = Connect(*server);
  const std::string handle = Register(*setup, NormalBf16({40, 48}, 41));
  // Sixteen clients recording at once, each a case of its own.
  RecordingClients clients(
      16, [&](int) { return Connect(*server); },
      [&](int t, std::uint32_t i, client::Client& c) -> absl::StatusOr<std::int64_t> {
        absl::StatusOr<VerifyResult> r = VerifyOwnLogits(
            c, handle, 100 * t + i % 50, RunLabels{"p", absl::StrCat("c", t), "main", ""});
        if (!r.ok()) return r.status();
        return r->run_id;
      });
  absl::SleepFor(absl::Milliseconds(1500));
  ASSERT_EQ(kill(server->pid(), SIGKILL), 0);
  const std::vector<std::int64_t> acknowledged = clients.Stop();
  server->WaitExit(absl::Seconds(10));
  ASSERT_GT(acknowledged.size(), 16u);
  EXPECT_EQ(std::set<std::int64_t>(acknowledged.begin(), acknowledged.end()).size(),
            acknowledged.size());

  absl::StatusOr<ServerProcess> again = ServerProcess::Start(ServerBinary(), args);
  ASSERT_TRUE(again.ok()) << again.status();
  std::unique_ptr<client::Client> c = Connect(*again);
  std::set<std::int64_t> listed;
  ListRunsArgs page;
  page.page_size = 1000;
  for (;;) {
    absl::StatusOr<client::ListRunsResult> r = c->ListRuns(page);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const client::RunSummary& run : r->runs) {
      EXPECT_TRUE(listed.insert(run.run_id).second) << run.run_id;
      EXPECT_EQ(run.candidates.size(), 1u) << run.run_id;
    }
    if (r->next_before_run_id == 0) break;
    page.before_run_id = r->next_before_run_id;
  }
  for (std::int64_t id : acknowledged) EXPECT_EQ(listed.count(id), 1u) << id;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* check = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &check, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(check), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(check, 0)), "ok");
  sqlite3_finalize(check);
  sqlite3_close(db);
}

// logitctl: verify --project records (and says the run's id), runs lists
// the runs as a table or JSON, filtered; --project without --case and
// --branch without --project are usage errors (exit 2) before any call.
TEST(HistoryTest, LogitctlVerifyRecordsAndRunsListsThem) {
  std::unique_ptr<LogitctlSetup> s = SetUpLogitctl(21, 40);
  ASSERT_NE(s, nullptr);
  const std::string& at = s->at;
  const auto with = [&](const std::vector<std::string>& more) {
    return s->Verify("y.safetensors", more);
  };
  LogitctlRun r = with({"--project=lm", "--case=six", "--branch=main", "--ref=c0ffee"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("recorded as run 1 in the server's history (project lm, case six)"));
  r = with({"--project=lm", "--case=six", "--branch=dev", "--compare_branch=main"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("against run 1 (main at c0ffee, bitwise_equal_to_logitd): the same "
                               "platform"));
  EXPECT_THAT(r.out, HasSubstr("  y: identical"));
  r = with({"--project=lm", "--case=six", "--compare_run=99"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no recorded run of project 'lm', case 'six' with id 99"));
  r = RunLogitctl({at, "runs", "promote", "1", "golden"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("run 1 is baseline 'golden'"));
  r = with({"--project=lm", "--case=six", "--compare_baseline=golden"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("against run 1 (main at c0ffee"));
  EXPECT_EQ(RunLogitctl({at, "runs", "promote", "x", "golden"}).exit_code, 2);
  r = with({"--compare_branch=main"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--compare_*: needs --project"));
  r = with({"--project=lm", "--case=other"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = with({"--project=lm"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--project: needs --case=CASE"));
  r = with({"--branch=main"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--branch: given without --project"));

  r = RunLogitctl({at, "runs"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("c0ffee"));
  EXPECT_THAT(r.out, HasSubstr("y:bitwise_equal_to_logitd"));
  EXPECT_EQ(RunLogitctl({at, "history"}).out, r.out);  // the same command
  r = RunLogitctl({at, "runs", "projects"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("lm +2 +4 +0"));  // cases, runs, alerts
  r = RunLogitctl({at, "runs", "cases", "--project=lm", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json cases = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(cases.is_array() && cases.size() == 2u) << r.out;
  EXPECT_EQ(cases[0]["case"], "other");
  EXPECT_EQ(cases[1]["case"], "six");
  EXPECT_EQ(cases[1]["runs"], 3);
  EXPECT_EQ(RunLogitctl({at, "runs", "cases"}).exit_code, 2);
  r = RunLogitctl({at, "runs", "--since=2999-01-01T00:00:00Z"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("c0ffee")));
  r = RunLogitctl({at, "runs", "--until=2999-01-01T00:00:00Z", "--backend=cpu"});
  EXPECT_THAT(r.out, HasSubstr("c0ffee"));
  EXPECT_THAT(RunLogitctl({at, "runs", "--device=none"}).out, ::testing::Not(HasSubstr("c0ffee")));
  r = RunLogitctl({at, "runs", "--since=yesterday"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--since: expected an RFC 3339 time"));
  r = RunLogitctl({at, "runs", "--case=six", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][2]["run_id"], 1);
  EXPECT_EQ(j["runs"][2]["branch"], "main");
  EXPECT_EQ(j["runs"][0]["candidates"][0]["verdict"], "bitwise_equal_to_logitd");
  EXPECT_THAT(j["runs"][0]["libraries"].get<std::string>(), ::testing::EndsWith(" threads"));
  EXPECT_EQ(j["next_before"], 0);
  r = RunLogitctl({at, "runs", "--limit=1"});
  EXPECT_THAT(r.out, HasSubstr("more: --before=4"));
  EXPECT_EQ(RunLogitctl({at, "runs", "--limit=0"}).exit_code, 2);
}

// A project's rules through logitctl: set and listed back; a run on main
// whose candidate's bits changed against main's last run is an alert
// (logitctl verify exits 1 and says the rule and what broke it, the run is
// listed with it); the same candidate on another branch is not; bad rules
// are refused before anything is kept.
TEST(HistoryTest, ARunThatBreaksARuleOfItsProjectIsAnAlertAndLogitctlExits1) {
  std::unique_ptr<LogitctlSetup> s = SetUpLogitctl(31, 40);
  ASSERT_NE(s, nullptr);
  const std::string& at = s->at;
  client::Client* c = s->client.get();
  const auto verify = [&](const std::string& candidate, std::vector<std::string> more) {
    more.insert(more.begin(), {"--project=lm", "--case=six"});
    return s->Verify(candidate, more);
  };

  LogitctlRun r = RunLogitctl({at, "rules", "set", "--project=lm",
                               "bits_unchanged branch=main candidate=y", "max_p99_ulp=1000"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("project lm has 2 rules"));
  r = RunLogitctl({at, "rules", "--project=lm"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "bits_unchanged branch=main candidate=y\nmax_p99_ulp=1000\n");

  r = verify("y.safetensors", {"--branch=main", "--ref=r1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = verify("y.safetensors", {"--branch=main", "--ref=r2", "--compare_branch=main"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("  y: identical"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("ALERT")));
  r = verify("f.safetensors", {"--branch=main", "--ref=r3", "--compare_branch=main"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("  y: different_within_bounds"));
  EXPECT_THAT(r.out, HasSubstr("; changed rows: 0\n"));  // element 7 of [6, 50]
  EXPECT_THAT(r.out, HasSubstr("ALERT: this run broke 1 rule of its project:\n  bits_unchanged "
                               "branch=main candidate=y: y's bits changed against run 2 (ref "
                               "r2): different_within_bounds"));
  r = verify("f.safetensors", {"--branch=dev", "--compare_branch=main"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;

  ListRunsArgs list;
  list.project = "lm";
  absl::StatusOr<client::ListRunsResult> runs = c->ListRuns(list);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->runs.size(), 4u);
  EXPECT_TRUE(runs->runs[0].alerts.empty());  // dev
  ASSERT_EQ(runs->runs[1].alerts.size(), 1u);
  EXPECT_EQ(runs->runs[1].alerts[0].rule, "bits_unchanged branch=main candidate=y");
  EXPECT_EQ(runs->runs[1].alerts[0].candidate, "y");
  r = RunLogitctl({at, "runs", "show", absl::StrCat(runs->runs[1].run_id)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("compared with run 2\n"));
  EXPECT_THAT(r.out, HasSubstr("ALERT: bits_unchanged branch=main candidate=y: y's bits changed"));
  EXPECT_EQ(RunLogitctl({at, "runs", "show", "999"}).exit_code, 2);
  r = RunLogitctl({at, "runs", "--project=lm", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["runs"][1]["alerts"][0]["rule"], "bits_unchanged branch=main candidate=y");
  EXPECT_EQ(j["runs"][0]["alerts"].size(), 0u);

  for (const char* bad : {"max_worst_fraction_growth=0.5", "max_p99_ulp=-1"}) {
    r = RunLogitctl({at, "rules", "set", "--project=lm", bad});
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.err, HasSubstr("rules[0]")) << bad;
  }
  r = RunLogitctl({at, "rules", "set", "--project=lm", "bits_unchanged colour=red"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("'colour=red': expected case=C, branch=B or candidate=Y"));
  EXPECT_EQ(RunLogitctl({at, "rules"}).exit_code, 2);
  absl::StatusOr<std::vector<client::HistoryRule>> kept = c->ListRules("lm");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->size(), 2u);  // the refused sets kept nothing
  EXPECT_EQ(c->SetRules("", {}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->SetRules("lm", {}).ok());
  EXPECT_TRUE(c->ListRules("lm")->empty());
}

// A store that stays locked past its wait (another writer holds it): the
// Verify still answers its verdict, says why the run was not recorded, and
// logitctl exits 1 (no rule was checked); once the lock goes, runs are
// recorded again. And --compare_missing=record: a branch's first run is
// recorded without a comparison.
TEST(HistoryTest, AStoreLockedPastItsWaitLeavesTheRunUnrecordedAndTheVerdictStands) {
  std::unique_ptr<LogitctlSetup> s = SetUpLogitctl(41, 48);
  ASSERT_NE(s, nullptr);
  const std::string path = s->dir / "h.sqlite3";
  client::Client* c = s->client.get();
  const std::string& handle = s->handle;
  const auto verify = [&](std::vector<std::string> more) {
    more.insert(more.begin(), {"--project=lm", "--case=c"});
    return s->Verify("y.safetensors", more);
  };

  LogitctlRun r = verify({"--branch=pr", "--compare_branch=main", "--compare_missing=record"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("recorded as run 1"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("against run")));
  r = verify({"--compare_branch=main"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("on branch 'main'"));
  EXPECT_EQ(verify({"--compare_branch=main", "--compare_missing=maybe"}).exit_code, 2);

  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE;", nullptr, nullptr, nullptr), SQLITE_OK);
  const absl::Time start = absl::Now();
  absl::StatusOr<VerifyResult> v = VerifyOwnLogits(*c, handle, 43, RunLabels{"lm", "c", "", ""});
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->passed());
  EXPECT_EQ(v->run_id, 0);
  EXPECT_THAT(v->record_error, HasSubstr("the run was not recorded in the server's history"));
  EXPECT_THAT(v->record_error, HasSubstr("locked"));
  EXPECT_LT(took, absl::Seconds(15));  // the store's 5 s wait, and the verdict
  r = verify({});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("NOT RECORDED: the run was not recorded"));
  ASSERT_EQ(sqlite3_exec(db, "ROLLBACK;", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  v = VerifyOwnLogits(*c, handle, 44, RunLabels{"lm", "c", "", ""});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->run_id, 2);
  EXPECT_EQ(v->record_error, "");
}

}  // namespace
}  // namespace logitd::testing

namespace logitd::testing {
namespace {

// logitctl validate --project: each golden case recorded as a run of
// operation "validation" (golden/NAME); a second run compared with main's
// latest is identical case by case; a baseline that is not there fails every
// case and records none; history labels without --project are usage errors.
TEST(HistoryTest, LogitctlValidateRecordsTheGoldenCasesOnTheServer) {
  TempDir dir;
  absl::StatusOr<ServerProcess> server =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--history=" + (dir / "h.sqlite3")});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string at = "--server=" + server->address();
  const auto validate = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args = {at, "validate", "golden", "--quick", "--project=lm"};
    args.insert(args.end(), more.begin(), more.end());
    return RunLogitctl(args);
  };
  LogitctlRun r = validate({"--branch=main", "--ref=r1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("recorded as run 1 of project lm"));
  std::unique_ptr<client::Client> c = Connect(*server);
  ListRunsArgs all;
  all.project = "lm";
  absl::StatusOr<client::ListRunsResult> runs = c->ListRuns(all);
  ASSERT_TRUE(runs.ok()) << runs.status();
  const std::size_t cases = runs->runs.size();
  ASSERT_GE(cases, 3u);
  for (const client::RunSummary& run : runs->runs) {
    EXPECT_EQ(run.operation, "validation");
    EXPECT_THAT(run.labels.case_name, ::testing::StartsWith("golden/"));
    EXPECT_EQ(run.verdict, "within_bounds");
    EXPECT_EQ(run.labels.ref, "r1");
  }

  r = validate({"--branch=pr", "--ref=r2", "--compare_branch=main"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::size_t identical = 0;
  for (std::size_t at_ = r.out.find("identical to run"); at_ != std::string::npos;
       at_ = r.out.find("identical to run", at_ + 1)) {
    ++identical;
  }
  EXPECT_EQ(identical, cases) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(main at r1)"));

  r = validate({"--compare_baseline=nothere"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("no recorded run of project 'lm'"));
  runs = c->ListRuns(all);
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(runs->runs.size(), 2 * cases);  // the refused run recorded nothing

  r = RunLogitctl({at, "validate", "golden", "--quick", "--branch=main"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("need --project P"));
  r = RunLogitctl({at, "validate", "integer_exact", "--quick", "--project=lm"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("apply to the golden suite"));
}

}  // namespace
}  // namespace logitd::testing
