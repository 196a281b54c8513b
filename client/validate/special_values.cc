// special_values: NaN, ±Inf, bf16 subnormals and ±bf16 max placed in X and W
// so that IEEE 754 fixes every output: each special sits alone in its row
// (the rest of the row is zero), so an output is a single product, an exact
// integer sum, or a NaN/Inf that IEEE 754 propagates (0·Inf is NaN). Every
// output is predicted and compared, so a special value must reach exactly
// the outputs it should, with exactly the value it should, and no others.

#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/random.h"
#include "client/validate/suites.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {
namespace {

constexpr char kSpecialValuesSuite[] = "special_values";
constexpr std::int64_t kM = 16;
constexpr std::int64_t kV = 32;
constexpr std::int64_t kK = 16;

constexpr Bf16Bits kBf16Nan = 0x7fc0, kBf16PosInf = 0x7f80, kBf16NegInf = 0xff80;
constexpr Bf16Bits kMax = 0x7f7f, kNegMax = 0xff7f;
constexpr Bf16Bits kMinSub = 0x0001, kMaxSub = 0x007f;

struct Placement {
  std::int64_t row;
  Bf16Bits bits;
  std::int64_t col;
};

// Special rows of X, one column each, all distinct (so a column of X holds
// at most one special, which keeps dW = Gᵀ·X predictable too).
constexpr Placement kXSpecials[] = {
    {0, kBf16Nan, 0}, {1, kBf16PosInf, 1}, {2, kBf16NegInf, 2}, {3, kMax, 3},
    {4, kNegMax, 4},  {5, kMinSub, 5},     {6, kMaxSub, 6},     {7, 0x8040, 7},  // -2^-127
};
// Special rows of W. Where a W special shares a column with an X special the
// two meet in one product: Inf·max, -max·max (overflow to -Inf),
// subnormal·max (finite), subnormal·subnormal (underflow to 0), Inf·Inf...
constexpr Placement kWSpecials[] = {
    {0, kBf16Nan, 9}, {1, kBf16PosInf, 3}, {2, kBf16NegInf, 5},  {3, kMax, 4},
    {4, kMax, 6},     {5, 0x0003, 7},      {6, 0x8001, 10},      {7, kMax, 11},
    {8, kNegMax, 1},  {9, 0x807f, 0},      {10, kBf16NegInf, 2}, {11, kMaxSub, 13},
};
constexpr std::int64_t kXOnesRow = 8, kXZeroRow = 9;
constexpr std::int64_t kWOnesRow = 12, kWZeroRow = 13;
// G's row m selects W row m with this coefficient (and is zero elsewhere).
constexpr float kGCoefficients[kM] = {1, -1, 2, 1, -1, 3, 1, -2, 1, -1, 2, 1, -3, 1, 2, -1};

struct Inputs {
  std::shared_ptr<Tensor> x;  // bf16 [kM, kK]
  std::shared_ptr<Tensor> w;  // bf16 [kV, kK]
  Tensor dy;                  // fp32 [kM, kV], integers: G = dY exactly
};

Tensor Build(std::int64_t rows, const Placement* specials, std::size_t n_specials,
             std::int64_t ones_row, std::int64_t zero_row, Rng& rng) {
  Tensor t(DType::kBf16, {rows, kK});
  Bf16Bits* d = t.data<Bf16Bits>();
  const std::int64_t first_normal = static_cast<std::int64_t>(n_specials);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < kK; ++c) {
      float v = 0.0f;
      if (r == ones_row) {
        v = 1.0f;
      } else if (r >= first_normal && r != zero_row) {
        v = static_cast<float>(rng.UniformInt(-3, 3));
      }
      d[r * kK + c] = FloatToBf16(v);
    }
  }
  for (std::size_t i = 0; i < n_specials; ++i)
    d[specials[i].row * kK + specials[i].col] = specials[i].bits;
  return t;
}

Inputs MakeInputs(std::uint64_t seed) {
  Rng rng = Rng::Stream(seed, "special_values");
  Inputs in;
  in.x = std::make_shared<Tensor>(
      Build(kM, kXSpecials, std::size(kXSpecials), kXOnesRow, kXZeroRow, rng));
  in.w = std::make_shared<Tensor>(
      Build(kV, kWSpecials, std::size(kWSpecials), kWOnesRow, kWZeroRow, rng));
  in.dy = Tensor(DType::kFp32, {kM, kV});
  for (std::int64_t m = 0; m < kM; ++m) in.dy.data<float>()[m * kV + m] = kGCoefficients[m];
  return in;
}

