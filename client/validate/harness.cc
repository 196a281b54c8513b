#include "client/validate/harness.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/common/exit_codes.h"

namespace logitd::validate {

absl::string_view VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPassed:
      return "passed";
    case Verdict::kFailed:
      return "FAILED";
    case Verdict::kNotRun:
      return "not run";
  }
  return "?";
}

bool CaseResult::Check(bool ok, absl::string_view what) {
  if (!ok) failures.emplace_back(what);
  return ok;
}

void CaseResult::Skip(absl::string_view why) {
  skipped = true;
  note = std::string(why);
}

PhaseTimer::PhaseTimer(CaseResult* result)
    : result_(result), last_ns_(absl::GetCurrentTimeNanos()) {}

void PhaseTimer::Lap(const char* phase) {
  const std::int64_t now = absl::GetCurrentTimeNanos();
  nlohmann::ordered_json& seconds = result_->figures["seconds"];
  if (!seconds.is_object()) seconds = nlohmann::ordered_json::object();
  const double spent = static_cast<double>(now - last_ns_) * 1e-9;
  seconds[phase] = seconds.value(phase, 0.0) + spent;
  last_ns_ = now;
}

Shapes ShapesFor(const Options& options) {
  Shapes s;
  if (options.quick) {
    s.v = 4096;
    s.ks = {512, 4096};
  } else {
    s.v = 32768;
    s.ks = {512, 1024, 2048, 4096, 8192, 16384};
  }
  return s;
}

RunContext::RunContext(client::Client* client, client::ServerInfo info, Options options)
    : client_(client), info_(std::move(info)), options_(std::move(options)) {}

bool RunContext::WantsReplay(absl::string_view suite) const { return FindReplay(suite) == nullptr; }

void RunContext::OfferReplay(Replay replay) {
  if (!WantsReplay(replay.suite)) return;
  replays_.push_back(std::move(replay));
}

const Replay* RunContext::FindReplay(absl::string_view suite) const {
  for (const Replay& r : replays_) {
    if (r.suite == suite) return &r;
  }
  return nullptr;
}

absl::StatusOr<ScopedWeight> ScopedWeight::Register(client::Client& client, const Tensor& weight,
                                                    const std::string& name) {
  absl::StatusOr<client::WeightInfo> info = client.RegisterWeight(weight, name);
  if (!info.ok()) {
    return Annotate(info.status(),
                    absl::StrCat("RegisterWeight(", name, " ", ShapeString(weight.shape()), ")"));
  }
  return ScopedWeight(&client, info->handle);
}

ScopedWeight::ScopedWeight(ScopedWeight&& o) noexcept { *this = std::move(o); }

ScopedWeight& ScopedWeight::operator=(ScopedWeight&& o) noexcept {
  if (this != &o) {
    Release();
    client_ = o.client_;
    handle_ = std::move(o.handle_);
    o.handle_.clear();
  }
  return *this;
}

ScopedWeight::~ScopedWeight() { Release(); }

void ScopedWeight::Release() {
  // A failed release only leaves memory on the server until it restarts;
  // it says nothing about the numerics under test.
  if (client_ != nullptr && !handle_.empty())
    client_->ReleaseWeight(handle_).status().IgnoreError();
  handle_.clear();
}

void OfferLogitsReplay(RunContext& ctx, const std::string& suite, std::string description,
                       std::shared_ptr<const Tensor> x, std::shared_ptr<const Tensor> w,
                       const client::LogitsOptions& options, const Tensor& y) {
  if (!ctx.WantsReplay(suite)) return;
  Replay replay;
  replay.suite = suite;
  replay.description = std::move(description);
  replay.send = [x = std::move(x), w = std::move(w), options,
                 name = absl::StrCat(suite, "_replay")](
                    client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
    absl::StatusOr<ScopedWeight> again = ScopedWeight::Register(c, *w, name);
    if (!again.ok()) return again.status();
    absl::StatusOr<Tensor> out = c.Logits(*x, again->handle(), options);
    if (!out.ok()) return out.status();
    std::vector<Tensor> outs;
    outs.push_back(*std::move(out));
    return outs;
  };
  replay.first.push_back(y.Clone());
  ctx.OfferReplay(std::move(replay));
}

