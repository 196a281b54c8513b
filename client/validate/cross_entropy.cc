// cross_entropy: the fused LM-head cross-entropy against an fp64 reference
// (cross_entropy_reference.cc derives the bounds) and, on exact data, bit for
// bit (cross_entropy_exact.cc). This file: the suite's cases.
//
// Also: ignored tokens (loss 0, not counted, all-zero dX rows; an
// all-ignored mean is NaN), an ignore_index inside [0, V), int32 and int64
// targets giving the same bits, and out-of-range targets refused with
// INVALID_ARGUMENT (never clamped) by a server that then still answers.

#include "client/validate/cross_entropy.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
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

constexpr char kCrossEntropySuite[] = "cross_entropy";

}  // namespace

// ---------------------------------------------------------------------------
// The suite

namespace {

struct CeShapes {
  std::int64_t m, v, k;                    // normal data
  std::int64_t exact_m, exact_v, exact_k;  // integer data with decided gradients
};

CeShapes ShapesOf(const Options& o) {
  if (o.quick) return {32, 4096, 256, 32, 96, 64};
  return {64, 32768, 1024, 64, 192, 128};
}

struct NormalData {
  std::shared_ptr<Tensor> x, w;
};

// X ~ N(0, 1) and W ~ N(0, (logit_std)²/K), so that the logits have
// standard deviation about logit_std, as an LM head's do.
NormalData MakeNormalData(const Options& o, const CeShapes& s, const std::string& stream,
                          double logit_std) {
  Rng x_rng = Rng::Stream(o.seed, absl::StrCat("cross_entropy/", stream, "/x"));
  Rng w_rng = Rng::Stream(o.seed, absl::StrCat("cross_entropy/", stream, "/w"));
  NormalData d;
  d.x = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {s.m, s.k}, 1.0, x_rng));
  d.w = std::make_shared<Tensor>(RandomNormal(
      DType::kBf16, {s.v, s.k}, logit_std / std::sqrt(static_cast<double>(s.k)), w_rng));
  return d;
}

absl::StatusOr<client::CrossEntropyResult> Send(client::Client& c, const Tensor& x,
                                                const CeRequest& rq, DType targets_dtype,
                                                const std::string& handle, const CeWants& wants,
                                                bool accumulate, const std::string& what) {
  client::CrossEntropyOptions o = rq.Options();
  o.want_lse = wants.lse;
  o.want_dx = wants.dx;
  o.want_dw = wants.dw;
  o.dx_dtype = wants.dx_dtype;
  o.accumulate_dw = accumulate;
  absl::StatusOr<client::CrossEntropyResult> res =
      c.CrossEntropy(x, rq.TargetsTensor(targets_dtype), handle, o);
  if (!res.ok()) return Annotate(res.status(), absl::StrCat("CrossEntropy(", what, ")"));
  return res;
}

// The same through the run's client, the outputs recorded for --compare.
absl::StatusOr<client::CrossEntropyResult> Send(RunContext& ctx, const Tensor& x,
                                                const CeRequest& rq, DType targets_dtype,
                                                const std::string& handle, const CeWants& wants,
                                                bool accumulate, const std::string& what) {
  absl::StatusOr<client::CrossEntropyResult> res =
      Send(ctx.client(), x, rq, targets_dtype, handle, wants, accumulate, what);
  if (!res.ok()) return res;
  ctx.RecordOutput(what + " loss", res->loss);
  if (res->lse.has_value()) ctx.RecordOutput(what + " lse", *res->lse);
  if (res->dx.has_value()) ctx.RecordOutput(what + " dx", *res->dx);
  if (res->dw.has_value()) ctx.RecordOutput(what + " dw", *res->dw);
  return res;
}

std::vector<Tensor> Outputs(client::CrossEntropyResult&& res) {
  std::vector<Tensor> out;
  out.push_back(std::move(res.loss));
  if (res.lse.has_value()) out.push_back(*std::move(res.lse));
  if (res.dx.has_value()) out.push_back(*std::move(res.dx));
  if (res.dw.has_value()) out.push_back(*std::move(res.dw));
  return out;
}

