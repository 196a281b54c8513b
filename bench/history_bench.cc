// The history's costs against issue 50's limits, on a fresh SQLite file or
// on a PostgreSQL database (--store=postgresql://…; the bench's project is
// removed from it first):
//   - recording a run as a recording Verify does after its verdict: the
//     project's rules read, the baseline run looked up (the branch's latest),
//     the alerts evaluated, the run and its candidates written in one
//     transaction (p50 and p99 over --runs runs of --candidates each);
//   - the store's growth per recorded candidate (the file after the WAL's
//     checkpoint, or PostgreSQL's pg_database_size, over the runs recorded;
//     each candidate with its 64 block digests);
//   - the pages of a case with --case_runs runs: the case page (its plots
//     read the newest 1,000), the project page and the projects page
//     (median of 5 renders each).
// Prints a table of each figure against its limit.
//
//   logitd_history_bench [--runs=2000] [--candidates=4] [--case_runs=10000]
//                        [--store=postgresql://USER@HOST:PORT/DB]
#include <unistd.h>
#if LOGITD_HAVE_LIBPQ
#include <libpq-fe.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/history/dashboard.h"
#include "server/history/history_store.h"
#include "server/history/rules.h"

namespace {

using logitd::history::HistoryStore;
using logitd::history::RunRecord;
using Clock = std::chrono::steady_clock;

long Flag(int argc, char** argv, const std::string& name, long fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return std::strtol(a.c_str() + prefix.size(), nullptr, 10);
  }
  return fallback;
}

std::string StringFlag(int argc, char** argv, const std::string& name) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return "";
}

RunRecord MakeRun(const std::string& case_name, long i, long candidates) {
  RunRecord r;
  r.tenant = "bench";
  r.labels = {"lm-head", case_name, i % 3 ? "main" : "dev", "ref" + std::to_string(i)};
  r.operation = "VERIFY_CROSS_ENTROPY";
  r.inputs_xxh3 = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(i + 1);
  r.verdict = "within_bounds";
  r.backend = "cuda";
  r.device = "NVIDIA H200";
  r.logitd_version = "0.1.0";
  const char* names[] = {"loss", "lse", "dx", "dw", "y", "logprob"};
  for (long c = 0; c < candidates; ++c) {
    logitd::history::CandidateFigures f;
    f.name = names[c % 6];
    f.verdict = "within_bounds";
    f.xxh3 = r.inputs_xxh3 ^ static_cast<std::uint64_t>(c);
    f.elements = 4096L * 4096;
    f.worst_bound_fraction = 0.01 * static_cast<double>((i * 7 + c) % 50);
    f.bitwise_equal_fraction = 0.9;
    f.max_ulp = (i + c) % 5;
    f.p99_ulp = (i + c) % 3;
    f.rms_ratio = 0.8;
    f.effective_bits = 23.5;
    // 4,096 rows in 64 blocks: a digest each, as Verify keeps them.
    f.block_rows = 64;
    for (std::uint64_t b = 0; b < 64; ++b) f.block_digests.push_back(f.xxh3 * 31 + b);
    r.candidates.push_back(f);
  }
  return r;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

double MedianMs(const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return Percentile(t, 0.5);
}

std::uintmax_t FileBytes(const std::string& path) {
  std::uintmax_t total = 0;
  if (logitd::history::sql::IsPostgresUri(path)) {
#if LOGITD_HAVE_LIBPQ
    // Table, index and TOAST files (the WAL apart, as SQLite's after its
    // checkpoint); a CHECKPOINT first so that the sizes are on disk.
    PGconn* conn = PQconnectdb(path.c_str());
    PQclear(PQexec(conn, "CHECKPOINT"));
    PGresult* r = PQexec(conn, "SELECT pg_database_size(current_database())");
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
      total = std::strtoull(PQgetvalue(r, 0, 0), nullptr, 10);
    PQclear(r);
    PQfinish(conn);
#endif
    return total;
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    const std::uintmax_t n = std::filesystem::file_size(path + suffix, ec);
    if (!ec) total += n;
  }
  return total;
}

// A figure against its limit (0: none stated).
void Row(const char* what, double value, const char* unit, double limit) {
  if (limit == 0) {
    std::printf("| %-53s | %10.3f %-3s | %12s | %5s |\n", what, value, unit, "-", "-");
    return;
  }
  std::printf("| %-53s | %10.3f %-3s | %8.0f %-3s | %5.3f |\n", what, value, unit, limit, unit,
              value / limit);
}

}  // namespace