std::vector<float> Floats(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out[static_cast<std::size_t>(i)] = static_cast<float>(t.At(i));
  return out;
}

// What IEEE 754 says out[i, j] = Σ_t a[i·a_row + t·a_step] · b[j·b_row + t·b_step] is.
absl::StatusOr<std::vector<float>> Predict(const std::vector<float>& a, std::int64_t a_row,
                                           std::int64_t a_step, const std::vector<float>& b,
                                           std::int64_t b_row, std::int64_t b_step,
                                           std::int64_t rows, std::int64_t cols,
                                           std::int64_t width) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const IeeeDot d =
          PredictIeeeDot(a.data() + i * a_row, a_step, b.data() + j * b_row, b_step, width);
      if (!d.order_independent) {
        return absl::InternalError(absl::StrCat("harness: special_values output [", i, ", ", j,
                                                "] depends on the summation order"));
      }
      out[static_cast<std::size_t>(i * cols + j)] = d.value;
    }
  }
  return out;
}

const char* Kind(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0) return "zero";
  if (std::fpclassify(v) == FP_SUBNORMAL) return "subnormal";
  if (std::fabs(v) > 3.0e38f) return "near max";
  return "finite";
}

// Compares an output with the prediction and describes what went wrong in
// IEEE terms: lost NaN/Inf, spurious non-finite values, wrong finite values.
void CheckOutput(CaseResult& r, const char* key, const std::string& what, const Tensor& got,
                 const std::vector<float>& want, std::vector<std::int64_t> shape) {
  if (!r.Check(got.shape() == shape, absl::StrCat(what, ": expected shape ", ShapeString(shape),
                                                  ", got ", ShapeString(got.shape())))) {
    return;
  }
  const bool bf16 = got.dtype() == DType::kBf16;
  std::int64_t predicted_nan = 0, predicted_inf = 0, predicted_subnormal = 0;
  std::int64_t lost_nonfinite = 0, spurious_nonfinite = 0, wrong_value = 0;
  std::string first;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const float w =
        bf16 ? RoundToBf16(want[static_cast<std::size_t>(i)]) : want[static_cast<std::size_t>(i)];
    const float g = static_cast<float>(got.At(i));
    predicted_nan += std::isnan(w);
    predicted_inf += std::isinf(w);
    predicted_subnormal += std::fpclassify(w) == FP_SUBNORMAL;
    bool same;
    if (std::isnan(w) || std::isnan(g)) {
      same = std::isnan(w) && std::isnan(g);  // payloads are not specified
    } else if (w == 0 && g == 0) {
      same = true;  // the sign of an exact zero sum depends on the order
    } else {
      same = FloatBits(w) == FloatBits(g);
    }
    if (same) continue;
    if (!std::isfinite(w) && std::isfinite(g)) {
      ++lost_nonfinite;
    } else if (std::isfinite(w) && !std::isfinite(g)) {
      ++spurious_nonfinite;
    } else {
      ++wrong_value;
    }
    if (first.empty()) {
      first = absl::StrFormat("first at %s: got %s (%a, 0x%x), IEEE 754 says %s (%a)",
                              IndexString(i, shape), Kind(g), g, ElementBits(got, i), Kind(w), w);
    }
  }
  const std::int64_t wrong = lost_nonfinite + spurious_nonfinite + wrong_value;
  r.figures[key] = {{"outputs", got.numel()},
                    {"predicted_nan", predicted_nan},
                    {"predicted_inf", predicted_inf},
                    {"predicted_subnormal", predicted_subnormal},
                    {"lost_nan_or_inf", lost_nonfinite},
                    {"spurious_nan_or_inf", spurious_nonfinite},
                    {"wrong_value", wrong_value}};
  absl::StrAppend(
      &r.summary, r.summary.empty() ? "" : "; ",
      absl::StrFormat("%s %d/%d wrong (%d NaN, %d Inf, %d subnormal expected)", key, wrong,
                      got.numel(), predicted_nan, predicted_inf, predicted_subnormal));
  r.Check(wrong == 0, absl::StrFormat("%s: %d of %d outputs are not what IEEE 754 says (NaN/Inf "
                                      "lost: %d, NaN/Inf where none belongs: %d, wrong value: "
                                      "%d); %s",
                                      what, wrong, got.numel(), lost_nonfinite, spurious_nonfinite,
                                      wrong_value, first));
}