// Folds one response's errors into the case's row of the detail table.
void Fold(const CeErrors& e, CeErrors* acc) {
  acc->loss_max_abs = std::max(acc->loss_max_abs, e.loss_max_abs);
  acc->loss_max_ulp = std::max(acc->loss_max_ulp, e.loss_max_ulp);
  acc->loss_worst_fraction = std::max(acc->loss_worst_fraction, e.loss_worst_fraction);
  acc->lse_max_abs = std::max(acc->lse_max_abs, e.lse_max_abs);
  acc->lse_max_ulp = std::max(acc->lse_max_ulp, e.lse_max_ulp);
  acc->lse_worst_fraction = std::max(acc->lse_worst_fraction, e.lse_worst_fraction);
  acc->dx_rel_frobenius = std::max(acc->dx_rel_frobenius, e.dx_rel_frobenius);
  acc->dx_worst_fraction = std::max(acc->dx_worst_fraction, e.dx_worst_fraction);
  acc->dw_rel_frobenius = std::max(acc->dw_rel_frobenius, e.dw_rel_frobenius);
  acc->dw_worst_fraction = std::max(acc->dw_worst_fraction, e.dw_worst_fraction);
  acc->violations += e.violations;
}

void PutTable(CaseResult& r, const CeErrors& e) {
  r.figures["table"] = {{"loss_max_abs_err", JsonNumber(e.loss_max_abs)},
                        {"loss_max_ulp", JsonNumber(e.loss_max_ulp)},
                        {"loss_worst_bound_fraction", JsonNumber(e.loss_worst_fraction)},
                        {"lse_max_abs_err", JsonNumber(e.lse_max_abs)},
                        {"lse_max_ulp", JsonNumber(e.lse_max_ulp)},
                        {"lse_worst_bound_fraction", JsonNumber(e.lse_worst_fraction)},
                        {"dx_rel_frobenius_err", JsonNumber(e.dx_rel_frobenius)},
                        {"dx_worst_bound_fraction", JsonNumber(e.dx_worst_fraction)},
                        {"dw_rel_frobenius_err", JsonNumber(e.dw_rel_frobenius)},
                        {"dw_worst_bound_fraction", JsonNumber(e.dw_worst_fraction)},
                        {"bound_violations", e.violations}};
  r.summary = absl::StrFormat(
      "loss err %.2g (%.2g ulp), lse err %.2g, dX rel %.2g, dW rel %.2g; %d outside bounds",
      e.loss_max_abs, e.loss_max_ulp, e.lse_max_abs, e.dx_rel_frobenius, e.dw_rel_frobenius,
      e.violations);
}

// ---------------------------------------------------------------------------
// Numeric cases: one set of options, three requests (per-token with lse and
// both gradients, the sum, the mean with both gradients), each against the
// fp64 reference, and the reductions against the per-token losses.

struct NumericCase {
  std::string name;
  double logit_std = 2;
  float z_loss = 0;
  float softcap = 0;
  float grad_scale = 1;
  DType dx_dtype = DType::kBf16;
  DType targets_dtype = DType::kInt64;
};

// The first call of a numeric case (reduction none, every output), offered
// for --replay.
void OfferNumericReplay(RunContext& ctx, const NumericCase& nc, const CeShapes& s,
                        const NormalData& d, const CeRequest& none, const CeWants& all,
                        const client::CrossEntropyResult& r_none) {
  Replay replay;
  replay.suite = kCrossEntropySuite;
  replay.description =
      absl::StrCat("CrossEntropy ", nc.name, ", reduction none, lse, dX, dW, V=", s.v);
  const DType td = nc.targets_dtype;
  replay.send = [x = d.x, w = d.w, none, all,
                 td](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
    absl::StatusOr<ScopedWeight> again = ScopedWeight::Register(c, *w, "cross_entropy_replay");
    if (!again.ok()) return again.status();
    absl::StatusOr<client::CrossEntropyResult> res =
        Send(c, *x, none, td, again->handle(), all, false, "replay");
    if (!res.ok()) return res.status();
    return Outputs(*std::move(res));
  };
  replay.first.push_back(r_none.loss.Clone());
  if (r_none.lse) replay.first.push_back(r_none.lse->Clone());
  if (r_none.dx) replay.first.push_back(r_none.dx->Clone());
  if (r_none.dw) replay.first.push_back(r_none.dw->Clone());
  ctx.OfferReplay(std::move(replay));
}

