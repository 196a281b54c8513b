// The logprobs suite's reference and checks.
//
// The reference. Logits y = x·wᵀ come from a dgemm of the widened bf16
// operands; z_j = softcap(y_j) / T over the first V' = vocab_size rows, lse,
// logprob = z_t − lse, the entropy H = −Σ p log p = Σ_j p_j·(lse − z_j), the
// order of the entries (z descending, ties to the lower id) and each
// target's rank in it are then evaluated in fp64.
//
// The bounds. With u = 2^-24 (fp32), for one token and vocabulary entry j:
//   logit      |Δy_j| ≤ e_y,j = (γ_K(fp32) + γ_K(fp64))·Σ_l|x_l·w_jl|, with
//              γ_K = K·u/(1 − K·u) (Higham, Lemma 3.1); 0 for exact logits.
//   z          capped: e_c,j = (f_j + 2e_y,j/cap)·(e_y,j + u|y_j|) + 4u|c_j|
//              with c = cap·tanh(y/cap), f = 1 − (c/cap)² (as cross_entropy);
//              e_z,j = e_c,j / T, plus u|z_j| for the division when T != 1.
//              B = max_j e_z,j over the row.
//   lse        a softmax-weighted mean of its inputs' perturbations,
//              Σ_j p_j·e_z,j ≤ B, plus its own evaluation (a sum of V' exps
//              within γ_2V', each exp within (3 + 2.2·(max − z_j))·u, log
//              and the final addition a few u): cross_entropy's formula,
//              doubled for second-order terms.
//   logprob    Δlse + 2e_z,t + 4u·(|lse| + |z_t| + |logprob|).
//   entropy    dH/dz_j = −p_j·(log p_j + H), so for perturbations |e_j| ≤ B
//              |dH| ≤ B·Σ_j p_j·|log p_j + H| ≤ B·(Σ_j p_j·|log p_j| + H) =
//              2H·B (every −log p_j ≥ 0). Along the path z + s·e, s in
//              [0, 1], H(s) ≤ H·exp(2Bs), so |ΔH| ≤ H·(exp(2B) − 1) = 2HB to
//              first order. Its evaluation, H = log S − Z/S with
//              S = Σ exp(d_j) and Z = Σ exp(d_j)·d_j (d_j = z_j − max ≤ 0,
//              terms of one sign): log S as lse's, Z/S within
//              Σ_j p_j·|d_j|·((4 + 2.2|d_j|)·u + 2γ_2V'), and u·(|Z/S| + H)
//              for the roundings; doubled as above.
//   top-k      a server z is within B of the reference's, so two entries
//              whose reference z differ by more than 2B are in the same
//              order for the server. The id at place r is therefore
//              decided when the reference's z at place r is more than 2B
//              from those at places r − 1 and r + 1 (the entries before it
//              are then exactly the ones more than 2B above it); the
//              server's id must equal the reference's at every decided
//              place. Its log-prob z_id − lse is within B + Δlse + 4u·(|lse|
//              + |z_id| + |logprob|), taken at the id the server returned.
//   rank       at least the number of entries surely above the target
//              (z_j > z_t + 2B), at most the number possibly above it
//              (z_j ≥ z_t − 2B, j != t).
// With exact z (integer logits, no cap, a power-of-two temperature) B is 0
// and the top-k ids and ranks must equal the reference's, ties to the lower
// id; lse, logprob and entropy keep their evaluation bounds.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/cross_entropy.h"
#include "client/validate/logprobs.h"
#include "logitd/reference/numerics.h"
#include "client/validate/report.h"

