// The logprobs suite's reference and checks.
//
// The reference and its bounds come from logitd_reference
// (logitd/reference/logprobs.h; the derivation of every bound, the top-k
// separation rule and the rank interval are at the top of its logprobs.cc).
// This file gathers z whole and checks the server's outputs against them:
// lse, logprob, entropy and top-k log-probs inside their bounds, top-k ids
// equal to the reference's at every decided place, ranks between the
// surely-above and possibly-above counts.

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
#include "client/validate/report.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {
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

LpReferenceOptions LpRequest::ReferenceOptions() const {
  LpReferenceOptions o;
  o.ignore_index = ignore_index;
  o.temperature = temperature;
  o.logit_softcap = logit_softcap;
  o.top_k = top_k;
  o.vocab_size = vocab_size;
  return o;
}

Tensor LpRequest::TargetsTensor() const {
  Tensor t(DType::kInt64, {static_cast<std::int64_t>(targets.size())});
  std::memcpy(t.data<std::int64_t>(), targets.data(), targets.size() * sizeof(std::int64_t));
  return t;
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
      if (TopKPlaceDecided(ref, i, p)) {
        ++e.topk_decided;
        if (id != want[p] && differing++ == 0) first_diff = at;
      }
      const double lp_want = z[id] - ref.lse[i];
      lp.Add(at, lps[at], lp_want, TopKLogProbBound(ref, i, z[id]));
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
                                     LogitModel logits) {
  LmHeadInputs in =
      LmHeadInputs::Forward(x.data<Bf16Bits>(), w.data<Bf16Bits>(), x.dim(0), w.dim(0), x.dim(1));
  LpReference ref;
  std::vector<double> z;
  ReferenceLogProbs(in, request.targets.empty() ? nullptr : request.targets.data(),
                    request.ReferenceOptions(), logits, &ref,
                    [&](std::int64_t row0, std::int64_t rows, const double* block) {
                      // ref.v, the vocabulary that counts, is set before the first block.
                      z.resize(static_cast<std::size_t>(ref.m * ref.v));
                      std::copy(block, block + rows * ref.v, z.begin() + row0 * ref.v);
                    });
  ref.z = std::move(z);
  return ref;
}

}  // namespace logitd::validate
