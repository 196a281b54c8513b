// golden: the precision-regression gate. Fixed inputs (independent of --seed,
// generated with integer arithmetic so every client makes the same bytes)
// go through each kind of request; --record FILE keeps the outputs' digests,
// block digests and samples (whole values when small), --baseline FILE
// compares a later run bit for bit, on the same platform only.

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/validate/baseline.h"
#include "client/validate/golden_history.h"
#include "client/validate/random.h"
#include "client/validate/report.h"
#include "client/validate/suites.h"
#include "logitd/bf16.h"
#include "logitd/reference/bounds.h"

namespace logitd::validate {
namespace {

constexpr char kGoldenSuite[] = "golden";
// Golden inputs never follow --seed: a baseline must mean the same inputs.
constexpr std::uint64_t kGoldenSeed = 0x676f6c64656e0001ull;

struct Produced {
  std::uint64_t inputs_xxh3 = 0;
  std::vector<std::pair<std::string, Tensor>> outputs;
  // The GEMM configurations the server reported for the case's call.
  std::string gemms;
  // Each output against its fp64 reference and bound.
  std::vector<std::pair<std::string, BoundStats>> bounds;
};

std::string GemmsOf(const client::Timing& t) {
  return t.trailer.has_value() ? t.trailer->gemms : std::string();
}

std::uint64_t InputsDigest(absl::string_view what, std::initializer_list<const Tensor*> inputs) {
  std::string buf(what);
  for (const Tensor* t : inputs) {
    absl::StrAppend(&buf, "|", DTypeName(t->dtype()), ShapeString(t->shape()), ":", t->Digest());
  }
  return Xxh3(buf.data(), buf.size());
}

std::shared_ptr<Tensor> Bell(DType dtype, std::vector<std::int64_t> shape, absl::string_view name) {
  Rng rng = Rng::Stream(kGoldenSeed, name);
  return std::make_shared<Tensor>(PortableBell(dtype, std::move(shape), rng));
}

absl::StatusOr<std::vector<Tensor>> SendLogits(client::Client& c, const Tensor& x, const Tensor& w,
                                               DType out_dtype, std::string* gemms = nullptr) {
  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(c, w, "golden");
  if (!weight.ok()) return weight.status();
  client::LogitsOptions o;
  o.out_dtype = out_dtype;
  client::Timing timing;
  absl::StatusOr<Tensor> y = c.Logits(x, weight->handle(), o, &timing);
  if (gemms != nullptr) *gemms = GemmsOf(timing);
  if (!y.ok()) return Annotate(y.status(), absl::StrCat("Logits(", DTypeName(out_dtype), " out)"));
  std::vector<Tensor> out;
  out.push_back(*std::move(y));
  return out;
}

struct GoldenCase {
  std::string name;
  std::function<absl::StatusOr<Produced>(RunContext&)> produce;
};

GoldenCase LogitsCase(std::string name, std::int64_t v, std::int64_t k, DType out_dtype) {
  return {name, [name, v, k, out_dtype](RunContext& ctx) -> absl::StatusOr<Produced> {
            auto x = Bell(DType::kBf16, {16, k}, absl::StrCat("x", k));
            auto w = Bell(DType::kBf16, {v, k}, absl::StrCat("w", v, "x", k));
            std::string gemms;
            absl::StatusOr<std::vector<Tensor>> out =
                SendLogits(ctx.client(), *x, *w, out_dtype, &gemms);
            if (!out.ok()) return out.status();
            ctx.RecordOutput("y", (*out)[0]);
            if (ctx.WantsReplay(kGoldenSuite)) {
              Replay replay;
              replay.suite = kGoldenSuite;
              replay.description = absl::StrCat("golden ", name);
              replay.send = [x, w, out_dtype](client::Client& c) {
                return SendLogits(c, *x, *w, out_dtype);
              };
              replay.first.push_back((*out)[0].Clone());
              ctx.OfferReplay(std::move(replay));
            }
            Produced p;
            p.inputs_xxh3 =
                InputsDigest(absl::StrCat("logits ", DTypeName(out_dtype)), {x.get(), w.get()});
            p.bounds.emplace_back("y", CheckLogitsBounds(*x, *w, (*out)[0]));
            p.outputs.emplace_back("y", std::move((*out)[0]));
            p.gemms = std::move(gemms);
            return p;
          }};
}

GoldenCase BackwardCase() {
  return {"backward", [](RunContext& ctx) -> absl::StatusOr<Produced> {
            auto x = Bell(DType::kBf16, {16, 1024}, "x1024");
            auto w = Bell(DType::kBf16, {2048, 1024}, "w2048x1024");
            // Multiples of 2^-15 with up to 18 significant bits: the cast matters.
            auto dy = Bell(DType::kFp32, {16, 2048}, "dy16x2048");
            absl::StatusOr<ScopedWeight> weight =
                ScopedWeight::Register(ctx.client(), *w, "golden");
            if (!weight.ok()) return weight.status();
            client::BackwardOptions o;  // the defaults: dX bf16, dW fp32
            absl::StatusOr<client::BackwardResult> res =
                ctx.client().Backward(*dy, *x, weight->handle(), o);
            if (!res.ok()) return Annotate(res.status(), "Backward");
            if (!res->dx.has_value() || !res->dw.has_value()) {
              return absl::InternalError("Backward returned no dX or no dW");
            }
            ctx.RecordOutput("dx", *res->dx);
            ctx.RecordOutput("dw", *res->dw);
            Produced p;
            p.inputs_xxh3 = InputsDigest("backward", {dy.get(), x.get(), w.get()});
            p.bounds.emplace_back("dx", CheckGradInputBounds(*dy, *w, *res->dx));
            p.bounds.emplace_back("dw", CheckGradWeightBounds(*dy, *x, *res->dw));
            p.outputs.emplace_back("dx", *std::move(res->dx));
            p.outputs.emplace_back("dw", *std::move(res->dw));
            p.gemms = GemmsOf(res->timing);
            return p;
          }};
}

GoldenCase CastCase() {
  return {"cast", [](RunContext& ctx) -> absl::StatusOr<Produced> {
            auto in = Bell(DType::kFp32, {8192}, "cast8192");
            absl::StatusOr<Tensor> out = ctx.client().CastToBf16(*in);
            if (!out.ok()) return Annotate(out.status(), "Cast");
            ctx.RecordOutput("cast", *out);
            Produced p;
            p.inputs_xxh3 = InputsDigest("cast", {in.get()});
            // The cast is exact: its bound is 0 (round to nearest even).
            BoundStats exact;
            for (std::int64_t i = 0; i < in->numel(); ++i) {
              exact.Add(i, out->At(i), RoundToBf16(static_cast<float>(in->At(i))), 0.0);
            }
            p.bounds.emplace_back("output", exact);
            p.outputs.emplace_back("output", *std::move(out));
            return p;
          }};
}

class GoldenSuite final : public Suite {
 public:
  std::string name() const override { return kGoldenSuite; }

