// logprobs: per-token log-probabilities, lse, entropy, top-k and target ranks
// of the fp32 logits (the LogProbs call) against an fp64 reference, inside
// the bounds derived at the top of logprobs_reference.cc.
//
// Cases:
//   bounds               normal data, temperature 1, no cap, all of V: every
//                        output within its bound, top-k ids equal at every
//                        place the reference decides, ranks between the
//                        surely-above and possibly-above counts.
//   bounds_scaled_capped the same with temperature 0.7, soft-capping at 30
//                        and vocab_size < V.
//   exact                integer operands (exact logits with many ties):
//                        top-k ids and ranks equal the reference's, ties to
//                        the lower id, at temperatures 1 and 2.
//   cross_entropy_bitwise  the same data through CrossEntropy (reduction
//                        none, lse) and LogProbs: lse bitwise equal, logprob
//                        bitwise −loss on counted tokens and +0 on ignored.
//   bf16_head_mismatch   why the call exists: the log-probs a BF16 LM head
//                        gives (the server's bf16 logits, log-softmax in fp64
//                        on the client) miss the fp32 bound where LogProbs
//                        stays inside it.
//
// The first LogProbs request is offered to the determinism suite for a
// replay. No golden entry: golden pins the GEMM calls' bits, and LogProbs'
// lse is CrossEntropy's, which golden does not pin either.

#include "client/validate/logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/random.h"
#include "client/validate/report.h"
#include "client/validate/suites.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {
namespace {

constexpr char kLogprobsSuite[] = "logprobs";

struct LpShape {
  std::int64_t m, k, v;
};

struct Data {
  std::shared_ptr<Tensor> x, w;
};

// X ~ N(0, 1) and W ~ N(0, logit_std²/K): logits of standard deviation
// about logit_std, as an LM head's.
Data NormalData(const Options& o, const LpShape& s, const std::string& stream, double logit_std) {
  Rng x_rng = Rng::Stream(o.seed, absl::StrCat(kLogprobsSuite, "/", stream, "/x"));
  Rng w_rng = Rng::Stream(o.seed, absl::StrCat(kLogprobsSuite, "/", stream, "/w"));
  Data d;
  d.x = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {s.m, s.k}, 1.0, x_rng));
  d.w = std::make_shared<Tensor>(RandomNormal(
      DType::kBf16, {s.v, s.k}, logit_std / std::sqrt(static_cast<double>(s.k)), w_rng));
  return d;
}

// Targets uniform over [0, v), about one in `ignore_one_in` ignored (never
// the first, so that every case has a counted token).
std::vector<std::int64_t> RandomTargets(const Options& o, const std::string& stream, std::int64_t m,
                                        std::int64_t v, std::int64_t ignore_index,
                                        int ignore_one_in) {
  Rng rng = Rng::Stream(o.seed, absl::StrCat(kLogprobsSuite, "/", stream, "/t"));
  return validate::RandomTargets(rng, m, v, ignore_index, ignore_one_in);
}

absl::StatusOr<client::LogProbsResult> Send(client::Client& c, const Tensor& x, const LpRequest& rq,
                                            const std::string& handle, const std::string& what) {
  const Tensor targets = rq.TargetsTensor();
  absl::StatusOr<client::LogProbsResult> res =
      c.LogProbs(x, rq.targets.empty() ? nullptr : &targets, handle, rq.Options());
  if (!res.ok()) return Annotate(res.status(), absl::StrCat("LogProbs(", what, ")"));
  return res;
}

// The same through the run's client, the outputs recorded for --compare.
absl::StatusOr<client::LogProbsResult> Send(RunContext& ctx, const Tensor& x, const LpRequest& rq,
                                            const std::string& handle, const std::string& what) {
  absl::StatusOr<client::LogProbsResult> res = Send(ctx.client(), x, rq, handle, what);
  if (!res.ok()) return res;
  const std::pair<const char*, const std::optional<Tensor>*> outputs[] = {
      {"logprob", &res->logprob},
      {"lse", &res->lse},
      {"entropy", &res->entropy},
      {"topk_ids", &res->topk_ids},
      {"topk_logprobs", &res->topk_logprobs},
      {"rank", &res->rank}};
  for (const auto& [name, t] : outputs) {
    if (t->has_value()) ctx.RecordOutput(absl::StrCat(what, what.empty() ? "" : " ", name), **t);
  }
  return res;
}

