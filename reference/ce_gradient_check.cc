// The cross-entropy's dX and dW candidates (verify_checks.h,
// CheckCrossEntropyGradient): the proven bound of cross_entropy.cc, and the
// precision-class test of the gradients (docs/PROTOCOL.md, "The
// precision-class test of the gradients").
//
// A conforming implementation forms g in fp32 from its fp32 logits, casts
// it to G = bf16(g) and sums G·W (G^T·X) in fp32. Against the exact
// product of the exact g, its error at an element is
//   E = (G_m − g)·W       the cast of G_m = ModelCast(g), the G of an fp32 g
//                        nearest the exact one, formed exactly in fp64;
//   Φ                    the flips: another conforming g, off by an error of
//                        scale sigma (the class envelopes of its logits and
//                        softmax), rounds to another bf16 value than G_m
//                        where it crosses a midpoint between g's bf16
//                        neighbours (CastFlip): Φ = Σ_v b_v·w_v, b_v the
//                        change, of mean μ_v and variance at most q_v, so
//                        E[Φ²] ≤ (Σ μ_v·w_v)² + Σ q_v·w_v², both formed
//                        exactly (W² on the host);
//   the fp32 sum          of the exact products G·W: the sequential fp32
//                        sum's error and the tensor-core model's, formed on
//                        the same inputs (accumulation_models.h), half an
//                        ulp and the floor ClassFloor(n), as the logits'
//                        test forms them (judgement::ClassTermsOf).
// The envelope of an element is max(the sequential model's error, |E| +
// the tensor-core model's, half an ulp, the floor, logitd's own error) +
// sqrt((Σ μ·w)² + Σ q·w²), a sum of magnitudes (sound for any correlation
// of the three parts); the rows and the tensor are then tested as the
// logits' are (precision_class.h), with at most `tokens` distinct rows of
// G and the classes of W's columns (X's for dW) independent.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "logit_rows.h"
#include "logitd/bf16.h"
#include "logitd/reference/accumulation_models.h"
#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/element_judgement.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/precision_class.h"
#include "logitd/reference/verify_checks.h"