  std::vector<Case> Cases(const Options&) override {
    const std::vector<GoldenCase> golden = {
        LogitsCase("logits_fp32", 2048, 1024, DType::kFp32),
        LogitsCase("logits_bf16", 2048, 1024, DType::kBf16),
        LogitsCase("logits_fp32_k4096", 4096, 4096, DType::kFp32),
        BackwardCase(),
        CastCase(),
    };
    std::vector<Case> cases;
    for (const GoldenCase& g : golden) {
      cases.push_back(
          {g.name, [this, g](RunContext& ctx, CaseResult& r) { return Run(ctx, r, g); }});
    }
    return cases;
  }

  // Whether the bits just recorded or compared can be expected after a
  // restart: what a gate's operator must know before trusting it.
  std::string DetailTable(const std::vector<CaseResult>& results) const override {
    for (const CaseResult& r : results) {
      const std::string choices = r.figures.value("algo_choices", std::string());
      if (choices.empty()) continue;
      if (choices == "per_process") {
        return "golden: WARNING: this server chooses its GEMM algorithms anew in every process "
               "(algo_choices=per_process): a restarted server may run others and not match a "
               "baseline; run logitd without --algo_cache=none (see docs/OPERATIONS.md, \"Bits "
               "that survive restarts\")\n";
      }
      if (choices == "kept") {
        return absl::StrCat(
            "golden: this server keeps its GEMM algorithm choices across restarts in ",
            r.figures.value("algo_cache_path", std::string()),
            " (algo_choices=kept): a restarted server on this machine runs the same ones\n");
      }
      return absl::StrCat("golden: this server's algorithms are the same in every process (",
                          "algo_choices=", choices, ")\n");
    }
    return "";
  }

