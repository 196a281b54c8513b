// logitctl runs: the Verify runs the server recorded for this caller
// (ListRuns), newest first, as a table or JSON; and logitctl rules, a
// project's rules (ListRules, SetRules).
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, project, "", "runs: only the runs of this project; rules: the project");
ABSL_FLAG(std::string, case, "", "runs: only the runs of this case");
ABSL_FLAG(std::string, branch, "", "runs: only the runs of this branch");
ABSL_FLAG(std::int32_t, limit, 20, "runs: at most this many runs (1 to 1000)");
ABSL_FLAG(std::int64_t, before, 0, "runs: only runs older than this run id (0: from the newest)");
ABSL_FLAG(std::string, backend, "", "runs: only the runs judged on this backend (cpu, cuda)");
ABSL_FLAG(std::string, device, "", "runs: only the runs judged on this device (as runs prints it)");
ABSL_FLAG(
    std::string, since, "",
    "runs: only the runs recorded at or after this time (RFC 3339, e.g. 2026-12-01T00:00:00Z)");
ABSL_FLAG(std::string, until, "", "runs: only the runs recorded before this time (RFC 3339)");

namespace logitd::logitctl {
namespace {

std::string Time(std::int64_t unix_micros) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}

nlohmann::ordered_json RunJson(const client::RunSummary& r) {
  nlohmann::ordered_json j;
  j["run_id"] = r.run_id;
  j["project"] = r.labels.project;
  j["case"] = r.labels.case_name;
  j["branch"] = r.labels.branch;
  j["ref"] = r.labels.ref;
  j["operation"] = r.operation;
  j["inputs_xxh3"] = Hex64(r.inputs_xxh3);
  j["verdict"] = r.verdict;
  j["backend"] = r.backend;
  j["device"] = r.device;
  j["logitd_version"] = r.logitd_version;
  j["libraries"] = r.libraries;
  j["recorded_at"] = Time(r.recorded_unix_micros);
  nlohmann::ordered_json cands = nlohmann::ordered_json::array();
  for (const client::CandidateSummary& c : r.candidates) {
    nlohmann::ordered_json cj;
    cj["name"] = c.name;
    cj["verdict"] = c.verdict;
    cj["xxh3"] = Hex64(c.xxh3);
    cj["elements"] = c.elements;
    cj["outside_bound"] = c.outside_bound;
    cj["worst_bound_fraction"] = c.worst_bound_fraction;
    cj["bitwise_equal_fraction"] = c.bitwise_equal_fraction;
    cj["max_ulp"] = c.max_ulp;
    cj["p99_ulp"] = c.p99_ulp;
    cj["rms_ratio"] = c.rms_ratio;
    cj["effective_bits"] = c.effective_bits;
    cands.push_back(std::move(cj));
  }
  j["candidates"] = std::move(cands);
  nlohmann::ordered_json alerts = nlohmann::ordered_json::array();
  for (const client::Alert& a : r.alerts) {
    alerts.push_back({{"rule", a.rule}, {"candidate", a.candidate}, {"message", a.message}});
  }
  j["alerts"] = std::move(alerts);
  j["baseline_run_id"] = r.baseline_run_id;
  return j;
}

// logitctl runs show RUN: one run's labels, platform, candidates, the run
// it was compared with and its alerts; as JSON with --json.
int ShowRun(client::Client& c, std::int64_t id) {
  client::ListRunsArgs args;
  args.run_id = id;
  absl::StatusOr<client::ListRunsResult> got = c.ListRuns(args);
  if (!got.ok()) return ServerError(got.status());
  if (got->runs.empty()) {
    return ServerError(
        absl::NotFoundError(absl::StrCat("no recorded run ", id, " for this caller")));
  }
  const client::RunSummary& r = got->runs.front();
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << RunJson(r).dump(1) << "\n";
    return kExitOk;
  }
  std::cout << "run " << r.run_id << ": " << r.verdict << "\n  project " << r.labels.project
            << ", case " << r.labels.case_name << ", branch "
            << (r.labels.branch.empty() ? "-" : r.labels.branch) << ", ref "
            << (r.labels.ref.empty() ? "-" : r.labels.ref) << "\n  " << r.operation
            << ", inputs_xxh3 " << Hex64(r.inputs_xxh3) << ", " << r.backend << " " << r.device
            << ", logitd " << r.logitd_version << ", recorded " << Time(r.recorded_unix_micros)
            << " UTC\n";
  if (!r.libraries.empty()) std::cout << "  " << r.libraries << "\n";
  if (r.baseline_run_id > 0) std::cout << "  compared with run " << r.baseline_run_id << "\n";
  std::vector<std::vector<std::string>> rows = {{"CANDIDATE", "VERDICT", "XXH3", "ELEMENTS",
                                                 "OUTSIDE", "WORST", "BITWISE", "MAX ULP",
                                                 "P99 ULP", "EFF BITS"}};
  for (const client::CandidateSummary& cs : r.candidates) {
    rows.push_back({cs.name, cs.verdict, Hex64(cs.xxh3), absl::StrCat(cs.elements),
                    absl::StrCat(cs.outside_bound),
                    absl::StrFormat("%.4g", cs.worst_bound_fraction),
                    absl::StrFormat("%.4g", cs.bitwise_equal_fraction), absl::StrCat(cs.max_ulp),
                    absl::StrCat(cs.p99_ulp),
                    cs.effective_bits == 0 ? "-" : absl::StrFormat("%.2f", cs.effective_bits)});
  }
  PrintTable(rows);
  for (const client::Alert& a : r.alerts) {
    std::cout << "ALERT: " << a.rule << ": " << a.message << "\n";
  }
  return kExitOk;
}

}  // namespace