int main(int argc, char** argv) {
  const long runs = Flag(argc, argv, "runs", 2000);
  const long candidates = Flag(argc, argv, "candidates", 4);
  const long case_runs = Flag(argc, argv, "case_runs", 10000);
  char dir[] = "/tmp/logitd-history-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 2;
  const std::string store_flag = StringFlag(argc, argv, "store");
  const std::string path = store_flag.empty() ? std::string(dir) + "/h.sqlite3" : store_flag;
  auto opened = HistoryStore::Open(path);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", std::string(opened.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<HistoryStore> owned = *std::move(opened);
  HistoryStore* store_ptr = owned.get();
  (void)store_ptr->DeleteProject("bench", "lm-head");  // a PostgreSQL database used before
  std::vector<logitd::history::Rule> rules(3);
  rules[0].check = logitd::history::Rule::Check::kBitsUnchanged;
  rules[0].branch = "main";
  rules[1].check = logitd::history::Rule::Check::kMaxWorstFractionGrowth;
  rules[1].limit = 2;
  rules[2].check = logitd::history::Rule::Check::kMaxP99Ulp;
  rules[2].limit = 4;
  if (!store_ptr->SetRules("bench", "lm-head", rules).ok()) return 1;

  // Recording, as history_handlers.cc's Record does it.
  std::vector<double> record_us;
  const std::uintmax_t empty_bytes = FileBytes(path);
  for (long i = 0; i < runs; ++i) {
    RunRecord run = MakeRun("recorded", i, candidates);
    const auto start = Clock::now();
    auto kept = store_ptr->Rules(run.tenant, run.labels.project);
    logitd::history::RunFilter f;
    f.tenant = run.tenant;
    f.project = run.labels.project;
    f.case_name = run.labels.case_name;
    f.branch = "main";
    f.limit = 1;
    auto base = store_ptr->List(f);
    if (!kept.ok() || !base.ok()) return 1;
    logitd::history::RunBaseline baseline;
    if (!base->empty()) {
      baseline.run_id = base->front().id;
      for (const auto& c : base->front().candidates) {
        baseline.candidates[c.name] = {
            c.xxh3 == run.candidates[0].xxh3 ? "identical" : "different_within_bounds",
            c.worst_bound_fraction};
      }
    }
    run.alerts = logitd::history::Evaluate(*kept, run, base->empty() ? nullptr : &baseline);
    if (!store_ptr->Record(&run).ok()) return 1;
    record_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  // Closed, the WAL is checkpointed into the file and removed.
  owned.reset();
  const double bytes_per_candidate =
      static_cast<double>(FileBytes(path) - empty_bytes) / static_cast<double>(runs * candidates);
  opened = HistoryStore::Open(path);
  if (!opened.ok()) return 1;
  owned = *std::move(opened);
  store_ptr = owned.get();

  // A case of case_runs runs, for its pages.
  for (long i = 0; i < case_runs; ++i) {
    RunRecord run = MakeRun("paged", i, 2);
    if (!store_ptr->Record(&run).ok()) return 1;
  }
  const std::map<std::string, std::string> q = {{"project", "lm-head"}, {"case", "paged"}};
  std::size_t case_bytes = 0;
  const double case_ms = MedianMs([&] {
    case_bytes =
        logitd::history::RenderDashboard(*store_ptr, "bench", "/history/case", q).body.size();
  });
  const double project_ms = MedianMs(
      [&] { logitd::history::RenderDashboard(*store_ptr, "bench", "/history/project", q); });
  const double projects_ms =
      MedianMs([&] { logitd::history::RenderDashboard(*store_ptr, "bench", "/history", {}); });

  std::printf(
      "history store: %s, %ld runs of %ld candidates recorded, a case of %ld runs paged\n\n",
      store_ptr->location().c_str(), runs, candidates, case_runs);
  std::printf("| %-53s | %14s | %12s | ratio |\n|---|---|---|---|\n", "figure", "measured",
              "limit");
  Row("recording a run (rules, baseline, alerts, write): p50", Percentile(record_us, 0.5) / 1000,
      "ms", 2);
  Row("recording a run: p99", Percentile(record_us, 0.99) / 1000, "ms", 0);
  Row("store growth per recorded candidate", bytes_per_candidate, "B", 4096);
  Row("case page of a 10,000-run case (newest 1,000 plotted)", case_ms, "ms", 200);
  Row("project page", project_ms, "ms", 200);
  Row("projects page", projects_ms, "ms", 200);
  std::printf("\ncase page: %zu bytes\n", case_bytes);
  std::filesystem::remove_all(dir);
  return 0;
}