absl::Status RunNumeric(RunContext& ctx, CaseResult& r, const NumericCase& nc) {
  PhaseTimer timer(&r);
  const CeShapes s = ShapesOf(ctx.options());
  const NormalData d = MakeNormalData(ctx.options(), s, nc.name, nc.logit_std);
  Rng t_rng = Rng::Stream(ctx.options().seed, absl::StrCat("cross_entropy/", nc.name, "/t"));
  CeRequest rq;
  rq.targets = RandomTargets(t_rng, s.m, s.v, rq.ignore_index, 8);
  rq.z_loss = nc.z_loss;
  rq.logit_softcap = nc.softcap;
  rq.grad_scale = nc.grad_scale;
  r.figures["m"] = s.m;
  r.figures["v"] = s.v;
  r.figures["k"] = s.k;
  r.figures["logit_std"] = nc.logit_std;
  r.figures["z_loss"] = nc.z_loss;
  r.figures["logit_softcap"] = nc.softcap;
  r.figures["grad_scale"] = nc.grad_scale;
  r.figures["targets"] = std::string(DTypeName(nc.targets_dtype));
  timer.Lap("generate");

  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, absl::StrCat("cross_entropy_", nc.name));
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();
  timer.Lap("register");

  CeRequest none = rq, sum = rq, mean = rq;
  none.reduction = client::Reduction::kNone;
  sum.reduction = client::Reduction::kSum;
  mean.reduction = client::Reduction::kMean;
  const CeWants all{true, true, true, nc.dx_dtype};
  const CeWants grads{false, true, true, nc.dx_dtype};
  absl::StatusOr<client::CrossEntropyResult> r_none =
      Send(ctx, *d.x, none, nc.targets_dtype, handle, all, false, "none");
  if (!r_none.ok()) return r_none.status();
  if (ctx.WantsReplay(kCrossEntropySuite)) OfferNumericReplay(ctx, nc, s, d, none, all, *r_none);
  absl::StatusOr<client::CrossEntropyResult> r_sum =
      Send(ctx, *d.x, sum, nc.targets_dtype, handle, {}, false, "sum");
  if (!r_sum.ok()) return r_sum.status();
  absl::StatusOr<client::CrossEntropyResult> r_mean =
      Send(ctx, *d.x, mean, nc.targets_dtype, handle, grads, false, "mean");
  if (!r_mean.ok()) return r_mean.status();
  timer.Lap("server");

  const CeReference ref_none = ComputeReference(*d.x, *d.w, none);
  const CeReference ref_mean = ComputeReference(*d.x, *d.w, mean);
  const CeReference ref16 = ComputeReference(*d.x, *d.w, none, LogitModel::kBf16Rounded);
  timer.Lap("reference");

  CeErrors table;
  Fold(CheckAgainstReference(ref_none, none, *d.x, *d.w, *r_none, all, r, "none"), &table);
  Fold(CheckAgainstReference(ref_none, sum, *d.x, *d.w, *r_sum, {}, r, "sum"), &table);
  Fold(CheckAgainstReference(ref_mean, mean, *d.x, *d.w, *r_mean, grads, r, "mean"), &table);
  if (r_none->loss.numel() == s.m) {
    CheckReductionConsistency(r_none->loss, *r_sum, client::Reduction::kSum, ref_none.counted, r,
                              "sum_vs_none");
    CheckReductionConsistency(r_none->loss, *r_mean, client::Reduction::kMean, ref_none.counted, r,
                              "mean_vs_none");
  }
  CheckFp32LogitsShow(ref_none, ref16, *r_none, none, kMinBf16Ratio, r, "fp32_vs_bf16_logits");
  PutTable(r, table);
  const nlohmann::ordered_json& ratio = r.figures["fp32_vs_bf16_logits"];
  if (ratio.contains("loss_ratio")) {
    r.figures["table"]["bf16_logits_loss_ratio"] = ratio["loss_ratio"];
  }
  timer.Lap("compare");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// ignore_index