namespace logitd {
namespace {

// The terms of one element (judgement::ClassTermsOf's, for a G the
// candidate forms itself): `model` is the exact ModelCast(g)·W, `seq` and
// `tc` the models of its fp32 sum, `flips` the flips' envelope.
judgement::ClassTerms GradientClassTerms(bool bf16, double candidate, double own, double reference,
                                         double model, double abs_sum, float seq, double tc,
                                         double flips, double floor) {
  if (!(std::isfinite(model) && std::isfinite(flips))) return {};
  // The tensor-core model's error is of the sum G_m·W, whose own error
  // against the exact g's product is the cast's, E = model − reference.
  judgement::ClassTerms t = judgement::ClassTermsOf(bf16, candidate, own, reference, abs_sum, seq,
                                                    std::fabs(model - reference) + tc, floor);
  if (t.counted) t.envelope += flips / t.w;
  return t;
}

// A block's class inputs, per element of the product [rows, K]: the exact
// ModelCast(g) product, its magnitudes, the models of its fp32 sum and the
// flips' envelope.
struct ClassBlock {
  std::vector<double> model, abs_sum, tc, flips;
  std::vector<float> seq;
};

// The flips' envelope of each element: sqrt(mean² + var).
void FlipEnvelope(const std::vector<double>& mean, const std::vector<double>& var,
                  std::vector<double>* out) {
  out->resize(mean.size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    (*out)[i] = std::sqrt(mean[i] * mean[i] + var[i]);
  }
}

// The models of a [rows, n] × [n, cols] product on threads (a given as
// floats row-major, the other operand through `panel`).
void Models(const std::vector<float>& a, std::int64_t rows, std::int64_t cols, std::int64_t n,
            const PanelOf& panel, ClassBlock* b) {
  b->seq.resize(static_cast<std::size_t>(rows * cols));
  b->tc.resize(b->seq.size());
  reference_internal::ForRowsInParallel(rows, rows * cols * std::max<std::int64_t>(1, n / 16),
                                        [&](std::int64_t first, std::int64_t last, int /*part*/) {
                                          ModelSums(a.data() + first * n, last - first, cols, n,
                                                    panel, b->seq.data() + first * cols,
                                                    b->tc.data() + first * cols);
                                        });
}

// out [rows, k] = q [rows, v] (row stride ldq) · W² for W [v, k] bf16,
// W² formed a panel of its rows at a time.
void TimesSquares(const double* q, std::int64_t ldq, std::int64_t rows, const Bf16Bits* w,
                  std::int64_t v, std::int64_t k, double* out) {
  constexpr std::int64_t kPanelElements = std::int64_t{1} << 22;
  const std::int64_t panel_rows =
      std::max<std::int64_t>(1, kPanelElements / std::max<std::int64_t>(k, 1));
  std::vector<double> sq(static_cast<std::size_t>(std::min(panel_rows, v) * k));
  std::fill(out, out + rows * k, 0.0);
  for (std::int64_t j0 = 0; j0 < v; j0 += panel_rows) {
    const std::int64_t n = std::min(panel_rows, v - j0);
    for (std::int64_t e = 0; e < n * k; ++e) {
      const double x = Bf16ToFloat(w[j0 * k + e]);
      sq[static_cast<std::size_t>(e)] = x * x;
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(n), 1.0, q + j0, static_cast<int>(ldq),
                sq.data(), static_cast<int>(k), 1.0, out, static_cast<int>(k));
  }
}

// One CheckCrossEntropyGradient call: its operands, the class inputs it
// forms once (dW's), and the block of class inputs its rows reuse.
class GradientCheck {
 public:
  GradientCheck(bool dw, const LmHeadInputs& in, const CheckedRows& rows_checked,
                const CeGradients& g, const void* candidate, const void* own, DType dtype,
                CandidateCheck* check)
      : dw_(dw),
        in_(in),
        rows_checked_(rows_checked),
        g_(g),
        candidate_(candidate),
        own_(own),
        check_(check),
        m_(in.m),
        v_(in.v),
        k_(in.k),
        size_(dtype == DType::kBf16 ? 2 : 4),
        bf16_(dtype == DType::kBf16),
        classed_(!g.flip_mean.empty()) {}

  bool classed() const { return classed_; }

  // The class envelope's name and the independent errors of the classes
  // (with `tokens` distinct rows of G).
  void LimitClasses(std::int64_t tokens);
  // The floor of the class terms, set once the classes are limited.
  void SetFloor() { floor_ = judgement::ClassFloor(dw_ ? m_ : v_); }
  // dW's class inputs over the whole of G and X.
  void FormWholeOperands();
  // The check of the reference's rows [row0, row0 + rows) of the product,
  // their values and bounds (a RowBlockSink).
  void Add(std::int64_t row0, std::int64_t rows, const double* value, const double* bound);

 private:
  const std::byte* At(const void* base, std::int64_t index) const {
    return static_cast<const std::byte*>(base) + static_cast<std::size_t>(index) * size_;
  }
  double ValueAt(const void* base, std::int64_t index) const;
  // The call's row of dX's reference row j.
  std::int64_t CallRow(std::int64_t j) const {
    return dw_ || rows_checked_.empty() ? j : rows_checked_[static_cast<std::size_t>(j)];
  }
  // The class inputs of the product's rows [r0, r0 + rows) (dW's rows are
  // columns of G).
  void FormClassBlock(std::int64_t r0, std::int64_t rows, ClassBlock* b) const;
  void GradInputClassBlock(std::int64_t r0, std::int64_t rows, ClassBlock* b,
                           std::vector<double>* mean, std::vector<double>* var) const;
  void GradWeightClassBlock(std::int64_t r0, std::int64_t rows, ClassBlock* b,
                            std::vector<double>* mean, std::vector<double>* var) const;