std::vector<Tensor> Outputs(const client::LogProbsResult& res) {
  std::vector<Tensor> out;
  for (const std::optional<Tensor>* t :
       {&res.logprob, &res.lse, &res.entropy, &res.topk_ids, &res.topk_logprobs, &res.rank}) {
    if (t->has_value()) out.push_back((*t)->Clone());
  }
  return out;
}

void OfferReplay(RunContext& ctx, const Data& d, const LpRequest& rq, std::string description,
                 const client::LogProbsResult& first) {
  if (!ctx.WantsReplay(kLogprobsSuite)) return;
  Replay replay;
  replay.suite = kLogprobsSuite;
  replay.description = std::move(description);
  replay.send = [x = d.x, w = d.w, rq](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
    absl::StatusOr<ScopedWeight> again = ScopedWeight::Register(c, *w, "logprobs_replay");
    if (!again.ok()) return again.status();
    absl::StatusOr<client::LogProbsResult> res = Send(c, *x, rq, again->handle(), "replay");
    if (!res.ok()) return res.status();
    return Outputs(*res);
  };
  replay.first = Outputs(first);
  ctx.OfferReplay(std::move(replay));
}

std::string Fraction(double f) { return absl::StrFormat("%.3g", f); }

// "lse 0.012, logprob 0.02, H 0.001 of bound; top-k 180/185 places decided"
std::string Summary(const LpErrors& e) {
  std::string s = absl::StrCat("lse ", Fraction(e.lse_worst_fraction), ", logprob ",
                               Fraction(e.logprob_worst_fraction), ", H ",
                               Fraction(e.entropy_worst_fraction), " of bound");
  if (e.topk_places > 0) {
    absl::StrAppend(&s, "; top-k lp ", Fraction(e.topk_logprob_worst_fraction), ", ",
                    e.topk_decided, "/", e.topk_places, " places decided");
  }
  return s;
}

struct BoundsCase {
  const char* name;
  float temperature;
  float softcap;
  std::int64_t vocab_cut;  // vocab_size = V − vocab_cut (0: all of V)
  std::int64_t top_k;
};

absl::Status RunBounds(RunContext& ctx, CaseResult& r, const LpShape& s, const BoundsCase& bc) {
  PhaseTimer timer(&r);
  const Data d = NormalData(ctx.options(), s, bc.name, 3.0);
  LpRequest rq;
  rq.temperature = bc.temperature;
  rq.logit_softcap = bc.softcap;
  rq.top_k = bc.top_k;
  rq.vocab_size = bc.vocab_cut > 0 ? s.v - bc.vocab_cut : 0;
  const std::int64_t vv = bc.vocab_cut > 0 ? s.v - bc.vocab_cut : s.v;
  rq.targets = RandomTargets(ctx.options(), bc.name, s.m, vv, rq.ignore_index, 6);
  r.figures["m"] = s.m;
  r.figures["k"] = s.k;
  r.figures["v"] = s.v;
  r.figures["vocab_size"] = vv;
  r.figures["temperature"] = bc.temperature;
  r.figures["logit_softcap"] = bc.softcap;
  timer.Lap("generate");
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, absl::StrCat("logprobs_", bc.name));
  if (!weight.ok()) return weight.status();
  timer.Lap("register");
  absl::StatusOr<client::LogProbsResult> got = Send(ctx, *d.x, rq, weight->handle(), "");
  if (!got.ok()) return got.status();
  timer.Lap("server");
  OfferReplay(ctx, d, rq,
              absl::StrCat("LogProbs ", bc.name, ", every output, M=", s.m, " K=", s.k, " V=", s.v),
              *got);
  const LpReference ref = ComputeLogProbsReference(*d.x, *d.w, rq);
  const LpErrors e = CheckLogProbs(ref, rq, *got, r, "logprobs");
  timer.Lap("reference");
  r.summary = Summary(e);
  return absl::OkStatus();
}