absl::Status RunIgnoreIndex(RunContext& ctx, CaseResult& r) {
  const CeShapes s = ShapesOf(ctx.options());
  const NormalData d = MakeNormalData(ctx.options(), s, "ignore_index", 2.0);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, "cross_entropy_ignore_index");
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();

  // A vocabulary id as ignore_index (some tokenizers pad with a real id):
  // about a quarter of the targets are that id.
  Rng t_rng = Rng::Stream(ctx.options().seed, "cross_entropy/ignore_index/t");
  CeRequest rq;
  rq.ignore_index = 3;
  rq.reduction = client::Reduction::kNone;
  rq.targets = RandomTargets(t_rng, s.m, s.v, rq.ignore_index, 4);
  const CeWants all{true, true, true, DType::kFp32};
  absl::StatusOr<client::CrossEntropyResult> res =
      Send(ctx, *d.x, rq, DType::kInt64, handle, all, false, "ignore_index 3");
  if (!res.ok()) return res.status();
  const CeReference ref = ComputeReference(*d.x, *d.w, rq);
  r.figures["ignored"] = ref.m - ref.counted;
  CeErrors table;
  Fold(CheckAgainstReference(ref, rq, *d.x, *d.w, *res, all, r, "ignore_index_3"), &table);

  // Nothing counted: the mean is NaN, the sum 0, and both gradients zero.
  CeRequest none_counted;
  none_counted.targets.assign(static_cast<std::size_t>(s.m), none_counted.ignore_index);
  for (client::Reduction red : {client::Reduction::kMean, client::Reduction::kSum}) {
    none_counted.reduction = red;
    const std::string label = absl::StrCat("all_ignored_", client::ReductionName(red));
    absl::StatusOr<client::CrossEntropyResult> all_ignored =
        Send(ctx, *d.x, none_counted, DType::kInt64, handle, {false, true, true, DType::kBf16},
             false, label);
    if (!all_ignored.ok()) return all_ignored.status();
    r.Check(all_ignored->counted_tokens == 0,
            absl::StrCat(label, ": counted_tokens ", all_ignored->counted_tokens, ", expected 0"));
    if (r.Check(all_ignored->loss.numel() == 1 && all_ignored->loss.dtype() == DType::kFp32,
                absl::StrCat(label, ": loss is not one fp32 value"))) {
      const double l = all_ignored->loss.At(0);
      if (red == client::Reduction::kMean) {
        r.Check(std::isnan(l), absl::StrFormat("%s: loss %.9g, expected NaN", label, l));
      } else {
        r.Check(l == 0, absl::StrFormat("%s: loss %.9g, expected 0", label, l));
      }
    }
    for (const auto& [name, t] :
         {std::pair{"dX", &all_ignored->dx}, std::pair{"dW", &all_ignored->dw}}) {
      if (!r.Check(t->has_value(), absl::StrCat(label, ": ", name, " asked for but missing"))) {
        continue;
      }
      std::int64_t nonzero = 0;
      for (std::int64_t i = 0; i < (*t)->numel(); ++i) nonzero += (*t)->At(i) != 0 ? 1 : 0;
      r.Check(nonzero == 0, absl::StrCat(label, ": ", name, ": ", nonzero, " of ", (*t)->numel(),
                                         " gradient elements are not zero (no token counts)"));
    }
  }
  PutTable(r, table);
  r.summary =
      absl::StrCat(ref.m - ref.counted, " of ", ref.m,
                   " ignored with ignore_index 3; all-ignored mean NaN, sum 0; ", r.summary);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// int32 and int64 targets

absl::Status RunTargetTypes(RunContext& ctx, CaseResult& r) {
  const CeShapes s = ShapesOf(ctx.options());
  const NormalData d = MakeNormalData(ctx.options(), s, "int32", 3.0);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *d.w, "cross_entropy_int32");
  if (!weight.ok()) return weight.status();
  Rng t_rng = Rng::Stream(ctx.options().seed, "cross_entropy/int32/t");
  CeRequest rq;
  rq.targets = RandomTargets(t_rng, s.m, s.v, rq.ignore_index, 8);
  rq.reduction = client::Reduction::kMean;
  const CeWants all{true, true, true, DType::kBf16};
  absl::StatusOr<client::CrossEntropyResult> r32 =
      Send(ctx, *d.x, rq, DType::kInt32, weight->handle(), all, false, "int32");
  if (!r32.ok()) return r32.status();
  absl::StatusOr<client::CrossEntropyResult> r64 =
      Send(ctx, *d.x, rq, DType::kInt64, weight->handle(), all, false, "int64");
  if (!r64.ok()) return r64.status();
  const CeReference ref = ComputeReference(*d.x, *d.w, rq);
  CeErrors table;
  Fold(CheckAgainstReference(ref, rq, *d.x, *d.w, *r32, all, r, "int32"), &table);
  r.Check(r32->counted_tokens == r64->counted_tokens,
          absl::StrCat("counted_tokens: ", r32->counted_tokens, " with int32 targets, ",
                       r64->counted_tokens, " with int64"));
  const CompareOptions strict{/*signed_zero_equal=*/false, /*any_nan_equal=*/false};
  std::int64_t differing = 0;
  std::vector<Tensor> a = Outputs(*std::move(r32));
  std::vector<Tensor> b = Outputs(*std::move(r64));
  if (r.Check(a.size() == b.size(), "int32 and int64 targets returned different outputs")) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      const BitwiseComparison c = CompareTensors(a[i], b[i], strict);
      differing += c.differing;
      r.Check(c.differing == 0,
              absl::StrCat("output ", i,
                           " with int32 targets differs from int64: ", c.Describe(b[i].shape())));
    }
  }
  r.figures["differing_int32_vs_int64"] = differing;
  PutTable(r, table);
  r.summary = absl::StrCat(differing, " elements differ between int32 and int64; ", r.summary);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Invalid targets