  const bool dw_;
  const LmHeadInputs& in_;
  const CheckedRows& rows_checked_;
  const CeGradients& g_;
  const void* const candidate_;
  const void* const own_;
  CandidateCheck* const check_;
  const std::int64_t m_, v_, k_;
  const std::size_t size_;
  const bool bf16_;
  const bool classed_;
  double floor_ = 0;
  std::vector<double> gm_whole_, gm_abs_whole_, xd_, x_abs_, x_sq_;
  ClassBlock block_;
};

double GradientCheck::ValueAt(const void* base, std::int64_t index) const {
  std::uint16_t h;
  float f;
  if (bf16_) {
    std::memcpy(&h, At(base, index), 2);
    return static_cast<double>(Bf16ToFloat(h));
  }
  std::memcpy(&f, At(base, index), 4);
  return static_cast<double>(f);
}

void GradientCheck::LimitClasses(std::int64_t tokens) {
  check_->set_class_envelope(
      "G = bf16(g) of an fp32 g within the class envelopes of fp32 logits and an fp32 softmax "
      "(the cast of g's nearest fp32 value, and where another conforming g rounds otherwise), "
      "its products summed by " +
      ClassEnvelopeName());
  const std::int64_t per_row = dw_ ? InputColumnClasses(in_) : WeightColumnClasses(in_);
  check_->LimitIndependent(per_row, per_row * (dw_ ? WeightRowClasses(in_) : tokens));
}

void GradientCheck::FormWholeOperands() {
  gm_whole_.resize(g_.g.size());
  gm_abs_whole_.resize(g_.g.size());
  for (std::size_t i = 0; i < g_.g.size(); ++i) {
    gm_whole_[i] = ModelCast(g_.g[i]);
    gm_abs_whole_[i] = std::fabs(gm_whole_[i]);
  }
  xd_.resize(static_cast<std::size_t>(m_ * k_));
  x_abs_.resize(xd_.size());
  x_sq_.resize(xd_.size());
  for (std::size_t i = 0; i < xd_.size(); ++i) {
    xd_[i] = Bf16ToFloat(in_.x[i]);
    x_abs_[i] = std::fabs(xd_[i]);
    x_sq_[i] = xd_[i] * xd_[i];
  }
}

void GradientCheck::FormClassBlock(std::int64_t r0, std::int64_t rows, ClassBlock* b) const {
  const std::size_t out = static_cast<std::size_t>(rows * k_);
  b->model.resize(out);
  b->abs_sum.resize(out);
  std::vector<double> mean(out), var(out);
  if (!dw_) {
    GradInputClassBlock(r0, rows, b, &mean, &var);
  } else {
    GradWeightClassBlock(r0, rows, b, &mean, &var);
  }
  FlipEnvelope(mean, var, &b->flips);
}

void GradientCheck::GradInputClassBlock(std::int64_t r0, std::int64_t rows, ClassBlock* b,
                                        std::vector<double>* mean, std::vector<double>* var) const {
  const std::int64_t v = v_, k = k_;
  const std::size_t n = static_cast<std::size_t>(rows * v);
  const std::size_t first = static_cast<std::size_t>(r0 * v);
  std::vector<double> gm(n), flip(g_.flip_mean.begin() + static_cast<std::ptrdiff_t>(first),
                                  g_.flip_mean.begin() + static_cast<std::ptrdiff_t>(first + n));
  std::vector<float> gf(n);
  for (std::size_t e = 0; e < n; ++e) {
    gm[e] = ModelCast(g_.g[first + e]);
    gf[e] = static_cast<float>(gm[e]);
  }
  const Bf16Matrix w{in_.w, v, k};
  FormGW(in_.products, gm, rows, w, b->model.data(), b->abs_sum.data());
  FormGW(in_.products, flip, rows, w, mean->data(), nullptr);
  TimesSquares(g_.flip_var.data() + first, v, rows, in_.w, v, k, var->data());
  // W's columns [c0, c0 + count) as a panel [V][count].
  Models(
      gf, rows, k, v,
      [&](std::int64_t c0, std::int64_t count, float* panel) {
        for (std::int64_t j = 0; j < v; ++j) {
          for (std::int64_t l = 0; l < count; ++l) {
            panel[j * count + l] = Bf16ToFloat(in_.w[j * k + c0 + l]);
          }
        }
      },
      b);
}

void GradientCheck::GradWeightClassBlock(std::int64_t r0, std::int64_t rows, ClassBlock* b,
                                         std::vector<double>* mean,
                                         std::vector<double>* var) const {
  const std::int64_t m = m_, v = v_, k = k_;
  const int lda = static_cast<int>(v);
  const auto gemm = [&](const double* op_g, const std::vector<double>& op_x, double* c) {
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(k), static_cast<int>(m), 1.0, op_g + r0, lda, op_x.data(),
                static_cast<int>(k), 0.0, c, static_cast<int>(k));
  };
  gemm(gm_whole_.data(), xd_, b->model.data());
  gemm(gm_abs_whole_.data(), x_abs_, b->abs_sum.data());
  gemm(g_.flip_mean.data(), xd_, mean->data());
  gemm(g_.flip_var.data(), x_sq_, var->data());
  std::vector<float> gf(static_cast<std::size_t>(rows * m));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < m; ++i) {
      gf[static_cast<std::size_t>(r * m + i)] =
          static_cast<float>(gm_whole_[static_cast<std::size_t>(i * v + r0 + r)]);
    }
  }
  // X's columns [c0, c0 + count) as a panel [M][count].
  Models(
      gf, rows, k, m,
      [&](std::int64_t c0, std::int64_t count, float* panel) {
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t l = 0; l < count; ++l) {
            panel[i * count + l] =
                static_cast<float>(xd_[static_cast<std::size_t>(i * k + c0 + l)]);
          }
        }
      },
      b);
}

