#include "tests/reference/verdict_library.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "logitd/bf16.h"
#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/verify_checks.h"

namespace logitd::verdicts {
namespace {

std::vector<float> Widen(const std::vector<Bf16Bits>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(v[i]);
  return out;
}

std::vector<float> CastG(const std::vector<float>& dy) {
  std::vector<float> g(dy.size());
  for (std::size_t i = 0; i < dy.size(); ++i) g[i] = RoundToBf16(dy[i]);
  return g;
}

// logitd's own output on the cpu backend: bf16 widened exactly, OpenBLAS
// sgemm, alpha applied to the fp32 result.
std::vector<float> Own(const CaseInputs& in, Output output, float alpha) {
  const emulated::LmHeadCase& c = in.c;
  const int m = static_cast<int>(c.m), v = static_cast<int>(c.v), k = static_cast<int>(c.k);
  const std::vector<float> x = Widen(c.x), w = Widen(c.w);
  std::vector<float> out;
  if (output == Output::kLogits) {
    out.resize(static_cast<std::size_t>(m) * v);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, v, k, 1.0f, x.data(), k, w.data(), k,
                0.0f, out.data(), v);
    if (alpha != 1.0f) {
      for (float& f : out) f *= alpha;
    }
    return out;
  }
  const std::vector<float> g = CastG(in.dy);
  if (output == Output::kGradInput) {
    out.resize(static_cast<std::size_t>(m) * k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, v, 1.0f, g.data(), v, w.data(), k,
                0.0f, out.data(), k);
    return out;
  }
  out.resize(static_cast<std::size_t>(v) * k);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v, k, m, 1.0f, g.data(), v, x.data(), k,
              0.0f, out.data(), k);
  return out;
}

void Apply(Change change, std::int64_t cols, std::vector<float>* out) {
  std::vector<float>& o = *out;
  if (change == Change::kOneElementPlus1Percent) {
    std::vector<std::pair<float, std::int64_t>> row;
    for (std::int64_t j = 0; j < cols; ++j) row.push_back({std::fabs(o[j]), j});
    std::nth_element(row.begin(), row.begin() + cols / 2, row.end());
    o[row[cols / 2].second] *= 1.01f;
  } else if (change == Change::kRowShifted) {
    std::rotate(o.begin(), o.begin() + 1, o.begin() + cols);
  }
}

// A check's verdict and figures, as the library reports them.
Judged JudgedOf(const CandidateCheck& check, const char* name,
                const std::vector<std::int64_t>& shape) {
  Judged j;
  j.verdict = check.Verdict();
  j.passed = check.passed();
  j.outside_bound = check.outside() > 0;
  const PrecisionClassFigures& p = check.precision_class();
  j.rms_ratio = p.rms_ratio;
  j.threshold = p.threshold;
  j.effective_bits = p.effective_bits;
  j.class_bits = p.class_bits;
  j.describe = check.Describe(name, shape);
  return j;
}

}  // namespace

const char* OutputName(Output output) {
  switch (output) {
    case Output::kLogits:
      return "y";
    case Output::kGradInput:
      return "dx";
    case Output::kGradWeight:
      return "dw";
  }
  return "?";
}

const char* ChangeName(Change change) {
  switch (change) {
    case Change::kNone:
      return "";
    case Change::kOneElementPlus1Percent:
      return "one element +1%";
    case Change::kRowShifted:
      return "a row shifted by one column";
    case Change::kMissingCast:
      return "the gradient cast missing";
  }
  return "?";
}

CaseInputs MakeInputs(const std::string& kind, std::int64_t m, std::int64_t v, std::int64_t k,
                      std::uint64_t seed) {
  CaseInputs in{emulated::MakeCase(kind, m, v, k, seed), {}};
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  in.dy.resize(static_cast<std::size_t>(m * v));
  for (float& f : in.dy) f = normal(rng);
  return in;
}