absl::Status RunInvalidTargets(RunContext& ctx, CaseResult& r) {
  constexpr std::int64_t m = 8, v = 64, k = 32;
  Rng rng = Rng::Stream(ctx.options().seed, "cross_entropy/invalid");
  const Tensor x = RandomNormal(DType::kBf16, {m, k}, 1.0, rng);
  const Tensor w = RandomNormal(DType::kBf16, {v, k}, 0.25, rng);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), w, "cross_entropy_invalid");
  if (!weight.ok()) return weight.status();
  struct Bad {
    std::string what;
    std::int64_t index;
    std::int64_t value;
    std::int64_t ignore_index;
    DType dtype;
  };
  const std::vector<Bad> bad = {
      {"target V", 3, v, -100, DType::kInt64},
      {"target -1", 2, -1, -100, DType::kInt64},
      {"target INT64_MIN", 7, std::numeric_limits<std::int64_t>::min(), -100, DType::kInt64},
      {"target INT64_MAX", 0, std::numeric_limits<std::int64_t>::max(), -100, DType::kInt64},
      {"int32 target V+5", 5, v + 5, -100, DType::kInt32},
      {"int32 target INT32_MIN", 1, std::numeric_limits<std::int32_t>::min(), -100, DType::kInt32},
      {"target -100 with ignore_index -1", 4, -100, -1, DType::kInt64},
  };
  std::int64_t refused = 0;
  for (const Bad& b : bad) {
    CeRequest rq;
    rq.ignore_index = b.ignore_index;
    rq.targets.resize(m);
    for (std::int64_t i = 0; i < m; ++i) rq.targets[static_cast<std::size_t>(i)] = (i * 7) % v;
    rq.targets[static_cast<std::size_t>(b.index)] = b.value;
    client::CrossEntropyOptions o = rq.Options();
    o.want_dx = true;
    absl::StatusOr<client::CrossEntropyResult> res =
        ctx.client().CrossEntropy(x, rq.TargetsTensor(b.dtype), weight->handle(), o);
    if (res.ok()) {
      r.Check(false, absl::StrCat(b.what, " at [", b.index,
                                  "]: accepted (loss computed); out-of-range targets must be "
                                  "INVALID_ARGUMENT, never clamped"));
      continue;
    }
    if (IsServerUnreachable(res.status())) return res.status();
    if (r.Check(res.status().code() == absl::StatusCode::kInvalidArgument,
                absl::StrCat(b.what, ": expected INVALID_ARGUMENT, got ",
                             absl::StatusCodeToString(res.status().code()), ": ",
                             res.status().message()))) {
      ++refused;
    }
  }
  // The server still serves, and an out-of-range ignore_index used as such
  // is fine.
  CeRequest ok;
  ok.ignore_index = v;
  ok.reduction = client::Reduction::kSum;
  ok.targets.resize(m);
  for (std::int64_t i = 0; i < m; ++i) ok.targets[static_cast<std::size_t>(i)] = i % 2 ? v : i;
  absl::StatusOr<client::CrossEntropyResult> res =
      Send(ctx, x, ok, DType::kInt64, weight->handle(), {}, false, "ignore_index V");
  if (!res.ok()) return res.status();
  r.Check(res->counted_tokens == m / 2, absl::StrCat("ignore_index V: counted_tokens ",
                                                     res->counted_tokens, ", expected ", m / 2));
  r.figures["refused"] = refused;
  r.figures["tried"] = bad.size();
  r.summary = absl::StrCat(refused, "/", bad.size(),
                           " invalid target sets refused with INVALID_ARGUMENT; server answers");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Exact gradients: the cast contract bit for bit.