namespace logitd::validate {
namespace {

constexpr double kU = kFp32UnitRoundoff;

bool IsPowerOfTwo(float t) {
  int e = 0;
  return t > 0 && std::frexp(static_cast<double>(t), &e) == 0.5;
}

// One row's values, without the top-k and ranks.
struct LpRow {
  double lse = 0, lse_bound = 0, entropy = 0, entropy_bound = 0, b = 0;
};

// z and e_z of one row over the first v entries of y.
double RowZ(const double* y, const double* y_err, std::int64_t v, const LpRequest& rq, double* z,
            double* ez) {
  const double cap = rq.logit_softcap;
  const double t = rq.temperature;
  double b = 0;
  for (std::int64_t j = 0; j < v; ++j) {
    const double dy = y_err != nullptr ? y_err[j] : 0.0;
    double c = y[j], ec = dy;
    if (cap > 0) {
      const double th = std::tanh(y[j] / cap);
      c = cap * th;
      ec = (1 - th * th + 2 * dy / cap) * (dy + kU * std::fabs(y[j])) + 4 * kU * std::fabs(c);
    }
    z[j] = c / t;
    ez[j] = ec / t + (y_err != nullptr && t != 1.0 ? kU * std::fabs(z[j]) : 0.0);
    b = std::max(b, ez[j]);
  }
  return b;
}

LpRow ReferenceRow(const double* z, const double* ez, std::int64_t v, double b) {
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < v; ++j) mx = std::max(mx, z[j]);
  double sum_exp = 0;
  for (std::int64_t j = 0; j < v; ++j) sum_exp += std::exp(z[j] - mx);
  const double log_s = std::log(sum_exp);
  LpRow out;
  out.b = b;
  out.lse = mx + log_s;
  const double gamma = Gamma(2 * v, kU);
  double weighted_ez = 0, weighted_exp = 0, mean_d = 0, weighted_d = 0, h = 0;
  for (std::int64_t j = 0; j < v; ++j) {
    const double p = std::exp(z[j] - out.lse);
    const double d = mx - z[j];
    weighted_ez += p * ez[j];
    weighted_exp += p * (3 + 2.2 * d);
    mean_d += p * d;
    weighted_d += p * d * ((4 + 2.2 * d) * kU + 2 * gamma);
    h += p * (out.lse - z[j]);
  }
  const double eval = gamma + kU * weighted_exp + 2 * kU * (2 + log_s) + kU * std::fabs(out.lse);
  const double fp64 = Gamma(v, kFp64UnitRoundoff);
  out.lse_bound = 2 * (weighted_ez + eval) + fp64 * (std::fabs(out.lse) + 1);
  out.entropy = h;
  const double eval_h = eval + weighted_d + kU * (mean_d + h);
  out.entropy_bound = h * std::expm1(2 * b) + 2 * eval_h + fp64 * (h + mean_d + 1);
  return out;
}

// Whether (za, a) ranks before (zb, b): z descending, ties to the lower id.
bool Before(double za, std::int64_t a, double zb, std::int64_t b) {
  return za != zb ? za > zb : a < b;
}

}  // namespace

client::LogProbsOptions LpRequest::Options() const {
  client::LogProbsOptions o;
  o.ignore_index = ignore_index;
  o.temperature = temperature;
  o.logit_softcap = logit_softcap;
  o.top_k = top_k;
  o.want_entropy = true;
  o.want_lse = true;
  o.want_rank = !targets.empty();
  o.vocab_size = vocab_size;
  return o;
}

Tensor LpRequest::TargetsTensor() const {
  Tensor t(DType::kInt64, {static_cast<std::int64_t>(targets.size())});
  std::memcpy(t.data<std::int64_t>(), targets.data(), targets.size() * sizeof(std::int64_t));
  return t;
}

