#include "client/validate/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/common/connection_flags.h"
#include "client/validate/baseline.h"
#include "client/validate/command_line.h"
#include "client/validate/compare.h"
#include "client/validate/harness.h"
#include "client/validate/report.h"
#include "client/validate/report_html.h"
#include "client/validate/suites.h"
#include "logitd/client.h"
#include "logitd/status_macros.h"

// Defined by logitctl, which applies it before dispatching here.

namespace logitd::validate {
namespace {

constexpr int kExitUnreachable = 2;
// As for every logitctl subcommand: a run that cannot start for a reason of
// its own invocation is not a precision failure.
constexpr int kExitUsage = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "logitctl validate: %s\n", message.c_str());
  return kExitUsage;
}

// The requested suites in run order; all of them when none is named.
absl::StatusOr<std::vector<std::string>> SelectSuites(const std::vector<std::string>& requested) {
  const std::vector<std::string>& all = AllSuiteNames();
  for (const std::string& r : requested) {
    if (std::find(all.begin(), all.end(), r) == all.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown suite '", r, "'; suites: ", absl::StrJoin(all, ", ")));
    }
  }
  if (requested.empty()) return all;
  std::vector<std::string> selected;
  for (const std::string& name : all) {
    if (std::find(requested.begin(), requested.end(), name) != requested.end()) {
      selected.push_back(name);
    }
  }
  return selected;
}

// The same suites against `address` (B), compared with the first run (A:
// `a`, whose outputs are `a_outputs`). Not OK when B cannot be reached or
// stops answering during the run.
absl::StatusOr<CompareReport> CompareWith(const std::string& address, const Options& options,
                                          const Report& a,
                                          const std::vector<RecordedOutput>& a_outputs) {
  LOGITD_ASSIGN_OR_RETURN(client::ClientOptions connection, HarnessConnectionOptions());
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      client::Client::Create(address, std::move(connection));
  absl::StatusOr<client::ServerInfo> info =
      client.ok() ? (*client)->Info() : absl::StatusOr<client::ServerInfo>(client.status());
  if (!info.ok()) {
    return absl::UnavailableError(absl::StrCat("--compare: cannot use logitd at ", address, ": ",
                                               absl::StatusCodeToString(info.status().code()), ": ",
                                               info.status().message()));
  }
  std::vector<std::unique_ptr<Suite>> selected;
  for (const std::string& name : options.suites) selected.push_back(MakeSuite(name));
  RunContext ctx(client->get(), *info, options);
  OutputLog outputs;
  ctx.set_recorder(&outputs);
  std::unique_ptr<Progress> progress =
      isatty(STDERR_FILENO) != 0 ? MakeTerminalProgress() : MakeSilentProgress();
  RunOutcome outcome = RunSuites(ctx, selected, *progress);
  if (!outcome.fatal.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "--compare: logitd at ", address, " became unreachable or refused: ",
        absl::StatusCodeToString(outcome.fatal.code()), ": ", outcome.fatal.message()));
  }
  return CompareRuns(a.address, a_outputs, a.results, address, outputs.outputs(), outcome.results);
}

}  // namespace

// The flags logitctl applies for every subcommand, validate included: where
// the server is and how to reach it. The harness connects the same way.
constexpr absl::string_view kConnectionFlags[] = {"server",     "timeout", "chunk_bytes", "token",
                                                  "token_file", "ca",      "cert",        "key"};

// Looked up by name rather than declared, so that the harness follows
// logitctl's connection options without linking against each of them.
std::optional<bool> HostConnectionFlag(absl::string_view name) {
  if (std::find(std::begin(kConnectionFlags), std::end(kConnectionFlags), name) ==
      std::end(kConnectionFlags)) {
    return std::nullopt;
  }
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return std::nullopt;
  return flag->IsOfType<bool>();
}

// The connection logitctl's own commands use (its connection flags), on
// one server: a run compares what one server did, so it never spreads its
// calls over several (--lb).
absl::StatusOr<client::ClientOptions> HarnessConnectionOptions() {
  LOGITD_ASSIGN_OR_RETURN(client::ClientOptions o, client::ClientOptionsFromFlags());
  o.lb_policy = "pick_first";
  return o;
}

absl::StatusOr<std::unique_ptr<client::Client>> ConnectForReport(Report* report,
                                                                 absl::string_view program) {
  LOGITD_ASSIGN_OR_RETURN(client::ClientOptions options, HarnessConnectionOptions());
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      client::Client::Create(report->address, std::move(options));
  absl::StatusOr<client::ServerInfo> info =
      client.ok() ? (*client)->Info() : absl::StatusOr<client::ServerInfo>(client.status());
  if (!info.ok()) {
    report->error =
        absl::StrCat("cannot use logitd at ", report->address, ": ",
                     absl::StatusCodeToString(info.status().code()), ": ", info.status().message());
    std::fprintf(stderr, "%s: %s\n", std::string(program).c_str(), report->error.c_str());
    return info.status();
  }
  report->have_info = true;
  report->info = *std::move(info);
  return client;
}