struct ExactCase {
  std::string name;
  client::Reduction reduction = client::Reduction::kSum;
  float grad_scale = 1;
  float z_loss = 0;
  float softcap = 0;
};

// The server's own Backward of the predicted G gives the same bits as the
// cross-entropy's dX and dW (a): the elements that differ.
absl::StatusOr<std::int64_t> CompareWithBackward(client::Client& c, const ExactGradients& want,
                                                 const Tensor& x, const std::string& handle,
                                                 const client::CrossEntropyResult& a,
                                                 CaseResult& r) {
  client::BackwardOptions bo;
  bo.dx_dtype = DType::kFp32;
  absl::StatusOr<client::BackwardResult> back = c.Backward(want.g, x, handle, bo);
  if (!back.ok()) return Annotate(back.status(), "Backward(predicted G)");
  std::int64_t backward_differing = 0;
  if (a.dx && a.dw && back->dx && back->dw) {
    const BitwiseComparison cx = CompareTensors(*a.dx, *back->dx);
    const BitwiseComparison cw = CompareTensors(*a.dw, *back->dw);
    backward_differing = cx.differing + cw.differing;
    r.Check(cx.differing == 0,
            absl::StrCat("CrossEntropy's dX differs from Backward's dX for the same G: ",
                         cx.Describe(a.dx->shape())));
    r.Check(cw.differing == 0,
            absl::StrCat("CrossEntropy's dW differs from Backward's dW for the same G: ",
                         cw.Describe(a.dw->shape())));
  }
  r.figures["differing_vs_backward"] = backward_differing;
  return backward_differing;
}

// Twice into the server-held buffer: exactly 2·dW. The elements that differ,
// -1 when the fetched dW has the wrong shape or dtype.
absl::StatusOr<std::int64_t> CheckAccumulatedTwice(client::Client& c, const ExactGradients& want,
                                                   const ExactData& d, const CeRequest& rq,
                                                   const std::string& handle, CaseResult& r) {
  const std::int64_t v = d.w.dim(0), k = d.w.dim(1);
  const absl::Status zero = c.ZeroGradient(handle);
  if (!zero.ok() && zero.code() != absl::StatusCode::kNotFound &&
      zero.code() != absl::StatusCode::kFailedPrecondition) {
    return Annotate(zero, "ZeroGradient");
  }
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<client::CrossEntropyResult> acc =
        Send(c, d.x, rq, DType::kInt64, handle, {false, false, true, DType::kBf16}, true,
             "accumulate_dw");
    if (!acc.ok()) return acc.status();
    r.Check(!acc->dw.has_value(), "accumulate_dw: dW returned although accumulated");
  }
  absl::StatusOr<client::GradientResult> fetched = c.FetchGradient(handle, true);
  if (!fetched.ok()) return Annotate(fetched.status(), "FetchGradient");
  r.figures["accumulated_calls"] = fetched->accumulated_calls;
  r.Check(fetched->accumulated_calls == 2,
          absl::StrCat("FetchGradient counts ", fetched->accumulated_calls,
                       " accumulated calls after ZeroGradient and 2 accumulating CrossEntropy "
                       "calls"));
  std::int64_t acc_differing = -1;
  if (CheckTensor(r, fetched->dw, DType::kFp32, {v, k}, "FetchGradient dW")) {
    std::vector<float> twice(want.dw.size());
    for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * want.dw[i];
    const BitwiseComparison cmp =
        CompareWith(fetched->dw, twice.data(), static_cast<std::int64_t>(twice.size()));
    acc_differing = cmp.differing;
    r.Check(cmp.differing == 0, absl::StrCat("dW accumulated twice differs from 2·(exact Gᵀ·X): ",
                                             cmp.Describe(fetched->dw.shape())));
  }
  r.figures["differing_accumulated"] = acc_differing;
  return acc_differing;
}