absl::Status RunExact(RunContext& ctx, CaseResult& r, const LpShape& s) {
  PhaseTimer timer(&r);
  Rng x_rng = Rng::Stream(ctx.options().seed, "logprobs/exact/x");
  Rng w_rng = Rng::Stream(ctx.options().seed, "logprobs/exact/w");
  const Tensor x = RandomIntegers(DType::kBf16, {s.m, s.k}, -2, 2, x_rng);
  const Tensor w = RandomIntegers(DType::kBf16, {s.v, s.k}, -2, 2, w_rng);
  r.figures["m"] = s.m;
  r.figures["k"] = s.k;
  r.figures["v"] = s.v;
  timer.Lap("generate");
  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(ctx.client(), w, "logprobs_exact");
  if (!weight.ok()) return weight.status();
  timer.Lap("register");
  std::string summary;
  // Temperature 2 halves every z exactly; a shorter vocabulary with it.
  for (const auto& [label, temperature, cut] :
       {std::tuple{"t1", 1.0f, std::int64_t{0}}, std::tuple{"t2_vocab", 2.0f, std::int64_t{7}}}) {
    LpRequest rq;
    rq.temperature = temperature;
    rq.top_k = std::min<std::int64_t>(64, s.v - cut);
    rq.vocab_size = cut > 0 ? s.v - cut : 0;
    rq.targets = RandomTargets(ctx.options(), absl::StrCat("exact_", label), s.m, s.v - cut,
                               rq.ignore_index, 6);
    absl::StatusOr<client::LogProbsResult> got = Send(ctx, x, rq, weight->handle(), label);
    if (!got.ok()) return got.status();
    timer.Lap("server");
    const LpReference ref = ComputeLogProbsReference(x, w, rq, LogitModel::kExact);
    if (!r.Check(ref.exact, absl::StrCat(label, ": the reference's z are not exact"))) {
      return absl::OkStatus();
    }
    const LpErrors e = CheckLogProbs(ref, rq, *got, r, label);
    timer.Lap("reference");
    absl::StrAppend(&summary, summary.empty() ? "" : "; ", label, ": ", e.topk_places,
                    " top-k ids and ", s.m, " ranks compared exactly");
  }
  r.summary = summary;
  return absl::OkStatus();
}

// Bits of element i of an fp32 tensor.
std::uint32_t Bits(const Tensor& t, std::int64_t i) {
  std::uint32_t b = 0;
  std::memcpy(&b, t.data<float>() + i, sizeof b);
  return b;
}