  void Finish(RunContext& ctx, std::vector<CaseResult>& results) override {
    if (ctx.options().history.has_value()) {
      RecordGoldenCases(ctx, std::move(validated_), results);
    }
    const std::string& path = ctx.options().record_path;
    if (path.empty()) return;
    for (CaseResult& r : results) {
      if (r.verdict == Verdict::kFailed) {
        for (CaseResult& other : results) {
          other.failures.push_back(
              absl::StrCat("baseline '", path, "' not written: case ", r.name, " failed"));
        }
        return;
      }
    }
    Baseline b;
    b.recorded_at = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
    b.server = {{"version", ctx.info().version},
                {"build_id", ctx.info().build_id},
                {"split_k", ctx.info().split_k},
                {"algo_choices", ctx.info().algo_choices},
                {"algo_cache_path", ctx.info().algo_cache_path}};
    b.platform = PlatformOf(ctx.info());
    b.cases = std::move(recorded_);
    const absl::Status s = WriteBaseline(path, b);
    for (CaseResult& r : results) {
      if (!s.ok()) r.failures.push_back(std::string(s.message()));
    }
  }

 private:
  absl::Status Run(RunContext& ctx, CaseResult& r, const GoldenCase& g) {
    absl::StatusOr<Produced> produced = g.produce(ctx);
    if (!produced.ok()) return produced.status();
    nlohmann::ordered_json digests;
    for (const auto& [name, t] : produced->outputs)
      digests[name] = absl::StrFormat("%016x", t.Digest());
    r.figures["inputs_xxh3"] = absl::StrFormat("%016x", produced->inputs_xxh3);
    r.figures["outputs_xxh3"] = digests;
    r.figures["algo_choices"] = ctx.info().algo_choices;
    if (!ctx.info().algo_cache_path.empty()) {
      r.figures["algo_cache_path"] = ctx.info().algo_cache_path;
    }

    // A golden result must keep the contract before its bits are worth
    // keeping; and when bits move, whether both sides keep it is the first
    // thing to know.
    const double worst = CheckBounds(r, g, *produced);
    const bool within = r.failures.empty();

    const Options& o = ctx.options();
    if (o.history.has_value()) {
      validated_.push_back(
          ValidatedCaseOf(g.name, produced->inputs_xxh3, produced->outputs, produced->bounds));
      if (o.record_path.empty() && o.baseline_path.empty()) {
        r.summary = "computed, not compared";  // the history's answer replaces it
        return absl::OkStatus();
      }
    }
    if (!o.record_path.empty()) {
      CaseRecord rec;
      rec.name = g.name;
      rec.inputs_xxh3 = produced->inputs_xxh3;
      rec.gemms = produced->gemms;
      rec.within_bounds = within;
      rec.worst_bound_fraction = worst;
      for (const auto& [name, t] : produced->outputs) rec.outputs.push_back(RecordOutput(name, t));
      recorded_.push_back(std::move(rec));
      r.summary = absl::StrCat("recorded to ", o.record_path);
      return absl::OkStatus();
    }
    if (o.baseline_path.empty()) {
      r.summary = "computed, not compared";
      r.Skip("no --baseline FILE to compare with (or --record FILE to make one)");
      return absl::OkStatus();
    }
    std::string difference;
    if (!BaselineUsable(ctx, r, &difference)) return absl::OkStatus();

    const CaseRecord* rec = baseline_->Find(g.name);
    if (!r.Check(rec != nullptr, absl::StrCat("case '", g.name, "' is not in baseline '",
                                              o.baseline_path, "': record a new baseline"))) {
      return absl::OkStatus();
    }
    if (!r.Check(rec->inputs_xxh3 == produced->inputs_xxh3,
                 absl::StrFormat("case '%s': the baseline's inputs (digest %016x) are not this "
                                 "harness's (%016x): it was recorded by another harness version",
                                 g.name, rec->inputs_xxh3, produced->inputs_xxh3))) {
      return absl::OkStatus();
    }
    if (!produced->gemms.empty()) r.figures["gemms"] = produced->gemms;
    const std::string why = WhyBitsMoved(ctx.info(), *rec, *produced, within, worst);
    const std::vector<std::string> parts = CompareOutputs(r, g, *rec, *produced, why);
    r.summary = absl::StrJoin(parts, ", ");
    if (!difference.empty()) absl::StrAppend(&r.summary, " (other platform)");
    return absl::OkStatus();
  }