bool IsServerUnreachable(const absl::Status& status) {
  return exit_codes::IsServerUnreachable(status);
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

namespace {

class TerminalProgress final : public Progress {
 public:
  void Started(int index, int total, const CaseResult& result) override {
    std::fprintf(stderr, "[%*d/%d] %-40s running...", Width(total), index, total,
                 result.FullName().c_str());
    std::fflush(stderr);
  }
  void Finished(int index, int total, const CaseResult& result) override {
    // Overwrites the "running" line.
    std::fprintf(stderr, "\r\033[K[%*d/%d] %-40s %-7s %6.1f s  %s\n", Width(total), index, total,
                 result.FullName().c_str(), std::string(VerdictName(result.verdict)).c_str(),
                 result.seconds, result.summary.c_str());
    for (const std::string& f : result.failures) std::fprintf(stderr, "      %s\n", f.c_str());
    if (result.verdict == Verdict::kNotRun && !result.note.empty()) {
      std::fprintf(stderr, "      %s\n", result.note.c_str());
    }
    std::fflush(stderr);
  }

 private:
  static int Width(int total) { return static_cast<int>(absl::StrCat(total).size()); }
};

class SilentProgress final : public Progress {
 public:
  void Started(int, int, const CaseResult&) override {}
  void Finished(int, int, const CaseResult&) override {}
};

Verdict Decide(const CaseResult& r) {
  if (!r.failures.empty()) return Verdict::kFailed;
  if (r.skipped) return Verdict::kNotRun;
  return Verdict::kPassed;
}

}  // namespace

std::unique_ptr<Progress> MakeTerminalProgress() { return std::make_unique<TerminalProgress>(); }
std::unique_ptr<Progress> MakeSilentProgress() { return std::make_unique<SilentProgress>(); }

RunOutcome RunSuites(RunContext& ctx, const std::vector<std::unique_ptr<Suite>>& suites,
                     Progress& progress) {
  RunOutcome out;
  std::vector<std::vector<Case>> cases;
  int total = 0;
  for (const auto& suite : suites) {
    cases.push_back(suite->Cases(ctx.options()));
    total += static_cast<int>(cases.back().size());
  }

  int index = 0;
  for (std::size_t s = 0; s < suites.size(); ++s) {
    std::vector<CaseResult> results;
    for (Case& c : cases[s]) {
      CaseResult r;
      r.suite = suites[s]->name();
      r.name = c.name;
      ++index;
      if (!out.fatal.ok()) {
        r.Skip("not run: the server became unreachable earlier in the run");
        r.verdict = Verdict::kNotRun;
        results.push_back(std::move(r));
        continue;
      }
      progress.Started(index, total, r);
      ctx.set_current_case(r.FullName());
      const absl::Time start = absl::Now();
      absl::Status status;
      try {
        status = c.run(ctx, r);
      } catch (const std::exception& e) {
        // Allocation failures and library exceptions end the case, not the run.
        status = absl::InternalError(absl::StrCat("internal error: ", e.what()));
      }
      r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (!status.ok()) {
        r.failures.push_back(
            absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
        if (IsServerUnreachable(status)) out.fatal = status;
      }
      r.verdict = Decide(r);
      progress.Finished(index, total, r);
      results.push_back(std::move(r));
    }
    if (out.fatal.ok()) suites[s]->Finish(ctx, results);
    for (CaseResult& r : results) r.verdict = Decide(r);
    std::string table = suites[s]->DetailTable(results);
    if (!table.empty()) out.detail_tables.push_back(std::move(table));
    for (CaseResult& r : results) out.results.push_back(std::move(r));
  }
  return out;
}

}  // namespace logitd::validate