absl::Status RunCrossEntropyBitwise(RunContext& ctx, CaseResult& r, const LpShape& s) {
  PhaseTimer timer(&r);
  const Data d = NormalData(ctx.options(), s, "bitwise", 3.0);
  LpRequest rq;
  rq.targets = RandomTargets(ctx.options(), "bitwise", s.m, s.v, rq.ignore_index, 5);
  timer.Lap("generate");
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, "logprobs_bitwise");
  if (!weight.ok()) return weight.status();
  const Tensor targets = rq.TargetsTensor();
  client::CrossEntropyOptions ce;
  ce.ignore_index = rq.ignore_index;
  ce.reduction = client::Reduction::kNone;
  ce.want_lse = true;
  absl::StatusOr<client::CrossEntropyResult> loss =
      ctx.client().CrossEntropy(*d.x, targets, weight->handle(), ce);
  if (!loss.ok()) return Annotate(loss.status(), "CrossEntropy(none, lse)");
  absl::StatusOr<client::LogProbsResult> got = Send(ctx, *d.x, rq, weight->handle(), "");
  if (!got.ok()) return got.status();
  timer.Lap("server");
  const std::vector<std::int64_t> shape = {s.m};
  if (!r.Check(loss->lse.has_value() && loss->lse->shape() == shape &&
                   loss->loss.shape() == shape && got->lse.has_value() &&
                   got->lse->shape() == shape && got->logprob.has_value() &&
                   got->logprob->shape() == shape,
               "CrossEntropy or LogProbs returned no [M] loss, lse or logprob")) {
    return absl::OkStatus();
  }
  std::int64_t lse_diff = 0, lp_diff = 0, first_lse = -1, first_lp = -1;
  for (std::int64_t i = 0; i < s.m; ++i) {
    if (Bits(*got->lse, i) != Bits(*loss->lse, i) && lse_diff++ == 0) first_lse = i;
    const std::uint32_t want = rq.Ignored(i) ? 0u : Bits(loss->loss, i) ^ 0x80000000u;
    const std::uint32_t lp = Bits(*got->logprob, i);
    // −(+0) is −0 where z_t − lse gives +0: a zero loss may come back as either.
    const bool zero_ok = !rq.Ignored(i) && (want & 0x7fffffffu) == 0 && (lp & 0x7fffffffu) == 0;
    if (lp != want && !zero_ok && lp_diff++ == 0) first_lp = i;
  }
  r.figures["m"] = s.m;
  r.figures["k"] = s.k;
  r.figures["v"] = s.v;
  r.figures["lse_differing"] = lse_diff;
  r.figures["logprob_differing"] = lp_diff;
  r.Check(lse_diff == 0,
          absl::StrCat("lse: ", lse_diff, " of ", s.m,
                       " tokens differ from CrossEntropy's bit for bit; first [", first_lse, "]"));
  r.Check(lp_diff == 0, absl::StrCat("logprob: ", lp_diff, " of ", s.m,
                                     " tokens are not bitwise -loss (counted) or +0 (ignored); "
                                     "first [",
                                     first_lp, "]"));
  r.summary = absl::StrCat(lse_diff, "/", s.m, " lse and ", lp_diff, "/", s.m,
                           " logprob differ from CrossEntropy's");
  return absl::OkStatus();
}

