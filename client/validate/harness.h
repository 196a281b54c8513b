// The harness's moving parts: case results and verdicts, the context suites
// share (client, server info, options, replayable first requests), and the
// runner that turns RPC failures into verdicts, or stops the run when the
// server cannot be reached.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "nlohmann/json.hpp"

namespace logitd::validate {

// CUTLASS-style verdict categories.
enum class Verdict { kPassed, kFailed, kNotRun };
// "passed", "FAILED", "not run".
absl::string_view VerdictName(Verdict verdict);

struct CaseResult {
  std::string suite;
  std::string name;
  Verdict verdict = Verdict::kNotRun;
  double seconds = 0;
  // Key figures in a few words, for the summary table.
  std::string summary;
  // Every figure the case measured, for --json.
  nlohmann::ordered_json figures = nlohmann::ordered_json::object();
  // One message per failed check.
  std::vector<std::string> failures;
  // Why the case did not run (verdict kNotRun).
  std::string note;
  bool skipped = false;

  // Records `what` as a failure unless `ok`; returns ok.
  bool Check(bool ok, absl::string_view what);
  // Marks the case as not run, with the reason.
  void Skip(absl::string_view why);
  std::string FullName() const { return suite + "/" + name; }
};

// Splits a case's wall time into phases (figures "seconds": {phase: s}), so a
// slow run says whether the server, the data or the reference took the time.
class PhaseTimer {
 public:
  explicit PhaseTimer(CaseResult* result);
  // Charges the time since the previous lap (or construction) to `phase`.
  void Lap(const char* phase);

 private:
  CaseResult* result_;
  std::int64_t last_ns_;
};

struct Options {
  bool quick = false;
  std::uint64_t seed = 1234;
  std::string baseline_path;
  std::string record_path;
  // Set: the golden cases are recorded in the server's history under these
  // labels (case_name: each case's), compared with `history_compare`.
  std::optional<client::RunLabels> history;
  std::optional<client::BaselineSelector> history_compare;
  bool allow_other_platform = false;
  // The selected suites in canonical order.
  std::vector<std::string> suites;
  // True when the user named the suites (rather than taking the default set).
  bool suites_explicit = false;
};

// Shapes of the seed's experiments: M tokens, V vocabulary rows and the
// reduction widths K; --quick shrinks V and the K set.
struct Shapes {
  std::int64_t m = 16;
  std::int64_t v = 32768;
  std::vector<std::int64_t> ks;
};
Shapes ShapesFor(const Options& options);

// A request that can be sent again, with the outputs of its first sending;
// the determinism suite replays one per suite and compares the bits.
struct Replay {
  std::string suite;
  std::string description;
  std::function<absl::StatusOr<std::vector<Tensor>>(client::Client&)> send;
  std::vector<Tensor> first;
};

// Where a run's outputs go when two servers are compared (see compare.h).
class OutputRecorder {
 public:
  virtual ~OutputRecorder() = default;
  virtual void Record(absl::string_view case_name, absl::string_view what, const Tensor& t) = 0;
};

class RunContext {
 public:
  RunContext(client::Client* client, client::ServerInfo info, Options options);

  // Outputs received from now on go to `recorder` (none when null).
  void set_recorder(OutputRecorder* recorder) { recorder_ = recorder; }
  // The case now running, as RunSuites sets it ("suite/case").
  void set_current_case(std::string name) { current_case_ = std::move(name); }
  // Records an output the current case received, named by `what` ("y fp32").
  void RecordOutput(absl::string_view what, const Tensor& t) {
    if (recorder_ != nullptr) recorder_->Record(current_case_, what, t);
  }

  client::Client& client() { return *client_; }
  const client::ServerInfo& info() const { return info_; }
  const Options& options() const { return options_; }

  // Keeps the first replay a suite offers and ignores later ones, so suites
  // may offer every request without tracking which came first.
  void OfferReplay(Replay replay);
  bool WantsReplay(absl::string_view suite) const;
  const Replay* FindReplay(absl::string_view suite) const;

 private:
  client::Client* client_;
  client::ServerInfo info_;
  Options options_;
  std::vector<Replay> replays_;
  OutputRecorder* recorder_ = nullptr;
  std::string current_case_;
};

// A weight registered for the length of a scope, released when it ends.
class ScopedWeight {
 public:
  static absl::StatusOr<ScopedWeight> Register(client::Client& client, const Tensor& weight,
                                               const std::string& name);
  ScopedWeight(ScopedWeight&& o) noexcept;
  ScopedWeight& operator=(ScopedWeight&& o) noexcept;
  ScopedWeight(const ScopedWeight&) = delete;
  ScopedWeight& operator=(const ScopedWeight&) = delete;
  ~ScopedWeight();

  const std::string& handle() const { return handle_; }

 private:
  ScopedWeight(client::Client* client, std::string handle)
      : client_(client), handle_(std::move(handle)) {}
  void Release();
  client::Client* client_ = nullptr;
  std::string handle_;
};

// Offers `suite` a replay of a Logits call: x against w with `options`, which
// gave y the first time. The replay registers w again, as "<suite>_replay".
void OfferLogitsReplay(RunContext& ctx, const std::string& suite, std::string description,
                       std::shared_ptr<const Tensor> x, std::shared_ptr<const Tensor> w,
                       const client::LogitsOptions& options, const Tensor& y);

struct Case {
  std::string name;
  // Runs the checks into the result. A non-OK status means a call failed:
  // the case fails, or the run stops when the server is unreachable.
  std::function<absl::Status(RunContext&, CaseResult&)> run;
};

class Suite {
 public:
  virtual ~Suite() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Case> Cases(const Options& options) = 0;
  // Called once after the suite's last case with its results.
  virtual void Finish(RunContext& ctx, std::vector<CaseResult>& results) {}
  // A suite-specific table printed before the summary; empty for none.
  virtual std::string DetailTable(const std::vector<CaseResult>& results) const { return ""; }
};

// Codes that mean the server cannot be reached or refuses this client; the
// run stops and logitctl exits 2.
bool IsServerUnreachable(const absl::Status& status);

// Prefixes a status message with context, keeping the code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Progress lines, one per case, for a terminal.
class Progress {
 public:
  virtual ~Progress() = default;
  virtual void Started(int index, int total, const CaseResult& result) = 0;
  virtual void Finished(int index, int total, const CaseResult& result) = 0;
};
std::unique_ptr<Progress> MakeTerminalProgress();  // writes to stderr
std::unique_ptr<Progress> MakeSilentProgress();

struct RunOutcome {
  std::vector<CaseResult> results;
  // Suite tables in run order.
  std::vector<std::string> detail_tables;
  // Not OK when the run stopped because the server went away.
  absl::Status fatal;
};

RunOutcome RunSuites(RunContext& ctx, const std::vector<std::unique_ptr<Suite>>& suites,
                     Progress& progress);

}  // namespace logitd::validate