namespace {

// logitctl runs projects | runs cases --project=P: a table, or --json.
int ListProjectsOrCases(bool cases) {
  const std::string project = absl::GetFlag(FLAGS_project);
  if (cases && project.empty()) return UsageError("runs cases: needs --project=P");
  return WithClient([&](client::Client& c) {
    std::vector<std::vector<std::string>> rows;
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    if (cases) {
      absl::StatusOr<std::vector<client::CaseSummary>> got = c.ListCases(project);
      if (!got.ok()) return ServerError(got.status());
      rows.push_back(
          {"CASE", "RUNS", "ALERTS", "LATEST RUN", "RECORDED (UTC)", "VERDICT", "BRANCH", "REF"});
      for (const client::CaseSummary& s : *got) {
        rows.push_back({s.case_name, absl::StrCat(s.runs), absl::StrCat(s.alerts),
                        absl::StrCat(s.latest_run_id), Time(s.latest_unix_micros), s.latest_verdict,
                        s.latest_branch.empty() ? "-" : s.latest_branch,
                        s.latest_ref.empty() ? "-" : s.latest_ref});
        j.push_back({{"case", s.case_name},
                     {"runs", s.runs},
                     {"alerts", s.alerts},
                     {"latest_run_id", s.latest_run_id},
                     {"latest_recorded_at", Time(s.latest_unix_micros)},
                     {"latest_verdict", s.latest_verdict},
                     {"latest_branch", s.latest_branch},
                     {"latest_ref", s.latest_ref}});
      }
    } else {
      absl::StatusOr<std::vector<client::ProjectSummary>> got = c.ListProjects();
      if (!got.ok()) return ServerError(got.status());
      rows.push_back({"PROJECT", "CASES", "RUNS", "ALERTS", "LATEST (UTC)"});
      for (const client::ProjectSummary& s : *got) {
        rows.push_back({s.project, absl::StrCat(s.cases), absl::StrCat(s.runs),
                        absl::StrCat(s.alerts), Time(s.latest_unix_micros)});
        j.push_back({{"project", s.project},
                     {"cases", s.cases},
                     {"runs", s.runs},
                     {"alerts", s.alerts},
                     {"latest_recorded_at", Time(s.latest_unix_micros)}});
      }
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::cout << j.dump(1) << "\n";
    } else {
      PrintTable(rows);
    }
    return kExitOk;
  });
}

// logitctl runs: the runs its flags select, a table or --json.
int ListRunsCommand() {
  const std::int32_t limit = absl::GetFlag(FLAGS_limit);
  if (limit < 1 || limit > 1000) {
    return UsageError(absl::StrCat("--limit: expected 1 to 1000, got ", limit));
  }
  client::ListRunsArgs args;
  for (const auto& [name, flag, out] :
       {std::tuple{"since", absl::GetFlag(FLAGS_since), &args.recorded_after_unix_micros},
        std::tuple{"until", absl::GetFlag(FLAGS_until), &args.recorded_before_unix_micros}}) {
    if (flag.empty()) continue;
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, flag, &t, &err)) {
      return UsageError(absl::StrCat("--", name, ": expected an RFC 3339 time such as ",
                                     "2026-12-01T00:00:00Z, got '", flag, "'"));
    }
    *out = absl::ToUnixMicros(t);
  }
  args.backend = absl::GetFlag(FLAGS_backend);
  args.device = absl::GetFlag(FLAGS_device);
  args.project = absl::GetFlag(FLAGS_project);
  args.case_name = absl::GetFlag(FLAGS_case);
  args.branch = absl::GetFlag(FLAGS_branch);
  args.page_size = limit;
  args.before_run_id = absl::GetFlag(FLAGS_before);
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::ListRunsResult> runs = c.ListRuns(args);
    if (!runs.ok()) return ServerError(runs.status());
    if (absl::GetFlag(FLAGS_json)) {
      nlohmann::ordered_json j;
      j["runs"] = nlohmann::ordered_json::array();
      for (const client::RunSummary& r : runs->runs) j["runs"].push_back(RunJson(r));
      j["next_before"] = runs->next_before_run_id;
      std::cout << j.dump(1) << "\n";
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows = {{"RUN", "RECORDED (UTC)", "PROJECT", "CASE",
                                                   "BRANCH", "REF", "OPERATION", "VERDICT",
                                                   "CANDIDATES", "DEVICE"}};
    for (const client::RunSummary& r : runs->runs) {
      std::string cands;
      for (const client::CandidateSummary& cs : r.candidates) {
        absl::StrAppend(&cands, cands.empty() ? "" : " ", cs.name, ":", cs.verdict);
      }
      rows.push_back({absl::StrCat(r.run_id), Time(r.recorded_unix_micros), r.labels.project,
                      r.labels.case_name, r.labels.branch.empty() ? "-" : r.labels.branch,
                      r.labels.ref.empty() ? "-" : r.labels.ref, r.operation, r.verdict, cands,
                      absl::StrCat(r.backend, " ", r.device)});
    }
    PrintTable(rows);
    if (runs->next_before_run_id > 0) {
      std::cout << "more: --before=" << runs->next_before_run_id << "\n";
    }
    return kExitOk;
  });
}

}  // namespace