Judged JudgeImplementation(const emulated::Implementation& impl, const CaseInputs& in,
                           Output output, Change change, float alpha) {
  const emulated::LmHeadCase& c = in.c;
  const bool cast = change != Change::kMissingCast;
  std::vector<float> candidate;
  std::int64_t cols = 0;
  switch (output) {
    case Output::kLogits:
      candidate = emulated::Logits(impl, c.x, c.w, c.m, c.v, c.k, alpha);
      cols = c.v;
      break;
    case Output::kGradInput:
      candidate = emulated::GradInput(impl, in.dy, c.w, c.m, c.v, c.k, cast);
      cols = c.k;
      break;
    case Output::kGradWeight:
      candidate = emulated::GradWeight(impl, in.dy, c.x, c.m, c.v, c.k, cast);
      cols = c.k;
      break;
  }
  Apply(change, cols, &candidate);
  const std::vector<float> own = Own(in, output, alpha);
  LmHeadInputs inputs = LmHeadInputs::Forward(c.x.data(), c.w.data(), c.m, c.v, c.k);
  inputs.dy = in.dy.data();
  inputs.dy_dtype = DType::kFp32;
  CandidateCheck check(DType::kFp32);
  if (output == Output::kLogits) {
    CheckLogits(inputs, alpha, {}, candidate.data(), own.data(), DType::kFp32, &check);
  } else if (output == Output::kGradInput) {
    CheckGradInput(inputs, {}, candidate.data(), own.data(), DType::kFp32, &check);
  } else {
    CheckGradWeight(inputs, candidate.data(), own.data(), DType::kFp32, &check);
  }
  return JudgedOf(
      check, OutputName(output),
      {output == Output::kGradWeight ? c.v : c.m, output == Output::kLogits ? c.v : c.k});
}

std::vector<std::int64_t> MakeTargets(std::int64_t m, std::int64_t v, std::uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x7a6e);
  std::uniform_int_distribution<std::int64_t> id(0, v - 1);
  std::vector<std::int64_t> targets(static_cast<std::size_t>(m));
  for (std::int64_t& t : targets) t = id(rng);
  return targets;
}

namespace {

// The conforming fp32 softmax of JudgeCrossEntropy over logits [m, v]:
// loss and lse [m] each.
void SoftmaxOutputs(const std::vector<float>& logits, std::int64_t m, std::int64_t v,
                    const std::vector<std::int64_t>& targets, bool fast_exp,
                    std::vector<float>* loss, std::vector<float>* lse) {
  loss->resize(static_cast<std::size_t>(m));
  lse->resize(loss->size());
  for (std::int64_t i = 0; i < m; ++i) {
    const float* z = logits.data() + i * v;
    float mx = z[0];
    for (std::int64_t j = 1; j < v; ++j) mx = std::max(mx, z[j]);
    float sum = 0;
    for (std::int64_t j = 0; j < v; ++j) {
      const float a = z[j] - mx;
      sum += fast_exp ? std::exp2f(a * 1.44269504f) : std::exp(a);
    }
    const float l = mx + std::log(sum);
    (*lse)[static_cast<std::size_t>(i)] = l;
    (*loss)[static_cast<std::size_t>(i)] = l - z[targets[static_cast<std::size_t>(i)]];
  }
}

// The conforming fp32 softmax's gradient g = (p − onehot)·scale over
// logits [m, v], [m, v] in fp32.
std::vector<float> SoftmaxGradient(const std::vector<float>& logits, std::int64_t m, std::int64_t v,
                                   const std::vector<std::int64_t>& targets, bool fast_exp,
                                   float scale) {
  std::vector<float> loss, lse;
  SoftmaxOutputs(logits, m, v, targets, fast_exp, &loss, &lse);
  std::vector<float> g(logits.size());
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < v; ++j) {
      const std::size_t e = static_cast<std::size_t>(i * v + j);
      const float a = logits[e] - lse[static_cast<std::size_t>(i)];
      const float p = fast_exp ? std::exp2f(a * 1.44269504f) : std::exp(a);
      g[e] = (p - (targets[static_cast<std::size_t>(i)] == j ? 1.0f : 0.0f)) * scale;
    }
  }
  return g;
}

}  // namespace