LpReference LogProbsReference(const std::vector<double>& y, const std::vector<double>* y_err,
                              std::int64_t m, std::int64_t v, const LpRequest& rq) {
  LpReference ref;
  ref.m = m;
  ref.v = rq.vocab_size > 0 ? std::min(rq.vocab_size, v) : v;
  ref.exact = y_err == nullptr && rq.logit_softcap == 0 && IsPowerOfTwo(rq.temperature);
  const std::int64_t vv = ref.v;
  const std::size_t rows = static_cast<std::size_t>(m);
  for (auto* vec : {&ref.lse, &ref.lse_bound, &ref.logprob, &ref.logprob_bound, &ref.entropy,
                    &ref.entropy_bound, &ref.z_bound}) {
    vec->assign(rows, 0.0);
  }
  ref.z.resize(rows * static_cast<std::size_t>(vv));
  ref.order_cols = std::min(rq.top_k + 1, vv);
  ref.order.resize(rows * static_cast<std::size_t>(ref.order_cols));
  ref.rank.assign(rows, -1);
  ref.rank_low.assign(rows, -1);
  ref.rank_high.assign(rows, -1);
  std::vector<double> ez(static_cast<std::size_t>(vv));
  std::vector<std::int64_t> ids(static_cast<std::size_t>(vv));
  for (std::int64_t i = 0; i < m; ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    double* z = ref.z.data() + i * vv;
    const double b = RowZ(y.data() + i * v, y_err != nullptr ? y_err->data() + i * v : nullptr, vv,
                          rq, z, ez.data());
    const LpRow row = ReferenceRow(z, ez.data(), vv, b);
    ref.lse[s] = row.lse;
    ref.lse_bound[s] = row.lse_bound;
    ref.entropy[s] = row.entropy;
    ref.entropy_bound[s] = row.entropy_bound;
    ref.z_bound[s] = b;
    std::iota(ids.begin(), ids.end(), std::int64_t{0});
    const auto mid = ids.begin() + ref.order_cols;
    std::partial_sort(ids.begin(), mid, ids.end(),
                      [z](std::int64_t a, std::int64_t c) { return Before(z[a], a, z[c], c); });
    std::copy(ids.begin(), mid, ref.order.begin() + i * ref.order_cols);
    if (rq.targets.empty() || rq.Ignored(i)) continue;
    const std::int64_t t = rq.targets[s];
    const double zt = z[t];
    ref.logprob[s] = zt - row.lse;
    ref.logprob_bound[s] = row.lse_bound + 2 * ez[static_cast<std::size_t>(t)] +
                           4 * kU * (std::fabs(row.lse) + std::fabs(zt) + std::fabs(zt - row.lse));
    std::int64_t rank = 0, low = 0, high = 0;
    for (std::int64_t j = 0; j < vv; ++j) {
      if (j == t) continue;
      rank += Before(z[j], j, zt, t) ? 1 : 0;
      low += z[j] > zt + 2 * b ? 1 : 0;
      high += z[j] >= zt - 2 * b ? 1 : 0;
    }
    ref.rank[s] = rank;
    ref.rank_low[s] = ref.exact ? rank : low;
    ref.rank_high[s] = ref.exact ? rank : high;
  }
  return ref;
}

namespace {

// Largest |got − want| against its bound, and the first violation.
struct Tracker {
  std::int64_t compared = 0;
  std::int64_t violations = 0;
  std::int64_t first = -1;
  double first_got = 0, first_want = 0, first_bound = 0;
  double max_abs = 0, worst = 0;