absl::Status RunLogits(RunContext& ctx, CaseResult& r, DType out_dtype) {
  const Inputs in = MakeInputs(ctx.options().seed);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *in.w, "special_values");
  if (!weight.ok()) return weight.status();
  client::LogitsOptions o;
  o.out_dtype = out_dtype;
  absl::StatusOr<Tensor> y = ctx.client().Logits(*in.x, weight->handle(), o);
  if (!y.ok()) return Annotate(y.status(), absl::StrCat("Logits(", DTypeName(out_dtype), " out)"));
  ctx.RecordOutput(absl::StrCat("y ", DTypeName(out_dtype)), *y);
  OfferLogitsReplay(ctx, kSpecialValuesSuite,
                    absl::StrCat("Logits ", DTypeName(out_dtype), " out, special values"), in.x,
                    in.w, o, *y);
  absl::StatusOr<std::vector<float>> want =
      Predict(Floats(*in.x), kK, 1, Floats(*in.w), kK, 1, kM, kV, kK);
  if (!want.ok()) return want.status();
  if (!r.Check(y->dtype() == out_dtype, absl::StrCat("Logits returned ", DTypeName(y->dtype())))) {
    return absl::OkStatus();
  }
  CheckOutput(r, out_dtype == DType::kFp32 ? "y_fp32" : "y_bf16",
              absl::StrCat("Y = X·Wᵀ (", DTypeName(out_dtype), " out)"), *y, *want, {kM, kV});
  return absl::OkStatus();
}

absl::Status RunBackward(RunContext& ctx, CaseResult& r, DType dx_dtype) {
  const Inputs in = MakeInputs(ctx.options().seed);
  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *in.w, "special_values");
  if (!weight.ok()) return weight.status();
  client::BackwardOptions o;
  o.dx_dtype = dx_dtype;
  o.dw_dtype = DType::kFp32;
  absl::StatusOr<client::BackwardResult> res =
      ctx.client().Backward(in.dy, *in.x, weight->handle(), o);
  if (!res.ok()) return Annotate(res.status(), "Backward");
  if (!r.Check(res->dx.has_value() && res->dw.has_value(), "Backward returned no dX or no dW")) {
    return absl::OkStatus();
  }
  ctx.RecordOutput("dx", *res->dx);
  ctx.RecordOutput("dw", *res->dw);
  const std::vector<float> g = Floats(in.dy);
  // dX[m, k] = Σ_v G[m, v]·W[v, k]; dW[v, k] = Σ_m G[m, v]·X[m, k].
  absl::StatusOr<std::vector<float>> dx = Predict(g, kV, 1, Floats(*in.w), 1, kK, kM, kK, kV);
  if (!dx.ok()) return dx.status();
  absl::StatusOr<std::vector<float>> dw = Predict(g, 1, kV, Floats(*in.x), 1, kK, kV, kK, kM);
  if (!dw.ok()) return dw.status();
  r.Check(res->dx->dtype() == dx_dtype && res->dw->dtype() == DType::kFp32,
          absl::StrCat("Backward returned dX ", DTypeName(res->dx->dtype()), ", dW ",
                       DTypeName(res->dw->dtype())));
  CheckOutput(r, dx_dtype == DType::kFp32 ? "dx_fp32" : "dx_bf16",
              absl::StrCat("dX = G·W (", DTypeName(dx_dtype), ")"), *res->dx, *dx, {kM, kK});
  CheckOutput(r, "dw_fp32", "dW = Gᵀ·X (fp32)", *res->dw, *dw, {kV, kK});
  return absl::OkStatus();
}

class SpecialValuesSuite final : public Suite {
 public:
  std::string name() const override { return kSpecialValuesSuite; }
  std::vector<Case> Cases(const Options&) override {
    return {
        {"logits_fp32", [](RunContext& c, CaseResult& r) { return RunLogits(c, r, DType::kFp32); }},
        {"logits_bf16", [](RunContext& c, CaseResult& r) { return RunLogits(c, r, DType::kBf16); }},
        {"backward_fp32_dx",
         [](RunContext& c, CaseResult& r) { return RunBackward(c, r, DType::kFp32); }},
        {"backward_bf16_dx",
         [](RunContext& c, CaseResult& r) { return RunBackward(c, r, DType::kBf16); }},
    };
  }
};

}  // namespace

std::unique_ptr<Suite> MakeSpecialValuesSuite() { return std::make_unique<SpecialValuesSuite>(); }

}  // namespace logitd::validate