void GradientCheck::Add(std::int64_t row0, std::int64_t rows, const double* value,
                        const double* bound) {
  const std::int64_t k = k_;
  if (classed_) FormClassBlock(row0, rows, &block_);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t first = CallRow(row0 + r) * k;
    const double* ref = value + r * k;
    const double* bnd = bound + r * k;
    check_->AddRange(first, k, At(candidate_, first), At(own_, first), ref, bnd, bnd);
    if (!classed_) continue;
    for (std::int64_t c = 0; c < k; ++c) {
      const std::size_t e = static_cast<std::size_t>(r * k + c);
      const double cand = ValueAt(candidate_, first + c), mine = ValueAt(own_, first + c);
      const judgement::ClassTerms t =
          GradientClassTerms(bf16_, cand, mine, ref[c], block_.model[e], block_.abs_sum[e],
                             block_.seq[e], block_.tc[e], block_.flips[e], floor_);
      judgement::ElementBounds eb;
      eb.reference = ref[c];
      eb.bound = bnd[c];
      eb.p_bound = bnd[c];
      check_->AddClassTerms(CallRow(row0 + r), first + c, t, cand, mine, eb);
    }
  }
}

}  // namespace

bool CheckCrossEntropyGradient(bool dw, const LmHeadInputs& in, const CheckedRows& rows_checked,
                               const CeGradients& g, std::int64_t tokens, const void* candidate,
                               const void* own, DType dtype, CandidateCheck* check,
                               const StopCheck& stop) {
  const std::int64_t m = in.m, v = in.v, k = in.k;
  const bool bf16 = dtype == DType::kBf16;
  GradientCheck state(dw, in, rows_checked, g, candidate, own, dtype, check);
  if (state.classed()) state.LimitClasses(tokens);
  state.SetFloor();
  if (state.classed() && dw) state.FormWholeOperands();
  const auto add = [&](std::int64_t row0, std::int64_t rows, const double* value,
                       const double* bound) { state.Add(row0, rows, value, bound); };
  if (!dw) {
    return CrossEntropyGradInputReference(g.g.data(), g.pre_err.data(), m, Bf16Matrix{in.w, v, k},
                                          bf16, add, stop, in.products);
  }
  return CrossEntropyGradWeightReference(g.g.data(), g.pre_err.data(), in.x, m, v, k, add, stop);
}

}  // namespace logitd