  void Add(std::int64_t i, double got, double want, double bound) {
    ++compared;
    const double err = std::fabs(got - want);
    if (!(err <= bound) && violations++ == 0) {
      first = i;
      first_got = got;
      first_want = want;
      first_bound = bound;
    }
    max_abs = std::isfinite(err) ? std::max(max_abs, err) : err;
    if (bound > 0) worst = std::max(worst, err / bound);
    if (bound == 0 && err > 0) worst = std::numeric_limits<double>::infinity();
  }
  void Report(CaseResult& r, const std::string& what,
              const std::vector<std::int64_t>& shape) const {
    r.Check(violations == 0,
            absl::StrFormat("%s: %d of %d values outside their bound; first %s: got %.9g, fp64 "
                            "reference %.17g, bound %.3e",
                            what, violations, compared, IndexString(first, shape), first_got,
                            first_want, first_bound));
  }
  nlohmann::ordered_json Json() const {
    return {{"compared", compared},
            {"violations", violations},
            {"max_abs_err", JsonNumber(max_abs)},
            {"worst_bound_fraction", JsonNumber(worst)}};
  }
};

bool HasTensor(CaseResult& r, const std::optional<Tensor>& t, DType dtype,
               const std::vector<std::int64_t>& shape, const std::string& what) {
  if (!r.Check(t.has_value(), absl::StrCat(what, ": not returned"))) return false;
  return r.Check(t->dtype() == dtype && t->shape() == shape,
                 absl::StrCat(what, ": expected ", DTypeName(dtype), " ", ShapeString(shape),
                              ", got ", DTypeName(t->dtype()), " ", ShapeString(t->shape())));
}

// lse, entropy and logprob (ignored tokens: +0 exactly).
void CheckRows(const LpReference& ref, const LpRequest& rq, const client::LogProbsResult& got,
               CaseResult& r, const std::string& label, LpErrors& e, nlohmann::ordered_json& fig) {
  const std::vector<std::int64_t> shape = {ref.m};
  Tracker lse, entropy, logprob;
  if (HasTensor(r, got.lse, DType::kFp32, shape, label + " lse")) {
    const float* g = got.lse->data<float>();
    for (std::int64_t i = 0; i < ref.m; ++i) lse.Add(i, g[i], ref.lse[i], ref.lse_bound[i]);
    lse.Report(r, label + " lse", shape);
    fig["lse"] = lse.Json();
  }
  if (HasTensor(r, got.entropy, DType::kFp32, shape, label + " entropy")) {
    const float* g = got.entropy->data<float>();
    for (std::int64_t i = 0; i < ref.m; ++i) {
      entropy.Add(i, g[i], ref.entropy[i], ref.entropy_bound[i]);
    }
    entropy.Report(r, label + " entropy", shape);
    fig["entropy"] = entropy.Json();
  }
  if (!rq.targets.empty() && HasTensor(r, got.logprob, DType::kFp32, shape, label + " logprob")) {
    const float* g = got.logprob->data<float>();
    std::int64_t bad_ignored = 0;
    for (std::int64_t i = 0; i < ref.m; ++i) {
      if (rq.Ignored(i)) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &g[i], sizeof bits);
        bad_ignored += bits != 0 ? 1 : 0;
        continue;
      }
      logprob.Add(i, g[i], ref.logprob[i], ref.logprob_bound[i]);
    }
    logprob.Report(r, label + " logprob", shape);
    r.Check(bad_ignored == 0,
            absl::StrCat(label, " logprob: ", bad_ignored, " ignored tokens are not +0"));
    fig["logprob"] = logprob.Json();
  }
  e.lse_worst_fraction = lse.worst;
  e.entropy_worst_fraction = entropy.worst;
  e.logprob_worst_fraction = logprob.worst;
  e.logprob_max_abs = logprob.max_abs;
  e.violations += lse.violations + entropy.violations + logprob.violations;
}

// Top-k ids and log-probs (see the separation rule at the top).
void CheckTopK(const LpReference& ref, const LpRequest& rq, const client::LogProbsResult& got,
               CaseResult& r, const std::string& label, LpErrors& e, nlohmann::ordered_json& fig) {
  const std::int64_t k = rq.top_k;
  const std::vector<std::int64_t> shape = {ref.m, k};
  if (!HasTensor(r, got.topk_ids, DType::kInt32, shape, label + " topk_ids") ||
      !HasTensor(r, got.topk_logprobs, DType::kFp32, shape, label + " topk_logprobs")) {
    return;
  }
  const std::int32_t* ids = got.topk_ids->data<std::int32_t>();
  const float* lps = got.topk_logprobs->data<float>();
  Tracker lp;
  std::int64_t bad_ids = 0, differing = 0, unsorted = 0, first_diff = -1;
  for (std::int64_t i = 0; i < ref.m; ++i) {
    const double* z = ref.z.data() + i * ref.v;
    const std::int64_t* want = ref.order.data() + i * ref.order_cols;
    const double sep = 2 * ref.z_bound[i];
    std::vector<std::int32_t> seen(ids + i * k, ids + (i + 1) * k);
    std::sort(seen.begin(), seen.end());
    bad_ids += std::adjacent_find(seen.begin(), seen.end()) != seen.end() ? 1 : 0;
    for (std::int64_t p = 0; p < k; ++p) {
      const std::int64_t at = i * k + p;
      const std::int64_t id = ids[at];
      if (id < 0 || id >= ref.v) {
        ++bad_ids;
        continue;
      }
      const double zp = z[want[p]];
      const bool decided = ref.exact || ((p == 0 || z[want[p - 1]] - zp > sep) &&
                                         (p + 1 >= ref.order_cols || zp - z[want[p + 1]] > sep));
      if (decided) {
        ++e.topk_decided;
        if (id != want[p] && differing++ == 0) first_diff = at;
      }
      const double lp_want = z[id] - ref.lse[i];
      lp.Add(at, lps[at], lp_want,
             ref.z_bound[i] + ref.lse_bound[i] +
                 4 * kU * (std::fabs(ref.lse[i]) + std::fabs(z[id]) + std::fabs(lp_want)));
      if (p > 0 && !(lps[at] <= lps[at - 1])) ++unsorted;
    }
  }
  e.topk_places = ref.m * k;
  r.Check(bad_ids == 0, absl::StrCat(label, " topk_ids: ", bad_ids, " ids outside [0, ", ref.v,
                                     ") or repeated within a row"));
  r.Check(differing == 0,
          absl::StrCat(
              label, " topk_ids: ", differing, " of ", e.topk_decided,
              " decided places differ from the reference's; first ", IndexString(first_diff, shape),
              ": got ", first_diff >= 0 ? ids[first_diff] : 0, " want ",
              first_diff >= 0 ? ref.order[(first_diff / k) * ref.order_cols + first_diff % k] : 0));
  r.Check(unsorted == 0,
          absl::StrCat(label, " topk_logprobs: ", unsorted, " places rise above the one before"));
  lp.Report(r, label + " topk_logprobs", shape);
  e.topk_logprob_worst_fraction = lp.worst;
  e.violations += lp.violations + differing + bad_ids + unsorted;
  fig["topk"] = {{"k", k},
                 {"places", e.topk_places},
                 {"decided", e.topk_decided},
                 {"differing", differing},
                 {"logprobs", lp.Json()}};
}