  // Each output's bounds reported; the worst |error| as a fraction of its
  // bound over them.
  static double CheckBounds(CaseResult& r, const GoldenCase& g, const Produced& produced) {
    double worst = 0;
    for (const auto& [name, stats] : produced.bounds) {
      const Tensor* t = nullptr;
      for (const auto& [out_name, out] : produced.outputs) {
        if (out_name == name) t = &out;
      }
      ReportBounds(r, absl::StrCat(name, "_bounds").c_str(),
                   absl::StrCat("case '", g.name, "' output ", name),
                   t != nullptr ? t->shape() : std::vector<std::int64_t>{}, stats);
      worst = std::max(worst, stats.worst_fraction);
    }
    return worst;
  }

  // The baseline, read once, and whether its platform is this server's
  // (*difference says how it is not); false when the case ends here, its
  // failure recorded.
  bool BaselineUsable(RunContext& ctx, CaseResult& r, std::string* difference) {
    const Options& o = ctx.options();
    if (!baseline_.has_value()) {
      absl::StatusOr<Baseline> b = ReadBaseline(o.baseline_path);
      if (!b.ok()) {
        load_error_ = std::string(b.status().message());
        baseline_.emplace();
      } else {
        baseline_ = *std::move(b);
      }
    }
    if (!r.Check(load_error_.empty(), load_error_)) return false;
    *difference = PlatformDifference(baseline_->platform, PlatformOf(ctx.info()));
    if (difference->empty()) return true;
    r.figures["platform_difference"] = *difference;
    if (o.allow_other_platform) return true;
    r.Check(false, absl::StrCat("baseline '", o.baseline_path, "' was recorded on ",
                                PlatformString(baseline_->platform), ", this server is ",
                                PlatformString(PlatformOf(ctx.info())), " (", *difference,
                                "); bitwise results are only comparable on the same backend, "
                                "device and library versions. Record a baseline here with "
                                "--record, or pass --allow_other_platform to compare anyway"));
    return false;
  }