namespace {

// --project and its labels, and the run to compare with: usage errors for
// labels without a project and for more than one --compare_*.
absl::Status ReadHistoryOptions(const ValidateArgs& parsed, Options* options) {
  const int compares = !parsed.compare_branch.empty() + !parsed.compare_ref.empty() +
                       !parsed.compare_baseline.empty();
  if (parsed.project.empty()) {
    if (!parsed.branch.empty() || !parsed.ref.empty() || compares > 0) {
      return absl::InvalidArgumentError(
          "--branch, --ref and --compare_* label a run of the server's history: they need "
          "--project P");
    }
    return absl::OkStatus();
  }
  if (compares > 1) {
    return absl::InvalidArgumentError(
        "at most one of --compare_branch, --compare_ref and --compare_baseline");
  }
  options->history = client::RunLabels{parsed.project, "", parsed.branch, parsed.ref};
  if (compares == 1) {
    options->history_compare =
        client::BaselineSelector{parsed.compare_branch, parsed.compare_ref, 0,
                                 parsed.compare_baseline, parsed.compare_missing == "record"};
  }
  return absl::OkStatus();
}

// The run's options from the parsed arguments, and the combinations that
// make no sense refused before any work (a missing or broken baseline
// included).
absl::Status ReadOptions(const ValidateArgs& parsed, Options* options) {
  options->quick = parsed.quick;
  options->seed = parsed.seed;
  options->baseline_path = parsed.baseline_path;
  options->record_path = parsed.record_path;
  options->allow_other_platform = parsed.allow_other_platform;
  options->suites_explicit = !parsed.suites.empty();
  LOGITD_ASSIGN_OR_RETURN(options->suites, SelectSuites(parsed.suites));
  const bool golden =
      std::find(options->suites.begin(), options->suites.end(), "golden") != options->suites.end();
  const bool baseline = !options->baseline_path.empty();
  const bool record = !options->record_path.empty();
  LOGITD_RETURN_IF_ERROR(ReadHistoryOptions(parsed, options));
  const bool history = options->history.has_value();
  if (baseline && record) {
    return absl::InvalidArgumentError("--baseline and --record exclude each other");
  }
  if (golden && options->suites_explicit && !baseline && !record && !history) {
    return absl::InvalidArgumentError(
        "the golden suite needs --baseline FILE (compare), --record FILE (make one) or "
        "--project P (the server's history)");
  }
  if ((baseline || record || history) && !golden) {
    return absl::InvalidArgumentError(
        "--baseline, --record and --project apply to the golden suite, which is not selected");
  }
  if (baseline) LOGITD_RETURN_IF_ERROR(ReadBaseline(options->baseline_path).status());
  return absl::OkStatus();
}

}  // namespace

int RunValidateCommand(const std::string& server, const std::vector<std::string>& args) {
  const absl::Time start = absl::Now();
  Report report;
  report.started_at = absl::FormatTime(absl::RFC3339_sec, start, absl::UTCTimeZone());
  report.address = server;

  absl::StatusOr<ValidateArgs> parsed = ParseValidateArgs(args, HostConnectionFlag);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  if (parsed->help) {
    std::fputs(ValidateUsage().c_str(), stdout);
    return 0;
  }
  Options& options = report.options;
  if (absl::Status s = ReadOptions(*parsed, &options); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (report.address.empty()) return UsageError("no server address: pass --server HOST:PORT");
  if (!parsed->report_dir.empty()) {
    // An unusable report directory is found before any work is done.
    const absl::Status s = PrepareReportDir(parsed->report_dir);
    if (!s.ok()) return UsageError(std::string(s.message()));
  }

  auto finish = [&](int code) {
    report.exit_code = code;
    report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::fputs(SummaryText(report).c_str(), stdout);
    std::fflush(stdout);
    return WriteReportFiles(report, parsed->json_path, parsed->junit_path, parsed->report_dir,
                            "logitctl validate");
  };

  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectForReport(&report, "logitctl validate");
  if (!client.ok()) {
    if (report.error.empty()) return UsageError(std::string(client.status().message()));
    return finish(kExitUnreachable);
  }

  const bool tty = isatty(STDERR_FILENO) != 0;
  if (tty) {
    std::fprintf(stderr, "validating logitd %s at %s (backend %s, device '%s'): %s%s\n",
                 report.info.version.c_str(), report.address.c_str(), report.info.backend.c_str(),
                 report.info.device_name.c_str(), absl::StrJoin(options.suites, ", ").c_str(),
                 options.quick ? " (quick)" : "");
  }
  std::vector<std::unique_ptr<Suite>> selected;
  for (const std::string& name : options.suites) selected.push_back(MakeSuite(name));
  RunContext ctx(client->get(), report.info, options);
  OutputLog outputs;
  if (!parsed->compare_address.empty()) ctx.set_recorder(&outputs);
  std::unique_ptr<Progress> progress = tty ? MakeTerminalProgress() : MakeSilentProgress();
  RunOutcome outcome = RunSuites(ctx, selected, *progress);
  report.results = std::move(outcome.results);
  report.detail_tables = std::move(outcome.detail_tables);
  const bool unreachable = !outcome.fatal.ok();
  if (unreachable) {
    report.error = absl::StrCat(
        "the run stopped: logitd at ", report.address,
        " became unreachable or refused: ", absl::StatusCodeToString(outcome.fatal.code()), ": ",
        outcome.fatal.message());
    std::fprintf(stderr, "logitctl validate: %s\n", report.error.c_str());
  }
  int code = ExitCodeFor(report.results, unreachable);
  if (!parsed->compare_address.empty() && !unreachable) {
    absl::StatusOr<CompareReport> compared =
        CompareWith(parsed->compare_address, options, report, outputs.outputs());
    if (!compared.ok()) {
      report.error = std::string(compared.status().message());
      std::fprintf(stderr, "logitctl validate: %s\n", report.error.c_str());
      return finish(kExitUnreachable);
    }
    report.compare_text = CompareText(*compared);
    report.compare = CompareJson(*compared);
    code = std::max(code, compared->exit_code);
  }
  return finish(code);
}

}  // namespace logitd::validate