absl::Status RunExact(RunContext& ctx, CaseResult& r, const ExactCase& ec) {
  PhaseTimer timer(&r);
  const CeShapes s = ShapesOf(ctx.options());
  CeRequest rq;
  rq.reduction = ec.reduction;
  rq.grad_scale = ec.grad_scale;
  rq.z_loss = ec.z_loss;
  rq.logit_softcap = ec.softcap;
  absl::StatusOr<ExactData> d =
      MakeExactData(ctx.options().seed, absl::StrCat("cross_entropy/", ec.name), s.exact_m,
                    s.exact_v, s.exact_k, &rq);
  if (!d.ok()) return absl::InternalError(absl::StrCat("harness: ", d.status().message()));
  const CeReference ref = ComputeReference(d->x, d->w, rq, LogitModel::kExact);
  absl::StatusOr<ExactGradients> want = PredictExactGradients(ref, d->x, d->w);
  if (!want.ok()) {
    return absl::InternalError(absl::StrCat("harness: ", want.status().message()));
  }
  r.figures["m"] = s.exact_m;
  r.figures["v"] = s.exact_v;
  r.figures["k"] = s.exact_k;
  r.figures["reduction"] = std::string(client::ReductionName(ec.reduction));
  r.figures["counted"] = ref.counted;
  timer.Lap("generate");

  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), d->w, absl::StrCat("cross_entropy_", ec.name));
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();
  client::Client& c = ctx.client();

  const CeWants fp32{true, true, true, DType::kFp32};
  absl::StatusOr<client::CrossEntropyResult> a =
      Send(ctx, d->x, rq, DType::kInt64, handle, fp32, false, "dX fp32");
  if (!a.ok()) return a.status();
  const CeWants bf16{false, true, false, DType::kBf16};
  absl::StatusOr<client::CrossEntropyResult> b =
      Send(ctx, d->x, rq, DType::kInt32, handle, bf16, false, "dX bf16");
  if (!b.ok()) return b.status();
  timer.Lap("server");

  CeErrors table;
  // Loss and lse from exact logits: bounds of a few ulps.
  CeWants no_grads = fp32;
  no_grads.dx = no_grads.dw = false;
  client::CrossEntropyResult loss_only;
  loss_only.loss = a->loss.Clone();
  if (a->lse) loss_only.lse = a->lse->Clone();
  loss_only.counted_tokens = a->counted_tokens;
  Fold(CheckAgainstReference(ref, rq, d->x, d->w, loss_only, no_grads, r, "loss"), &table);
  CheckExactGradients(*want, *a, fp32, r, "fp32_dx");
  CheckExactGradients(*want, *b, bf16, r, "bf16_dx");

  absl::StatusOr<std::int64_t> backward_differing =
      CompareWithBackward(c, *want, d->x, handle, *a, r);
  if (!backward_differing.ok()) return backward_differing.status();
  absl::StatusOr<std::int64_t> acc_differing = CheckAccumulatedTwice(c, *want, *d, rq, handle, r);
  if (!acc_differing.ok()) return acc_differing.status();
  timer.Lap("compare");

  std::int64_t differing = 0;
  for (const char* key : {"fp32_dx", "bf16_dx"}) {
    for (const char* t : {"dx", "dw"}) {
      if (r.figures[key].contains(t)) differing += r.figures[key][t].value("differing", 0);
    }
  }
  // The gradients are compared bit for bit, not against bounds.
  table.dx_rel_frobenius = table.dx_worst_fraction = std::nan("");
  table.dw_rel_frobenius = table.dw_worst_fraction = std::nan("");
  PutTable(r, table);
  r.figures["table"]["bitwise_differing"] =
      differing + *backward_differing + std::max<std::int64_t>(*acc_differing, 0);
  r.summary = absl::StrFormat(
      "%d dX/dW elements differ from exact bf16-G sums, %d from Backward, %d accumulated; "
      "loss err %.2g ulp",
      differing, *backward_differing, *acc_differing, table.loss_max_ulp);
  return absl::OkStatus();
}

double Figure(const nlohmann::ordered_json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return std::nan("");
  if (it->is_number()) return it->get<double>();
  if (it->is_string() && it->get<std::string>() == "inf") {
    return std::numeric_limits<double>::infinity();
  }
  return std::nan("");
}