  // Each output against its record, bit for bit; the summary's parts.
  static std::vector<std::string> CompareOutputs(CaseResult& r, const GoldenCase& g,
                                                 const CaseRecord& rec, const Produced& produced,
                                                 const std::string& why) {
    std::vector<std::string> parts;
    for (const auto& [name, t] : produced.outputs) {
      const OutputRecord* out = nullptr;
      for (const OutputRecord& o2 : rec.outputs) {
        if (o2.name == name) out = &o2;
      }
      if (!r.Check(out != nullptr, absl::StrCat("case '", g.name, "': output '", name,
                                                "' is not in the baseline"))) {
        continue;
      }
      const OutputComparison c = CompareOutput(*out, t);
      r.figures[absl::StrCat(name, "_comparison")] = {{"equal", c.equal},
                                                      {"differing_elements", c.differing_elements},
                                                      {"differing_blocks", c.differing_blocks},
                                                      {"blocks", c.total_blocks},
                                                      {"sampled", c.sampled},
                                                      {"sampled_differing", c.sampled_differing},
                                                      {"max_ulp", c.max_ulp}};
      r.Check(c.equal, absl::StrCat("case '", g.name, "': ", c.message, why));
      if (c.equal) {
        parts.push_back(absl::StrCat(name, " equal"));
      } else if (c.differing_elements >= 0) {
        parts.push_back(
            absl::StrCat(name, " ", c.differing_elements, " differ, max ", c.max_ulp, " ulp"));
      } else {
        parts.push_back(
            absl::StrCat(name, " ", c.differing_blocks, "/", c.total_blocks, " blocks differ"));
      }
    }
    return parts;
  }

  // What a bitwise mismatch is likely due to, appended to its message: other
  // GEMM algorithms than at recording (naming both), why the server may
  // have chosen others, and whether both results keep their bounds.
  std::string WhyBitsMoved(const client::ServerInfo& info, const CaseRecord& rec,
                           const Produced& now, bool within, double worst) const {
    std::string why;
    const bool other_gemms = !rec.gemms.empty() && !now.gemms.empty() && rec.gemms != now.gemms;
    if (other_gemms) {
      absl::StrAppend(&why,
                      "; the server ran other GEMM algorithms than when the baseline was "
                      "recorded (recorded: ",
                      rec.gemms, "; now: ", now.gemms, ")");
      const std::string recorded_choices = baseline_->server.value("algo_choices", std::string());
      if (info.algo_choices == "per_process") {
        absl::StrAppend(&why,
                        ". This server chooses its GEMM algorithms anew in every process "
                        "(algo_choices=per_process), the likely cause: run logitd without "
                        "--algo_cache=none so that it keeps them across restarts");
      } else if (recorded_choices == "per_process") {
        absl::StrAppend(&why,
                        ". The baseline was recorded by a server that chose its GEMM algorithms "
                        "anew in every process (algo_choices=per_process): record it again "
                        "against a server that keeps them");
      } else if (info.algo_choices == "kept") {
        absl::StrAppend(&why, ". This server keeps its choices in ", info.algo_cache_path,
                        ", which did not hold the baseline's: a fresh state directory (a new "
                        "container or host) chooses anew; ship the algorithm cache file with "
                        "the server to pin them (docs/OPERATIONS.md, \"Bits that survive "
                        "restarts\")");
      }
    } else if (!rec.gemms.empty()) {
      absl::StrAppend(&why, "; the same GEMM algorithms ran");
    }
    const std::string now_bounds =
        within ? absl::StrFormat("within its bounds (worst %.3g%% of bound)", 100 * worst)
               : std::string("OUTSIDE its bounds");
    if (rec.within_bounds.has_value()) {
      absl::StrAppend(
          &why, "; this result is ", now_bounds, ", the baseline's was ",
          *rec.within_bounds ? absl::StrFormat("within its bounds (worst %.3g%% of bound)",
                                               100 * rec.worst_bound_fraction)
                             : std::string("OUTSIDE its bounds"),
          *rec.within_bounds && within ? ": both keep the contract, the bits differ" : "");
    } else {
      absl::StrAppend(&why, "; this result is ", now_bounds,
                      " (the baseline predates bound records)");
    }
    return why;
  }

  std::vector<CaseRecord> recorded_;
  std::vector<client::ValidatedCase> validated_;
  std::optional<Baseline> baseline_;
  std::string load_error_;
};

}  // namespace

std::unique_ptr<Suite> MakeGoldenSuite() { return std::make_unique<GoldenSuite>(); }

}  // namespace logitd::validate