// What a BF16 LM head gives: the server's logits rounded to bf16, then an
// exact (fp64) log-softmax on the client. A logit near 8 is rounded by up to
// 2^-5, far above the fp32 path's bound for K in the thousands, so some
// token's log-prob must miss that bound; LogProbs must stay inside it.
absl::Status RunBf16HeadMismatch(RunContext& ctx, CaseResult& r, const LpShape& s) {
  PhaseTimer timer(&r);
  const Data d = NormalData(ctx.options(), s, "bf16_head", 4.0);
  LpRequest rq;
  rq.top_k = 1;
  rq.targets = RandomTargets(ctx.options(), "bf16_head", s.m, s.v, rq.ignore_index, 8);
  r.figures["m"] = s.m;
  r.figures["k"] = s.k;
  r.figures["v"] = s.v;
  timer.Lap("generate");
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, "logprobs_bf16_head");
  if (!weight.ok()) return weight.status();
  absl::StatusOr<client::LogProbsResult> got = Send(ctx, *d.x, rq, weight->handle(), "");
  if (!got.ok()) return got.status();
  client::LogitsOptions bf16_out;
  bf16_out.out_dtype = DType::kBf16;
  absl::StatusOr<Tensor> y16 = ctx.client().Logits(*d.x, weight->handle(), bf16_out);
  if (!y16.ok()) return Annotate(y16.status(), "Logits(bf16 out)");
  timer.Lap("server");
  const LpReference ref = ComputeLogProbsReference(*d.x, *d.w, rq);
  const LpErrors e = CheckLogProbs(ref, rq, *got, r, "logprobs");
  if (!r.Check(y16->dtype() == DType::kBf16 && y16->shape() == std::vector<std::int64_t>{s.m, s.v},
               "Logits(bf16 out): not bf16 [M, V]")) {
    return absl::OkStatus();
  }
  double max16 = 0, max_bound = 0;
  std::int64_t exceeding = 0, flips = 0;
  std::vector<double> row(static_cast<std::size_t>(s.v));
  for (std::int64_t i = 0; i < s.m; ++i) {
    std::int64_t best = 0;
    for (std::int64_t j = 0; j < s.v; ++j) {
      row[static_cast<std::size_t>(j)] = y16->At(i * s.v + j);
      if (row[static_cast<std::size_t>(j)] > row[static_cast<std::size_t>(best)]) best = j;
    }
    flips += best != ref.order[static_cast<std::size_t>(i * ref.order_cols)] ? 1 : 0;
    if (rq.Ignored(i)) continue;
    const double mx = row[static_cast<std::size_t>(best)];
    double sum = 0;
    for (double yj : row) sum += std::exp(yj - mx);
    const std::size_t t = static_cast<std::size_t>(rq.targets[static_cast<std::size_t>(i)]);
    const double err = std::fabs(row[t] - (mx + std::log(sum)) - ref.logprob[i]);
    max16 = std::max(max16, err);
    max_bound = std::max(max_bound, ref.logprob_bound[i]);
    exceeding += err > ref.logprob_bound[i] ? 1 : 0;
  }
  timer.Lap("reference");
  r.figures["logprob_max_abs_err_fp32"] = JsonNumber(e.logprob_max_abs);
  r.figures["logprob_max_abs_err_bf16_head"] = JsonNumber(max16);
  r.figures["logprob_max_bound"] = JsonNumber(max_bound);
  r.figures["bf16_tokens_outside_bound"] = exceeding;
  r.figures["bf16_top1_changed"] = flips;
  r.Check(exceeding > 0,
          absl::StrFormat("the bf16 head's log-probs (max error %.3g) stay within the fp32 "
                          "bound on every token: the case's data shows nothing",
                          max16));
  r.summary = absl::StrFormat(
      "max |Δlogprob| fp32 %.2g, bf16 head %.2g (bound <= %.2g); bf16: %d tokens outside, %d "
      "top-1 changed",
      e.logprob_max_abs, max16, max_bound, exceeding, flips);
  return absl::OkStatus();
}

class LogProbsSuite final : public Suite {
 public:
  std::string name() const override { return kLogprobsSuite; }
  std::vector<Case> Cases(const Options& options) override {
    const bool q = options.quick;
    const LpShape normal = q ? LpShape{37, 1000, 5003} : LpShape{61, 2047, 32003};
    const LpShape exact = q ? LpShape{29, 16, 1031} : LpShape{53, 16, 8191};
    const LpShape head = q ? LpShape{64, 512, 4099} : LpShape{128, 512, 32003};
    std::vector<Case> cases;
    for (const BoundsCase& bc : {BoundsCase{"bounds", 1.0f, 0.0f, 0, 5},
                                 BoundsCase{"bounds_scaled_capped", 0.7f, 30.0f, 1002, 64}}) {
      cases.push_back({bc.name, [normal, bc](RunContext& ctx, CaseResult& r) {
                         return RunBounds(ctx, r, normal, bc);
                       }});
    }
    cases.push_back(
        {"exact", [exact](RunContext& ctx, CaseResult& r) { return RunExact(ctx, r, exact); }});
    cases.push_back({"cross_entropy_bitwise", [normal](RunContext& ctx, CaseResult& r) {
                       return RunCrossEntropyBitwise(ctx, r, normal);
                     }});
    cases.push_back({"bf16_head_mismatch", [head](RunContext& ctx, CaseResult& r) {
                       return RunBf16HeadMismatch(ctx, r, head);
                     }});
    return cases;
  }
};

}  // namespace

std::unique_ptr<Suite> MakeLogProbsSuite() { return std::make_unique<LogProbsSuite>(); }

}  // namespace logitd::validate