void CheckRanks(const LpReference& ref, const LpRequest& rq, const client::LogProbsResult& got,
                CaseResult& r, const std::string& label, LpErrors& e, nlohmann::ordered_json& fig) {
  const std::vector<std::int64_t> shape = {ref.m};
  if (!HasTensor(r, got.rank, DType::kInt64, shape, label + " rank")) return;
  const std::int64_t* g = got.rank->data<std::int64_t>();
  std::int64_t outside = 0, first = -1, exact_equal = 0;
  for (std::int64_t i = 0; i < ref.m; ++i) {
    const bool ok =
        rq.Ignored(i) ? g[i] == -1 : g[i] >= ref.rank_low[i] && g[i] <= ref.rank_high[i];
    exact_equal += g[i] == ref.rank[i] ? 1 : 0;
    if (!ok && outside++ == 0) first = i;
  }
  const std::size_t f = static_cast<std::size_t>(std::max<std::int64_t>(first, 0));
  r.Check(outside == 0, absl::StrCat(label, " rank: ", outside, " of ", ref.m,
                                     " ranks outside [surely above, possibly above]; first [",
                                     first, "]: got ", first >= 0 ? g[first] : 0, ", allowed [",
                                     ref.rank_low[f], ", ", ref.rank_high[f], "]"));
  e.violations += outside;
  fig["rank"] = {{"compared", ref.m}, {"outside", outside}, {"equal_to_reference", exact_equal}};
}

}  // namespace

LpErrors CheckLogProbs(const LpReference& ref, const LpRequest& request,
                       const client::LogProbsResult& got, CaseResult& r, const std::string& label) {
  LpErrors e;
  nlohmann::ordered_json fig = nlohmann::ordered_json::object();
  fig["max_z_bound"] = JsonNumber(*std::max_element(ref.z_bound.begin(), ref.z_bound.end()));
  CheckRows(ref, request, got, r, label, e, fig);
  if (request.top_k > 0) CheckTopK(ref, request, got, r, label, e, fig);
  if (!request.targets.empty()) CheckRanks(ref, request, got, r, label, e, fig);
  fig["violations"] = e.violations;
  r.figures[label] = fig;
  return e;
}

LpReference ComputeLogProbsReference(const Tensor& x, const Tensor& w, const LpRequest& request,
                                     bool exact_logits) {
  std::vector<double> y, y_err;
  ReferenceLogits(x, w, exact_logits, &y, &y_err);
  return LogProbsReference(y, exact_logits ? nullptr : &y_err, x.dim(0), w.dim(0), request);
}

}  // namespace logitd::validate