CeGradJudged JudgeCrossEntropyGradients(const emulated::Implementation* logits_impl,
                                        const emulated::Implementation& sum_impl,
                                        const CaseInputs& in,
                                        const std::vector<std::int64_t>& targets, GradientPath path,
                                        double scale_error, bool fast_exp) {
  const emulated::LmHeadCase& c = in.c;
  const std::vector<float> own_logits = Own(in, Output::kLogits, 1.0f);
  std::vector<float> logits =
      logits_impl != nullptr ? emulated::Logits(*logits_impl, c.x, c.w, c.m, c.v, c.k) : own_logits;
  if (path == GradientPath::kBf16Logits) {
    for (float& f : logits) f = RoundToBf16(f);
  }
  const float scale = 1.0f / static_cast<float>(c.m);
  std::vector<float> g = SoftmaxGradient(logits, c.m, c.v, targets, fast_exp, scale);
  if (path == GradientPath::kScaled) {
    for (float& f : g) f = static_cast<float>(f * (1 + scale_error));
  }
  const std::vector<float> own_g = SoftmaxGradient(own_logits, c.m, c.v, targets, false, scale);
  CaseInputs own_in{c, own_g};
  const std::vector<float> own_dx = Own(own_in, Output::kGradInput, 1.0f);
  const std::vector<float> own_dw = Own(own_in, Output::kGradWeight, 1.0f);
  const std::vector<float> dx = emulated::GradInput(sum_impl, g, c.w, c.m, c.v, c.k);
  const std::vector<float> dw = emulated::GradWeight(sum_impl, g, c.x, c.m, c.v, c.k);
  const LmHeadInputs inputs = LmHeadInputs::Forward(c.x.data(), c.w.data(), c.m, c.v, c.k);
  CeReferenceOptions options;
  options.reduction = CeReduction::kMean;
  options.class_envelope = true;
  CeGradients grads;
  CrossEntropyReference ref;
  ReferenceCrossEntropy(inputs, targets.data(), options, LogitModel::kFp32Sum, &ref,
                        [&](std::int64_t row0, std::int64_t rows, const double* gb,
                            const double* eb, const double* fm, const double* fv) {
                          const std::size_t n = static_cast<std::size_t>(rows * c.v);
                          grads.g.insert(grads.g.end(), gb, gb + n);
                          grads.pre_err.insert(grads.pre_err.end(), eb, eb + n);
                          if (fm != nullptr) {
                            grads.flip_mean.insert(grads.flip_mean.end(), fm, fm + n);
                            grads.flip_var.insert(grads.flip_var.end(), fv, fv + n);
                          }
                          (void)row0;
                        });
  const std::int64_t tokens = DistinctTokens(inputs, targets.data());
  CandidateCheck dx_check(DType::kFp32), dw_check(DType::kFp32);
  CheckCrossEntropyGradient(false, inputs, {}, grads, tokens, dx.data(), own_dx.data(),
                            DType::kFp32, &dx_check);
  CheckCrossEntropyGradient(true, inputs, {}, grads, tokens, dw.data(), own_dw.data(), DType::kFp32,
                            &dw_check);
  return CeGradJudged{JudgedOf(dx_check, "dx", {c.m, c.k}), JudgedOf(dw_check, "dw", {c.v, c.k})};
}

CeJudged JudgeCrossEntropy(const emulated::Implementation* impl, const CaseInputs& in,
                           const std::vector<std::int64_t>& targets, bool bf16_logits,
                           bool fast_exp) {
  const emulated::LmHeadCase& c = in.c;
  const std::vector<float> own_logits = Own(in, Output::kLogits, 1.0f);
  std::vector<float> logits =
      impl != nullptr ? emulated::Logits(*impl, c.x, c.w, c.m, c.v, c.k) : own_logits;
  if (bf16_logits) {
    for (float& f : logits) f = RoundToBf16(f);
  }
  std::vector<float> loss, lse, own_loss, own_lse;
  SoftmaxOutputs(logits, c.m, c.v, targets, fast_exp, &loss, &lse);
  SoftmaxOutputs(own_logits, c.m, c.v, targets, false, &own_loss, &own_lse);
  const LmHeadInputs inputs = LmHeadInputs::Forward(c.x.data(), c.w.data(), c.m, c.v, c.k);
  CeReferenceOptions options;
  options.reduction = CeReduction::kNone;
  options.class_envelope = true;
  CrossEntropyReference ref;
  ReferenceCrossEntropy(inputs, targets.data(), options, LogitModel::kFp32Sum, &ref);
  const std::int64_t independent = DistinctTokens(inputs, targets.data());
  CandidateCheck loss_check(DType::kFp32), lse_check(DType::kFp32);
  CheckTokenValues(ref.loss, ref.loss_bound, ref.loss_class, {}, loss.data(), own_loss.data(),
                   independent, &loss_check);
  CheckTokenValues(ref.lse, ref.lse_bound, ref.lse_class, {}, lse.data(), own_lse.data(),
                   DistinctTokens(inputs, nullptr), &lse_check);
  return CeJudged{JudgedOf(loss_check, "loss", {c.m}), JudgedOf(lse_check, "lse", {c.m})};
}

}  // namespace logitd::verdicts