int CmdRuns(const std::vector<std::string>& words) {
  if (words.size() >= 2 && words[1] == "promote") {
    std::int64_t run = 0;
    if (words.size() != 4 || !absl::SimpleAtoi(words[2], &run) || run <= 0) {
      return UsageError("usage: runs promote RUN NAME (RUN: a run id from `logitctl runs`)");
    }
    return WithClient([&](client::Client& c) {
      if (absl::Status s = c.PromoteRun(run, words[3]); !s.ok()) return ServerError(s);
      std::cout << "run " << run << " is baseline '" << words[3] << "' of its project and case\n";
      return kExitOk;
    });
  }
  if (words.size() >= 2 && words[1] == "show") {
    std::int64_t run = 0;
    if (words.size() != 3 || !absl::SimpleAtoi(words[2], &run) || run <= 0) {
      return UsageError("usage: runs show RUN (RUN: a run id from `logitctl runs`)");
    }
    return WithClient([&](client::Client& c) { return ShowRun(c, run); });
  }
  if (words.size() >= 2 && words[1] == "delete-project") {
    if (words.size() != 3) return UsageError("usage: runs delete-project PROJECT");
    return WithClient([&](client::Client& c) {
      absl::StatusOr<std::int64_t> runs = c.DeleteProject(words[2]);
      if (!runs.ok()) return ServerError(runs.status());
      std::cout << "project " << words[2] << " removed: " << *runs << " run"
                << (*runs == 1 ? "" : "s") << ", its baselines and rules\n";
      return kExitOk;
    });
  }
  if (words.size() == 2 && (words[1] == "projects" || words[1] == "cases")) {
    return ListProjectsOrCases(words[1] == "cases");
  }
  if (words.size() != 1) {
    return UsageError(
        "runs takes no arguments (its filters are flags), or: runs projects, runs cases "
        "--project=P, runs show RUN, runs promote RUN NAME, runs delete-project PROJECT");
  }
  return ListRunsCommand();
}