class CrossEntropySuite final : public Suite {
 public:
  std::string name() const override { return kCrossEntropySuite; }
  std::vector<Case> Cases(const Options& options) override {
    shapes_ = ShapesOf(options);
    std::vector<Case> cases;
    const std::vector<NumericCase> numeric = {
        {"reference", 2.0, 0.0f, 0.0f, 1.0f, DType::kBf16, DType::kInt64},
        {"z_loss", 2.0, 1e-3f, 0.0f, 1.0f, DType::kBf16, DType::kInt64},
        {"softcap", 8.0, 0.0f, 10.0f, 1.0f, DType::kBf16, DType::kInt64},
        {"softcap_z_loss_scaled", 6.0, 1e-4f, 15.0f, 0.37f, DType::kFp32, DType::kInt32},
    };
    for (const NumericCase& nc : numeric) {
      cases.push_back(
          {nc.name, [nc](RunContext& ctx, CaseResult& r) { return RunNumeric(ctx, r, nc); }});
    }
    cases.push_back({"ignore_index", RunIgnoreIndex});
    cases.push_back({"int32_equals_int64", RunTargetTypes});
    cases.push_back({"invalid_targets", RunInvalidTargets});
    const std::vector<ExactCase> exact = {
        {"exact_grads", client::Reduction::kSum, 1.0f, 0.0f, 0.0f},
        {"exact_grads_mean_softcap_z_loss", client::Reduction::kMean, 2.0f, 1e-3f, 20.0f},
    };
    for (const ExactCase& ec : exact) {
      cases.push_back(
          {ec.name, [ec](RunContext& ctx, CaseResult& r) { return RunExact(ctx, r, ec); }});
    }
    return cases;
  }

  std::string DetailTable(const std::vector<CaseResult>& results) const override {
    std::string t = absl::StrFormat(
        "cross_entropy: X [%d, %d] ~ N(0, 1), W [%d, %d] scaled to the logit std; errors of the "
        "fused loss against fp64 (max over the case's requests; %% = worst fraction of the "
        "fp32 bound)\n",
        shapes_.m, shapes_.k, shapes_.v, shapes_.k);
    absl::StrAppend(&t, absl::StrFormat("%-32s %10s %8s %7s %10s %7s %10s %7s %10s %7s %9s  %s\n",
                                        "case", "loss err", "ulp", "%", "lse err", "%", "dX relF",
                                        "%", "dW relF", "%", "bf16/fp32", "verdict"));
    for (const CaseResult& r : results) {
      if (!r.figures.contains("table")) {
        absl::StrAppend(&t, absl::StrFormat("%-32s %s\n", r.name, VerdictName(r.verdict)));
        continue;
      }
      const nlohmann::ordered_json& j = r.figures.at("table");
      std::string tail;
      if (j.contains("bitwise_differing")) {
        tail =
            absl::StrCat("bitwise: ", j.value("bitwise_differing", std::int64_t{0}), " differ; ");
      }
      // "-" where a figure does not apply (e.g. gradients compared bit for bit).
      const auto sci = [&](const char* key) {
        const double v = Figure(j, key);
        return std::isnan(v) ? std::string("-") : absl::StrFormat("%.2e", v);
      };
      const auto pct = [&](const char* key) {
        const double v = Figure(j, key);
        return std::isnan(v) ? std::string("-") : absl::StrFormat("%.2g", 100 * v);
      };
      const double ratio = Figure(j, "bf16_logits_loss_ratio");
      absl::StrAppend(
          &t, absl::StrFormat("%-32s %10s %8.2f %7s %10s %7s %10s %7s %10s %7s %9s  %s%s\n", r.name,
                              sci("loss_max_abs_err"), Figure(j, "loss_max_ulp"),
                              pct("loss_worst_bound_fraction"), sci("lse_max_abs_err"),
                              pct("lse_worst_bound_fraction"), sci("dx_rel_frobenius_err"),
                              pct("dx_worst_bound_fraction"), sci("dw_rel_frobenius_err"),
                              pct("dw_worst_bound_fraction"),
                              std::isnan(ratio) ? std::string("-") : absl::StrFormat("%.3g", ratio),
                              tail, VerdictName(r.verdict)));
    }
    return t;
  }

 private:
  CeShapes shapes_{};
};

}  // namespace

std::unique_ptr<Suite> MakeCrossEntropySuite() { return std::make_unique<CrossEntropySuite>(); }

}  // namespace logitd::validate