namespace {

// "CHECK[=LIMIT] [case=C] [branch=B] [candidate=Y]" as a rule.
absl::StatusOr<client::HistoryRule> ParseRule(const std::string& text) {
  client::HistoryRule rule;
  const std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("rule '", text, "': ", why));
  };
  if (words.empty()) return bad("empty");
  const std::vector<std::string> check = absl::StrSplit(words[0], absl::MaxSplits('=', 1));
  if (check[0] == "bits_unchanged" && check.size() == 1) {
    rule.check = client::HistoryRule::Check::kBitsUnchanged;
  } else if (check[0] == "max_worst_fraction_growth" && check.size() == 2 &&
             absl::SimpleAtod(check[1], &rule.limit)) {
    rule.check = client::HistoryRule::Check::kMaxWorstFractionGrowth;
  } else if (check[0] == "max_p99_ulp" && check.size() == 2 &&
             absl::SimpleAtod(check[1], &rule.limit)) {
    rule.check = client::HistoryRule::Check::kMaxP99Ulp;
  } else {
    return bad("expected bits_unchanged, max_worst_fraction_growth=F or max_p99_ulp=N first");
  }
  for (std::size_t i = 1; i < words.size(); ++i) {
    const std::vector<std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    std::string* field = kv[0] == "case"        ? &rule.case_name
                         : kv[0] == "branch"    ? &rule.branch
                         : kv[0] == "candidate" ? &rule.candidate
                                                : nullptr;
    if (field == nullptr || kv.size() != 2) {
      return bad(absl::StrCat("'", words[i], "': expected case=C, branch=B or candidate=Y"));
    }
    *field = kv[1];
  }
  return rule;
}

std::string RuleText(const client::HistoryRule& r) {
  std::string text = r.check == client::HistoryRule::Check::kBitsUnchanged ? "bits_unchanged"
                     : r.check == client::HistoryRule::Check::kMaxWorstFractionGrowth
                         ? absl::StrCat("max_worst_fraction_growth=", r.limit)
                         : absl::StrCat("max_p99_ulp=", r.limit);
  if (!r.case_name.empty()) absl::StrAppend(&text, " case=", r.case_name);
  if (!r.branch.empty()) absl::StrAppend(&text, " branch=", r.branch);
  if (!r.candidate.empty()) absl::StrAppend(&text, " candidate=", r.candidate);
  return text;
}

}  // namespace

int CmdRules(const std::vector<std::string>& words) {
  const std::string project = absl::GetFlag(FLAGS_project);
  if (project.empty()) return UsageError("rules: --project=P names the project");
  const bool set = words.size() >= 2 && words[1] == "set";
  if (!set && words.size() != 1) {
    return UsageError("usage: rules --project=P, or rules set --project=P [RULE ...]");
  }
  std::vector<client::HistoryRule> rules;
  for (std::size_t i = 2; set && i < words.size(); ++i) {
    absl::StatusOr<client::HistoryRule> rule = ParseRule(words[i]);
    if (!rule.ok()) return UsageError(std::string(rule.status().message()));
    rules.push_back(*std::move(rule));
  }
  return WithClient([&](client::Client& c) {
    if (set) {
      if (absl::Status s = c.SetRules(project, rules); !s.ok()) return ServerError(s);
      std::cout << "project " << project << " has " << rules.size() << " rule"
                << (rules.size() == 1 ? "" : "s") << "\n";
      return kExitOk;
    }
    absl::StatusOr<std::vector<client::HistoryRule>> listed = c.ListRules(project);
    if (!listed.ok()) return ServerError(listed.status());
    for (const client::HistoryRule& r : *listed) std::cout << RuleText(r) << "\n";
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
