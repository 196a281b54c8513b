// integer_exact: with integer operands in [-8, 8] every product is at most
// 64 in magnitude, so while width·64 < 2^24 every partial sum is an integer
// fp32 holds exactly, in any summation order. The fp32 logits, and dX (width
// V) and dW (width M), must then equal the exact sums bit for bit.

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/validate/random.h"
#include "client/validate/suites.h"
#include "logitd/reference/numerics.h"
#include "logitd/status_macros.h"

namespace logitd::validate {
namespace {

constexpr char kIntegerExactSuite[] = "integer_exact";
constexpr std::int64_t kMaxMagnitude = 8;
// dW is [V, K] fp32: 2 GiB at V=32768, K=16384. Its reduction width is M
// whatever K is, so wider K adds columns but no new arithmetic; it is checked
// where it stays under this size.
constexpr std::int64_t kMaxCheckedGradientBytes = std::int64_t{512} << 20;

bool WidthIsExact(std::int64_t width) {
  return width * kMaxMagnitude * kMaxMagnitude < (std::int64_t{1} << 24);
}

std::vector<float> ToFloats(const std::vector<double>& exact) {
  std::vector<float> out(exact.size());
  // Exact: integers below 2^24.
  for (std::size_t i = 0; i < exact.size(); ++i) out[i] = static_cast<float>(exact[i]);
  return out;
}

void ReportComparison(CaseResult& r, const char* key, const char* what, const BitwiseComparison& c,
                      const std::vector<std::int64_t>& shape) {
  r.figures[key] = {{"compared", c.compared}, {"differing", c.differing}, {"max_ulp", c.max_ulp}};
  r.Check(c.differing == 0,
          absl::StrCat(what, " ", ShapeString(shape),
                       " differs from the exact integer sums: ", c.Describe(shape)));
}

// Backward of the integer dY: dX and dW (as `bw` asks) against the exact
// sums, bit for bit; their counts appended to *summary.
absl::Status CheckGradients(RunContext& ctx, CaseResult& r, const Tensor& dy, const Tensor& x,
                            const std::vector<double>& xd, const Tensor& w,
                            const std::string& handle, const client::BackwardOptions& bw,
                            PhaseTimer& timer, std::string* summary) {
  const std::int64_t m = x.dim(0), k = x.dim(1), v = w.dim(0);
  absl::StatusOr<client::BackwardResult> grads = ctx.client().Backward(dy, x, handle, bw);
  if (!grads.ok()) return Annotate(grads.status(), "Backward");
  if (grads->dx.has_value()) ctx.RecordOutput("dx", *grads->dx);
  if (grads->dw.has_value()) ctx.RecordOutput("dw", *grads->dw);
  timer.Lap("server");
  const std::vector<double> gd = ToDouble(dy);
  if (bw.want_dx) {
    if (!r.Check(grads->dx.has_value(), "Backward returned no dX")) return absl::OkStatus();
    std::vector<double> dx_exact(static_cast<std::size_t>(m * k));
    ReferenceGW(gd, m, AsMatrix(w), dx_exact.data(), nullptr);
    const std::vector<float> dx_want = ToFloats(dx_exact);
    const BitwiseComparison c = CompareWith(*grads->dx, dx_want.data(), m * k);
    ReportComparison(r, "dx_fp32", "dX", c, {m, k});
    absl::StrAppend(summary, ", dx ", c.differing, "/", c.compared);
  }
  if (bw.want_dw) {
    if (!r.Check(grads->dw.has_value(), "Backward returned no dW")) return absl::OkStatus();
    const Tensor& dw = *grads->dw;
    if (!r.Check(dw.numel() == v * k && dw.dtype() == DType::kFp32,
                 absl::StrCat("dW: expected fp32 [", v, ", ", k, "], got ", DTypeName(dw.dtype()),
                              " ", ShapeString(dw.shape())))) {
      return absl::OkStatus();
    }
    BitwiseComparison total;
    std::vector<float> block;
    ReferenceGtX(gd, xd, m, v, k, /*with_abs=*/false,
                 [&](std::int64_t row0, std::int64_t rows, const double* value, const double*) {
                   block.assign(value, value + rows * k);
                   CompareRangeInto(dw, row0 * k, block.data(), rows * k, {}, &total);
                 });
    ReportComparison(r, "dw_fp32", "dW", total, {v, k});
    absl::StrAppend(summary, ", dw ", total.differing, "/", total.compared);
  }
  return absl::OkStatus();
}

absl::Status RunIntegerK(RunContext& ctx, CaseResult& r, std::int64_t m, std::int64_t v,
                         std::int64_t k) {
  if (!WidthIsExact(k)) {
    return absl::InvalidArgumentError(absl::StrCat("K=", k, " is too wide for exact sums"));
  }
  PhaseTimer timer(&r);
  const std::uint64_t seed = ctx.options().seed;
  Rng x_rng = Rng::Stream(seed, "integer_exact/x", k);
  Rng w_rng = Rng::Stream(seed, "integer_exact/w", k);
  Rng g_rng = Rng::Stream(seed, "integer_exact/dy", k);
  auto x = std::make_shared<Tensor>(
      RandomIntegers(DType::kBf16, {m, k}, -kMaxMagnitude, kMaxMagnitude, x_rng));
  auto w = std::make_shared<Tensor>(
      RandomIntegers(DType::kBf16, {v, k}, -kMaxMagnitude, kMaxMagnitude, w_rng));
  // Integers of this size are bf16 values, so the server's cast leaves them be.
  Tensor dy = RandomIntegers(DType::kFp32, {m, v}, -kMaxMagnitude, kMaxMagnitude, g_rng);
  r.figures["m"] = m;
  r.figures["v"] = v;
  r.figures["k"] = k;
  timer.Lap("generate");

  absl::StatusOr<ScopedWeight> weight =
      ScopedWeight::Register(ctx.client(), *w, absl::StrCat("integer_exact_k", k));
  if (!weight.ok()) return weight.status();
  timer.Lap("register");
  const std::string handle = weight->handle();

  client::LogitsOptions fp32_out;
  fp32_out.out_dtype = DType::kFp32;
  absl::StatusOr<Tensor> y = ctx.client().Logits(*x, handle, fp32_out);
  if (!y.ok()) return Annotate(y.status(), "Logits(fp32 out)");
  ctx.RecordOutput("y fp32", *y);
  OfferLogitsReplay(ctx, kIntegerExactSuite, absl::StrCat("Logits fp32 out, integers, K=", k), x, w,
                    fp32_out, *y);

  client::LogitsOptions bf16_out;
  bf16_out.out_dtype = DType::kBf16;
  absl::StatusOr<Tensor> y16 = ctx.client().Logits(*x, handle, bf16_out);
  if (!y16.ok()) return Annotate(y16.status(), "Logits(bf16 out)");
  ctx.RecordOutput("y bf16", *y16);
  timer.Lap("server");

  const std::vector<double> xd = ToDouble(*x);
  std::vector<double> y_exact(static_cast<std::size_t>(m * v));
  // dgemm is exact here: every partial sum is an integer far below 2^53.
  ReferenceXWt(xd, m, AsMatrix(*w), y_exact.data(), nullptr);
  const std::vector<float> y_want = ToFloats(y_exact);
  const BitwiseComparison y_cmp = CompareWith(*y, y_want.data(), m * v);
  ReportComparison(r, "y_fp32", "fp32 logits", y_cmp, {m, v});
  // The exact accumulator rounded once to bf16 is unique, whatever the order.
  const BitwiseComparison y16_cmp = CompareWith(*y16, y_want.data(), m * v);
  ReportComparison(r, "y_bf16", "bf16 logits (the exact sums rounded once, RNE)", y16_cmp, {m, v});
  timer.Lap("reference");

  client::BackwardOptions bw;
  bw.want_dx = WidthIsExact(v);
  bw.want_dw = WidthIsExact(m) && v * k * 4 <= kMaxCheckedGradientBytes;
  bw.dx_dtype = DType::kFp32;
  bw.dw_dtype = DType::kFp32;
  r.figures["dx_checked"] = bw.want_dx;
  r.figures["dw_checked"] = bw.want_dw;
  std::string summary = absl::StrCat("y ", y_cmp.differing, "/", y_cmp.compared, ", y16 ",
                                     y16_cmp.differing, "/", y16_cmp.compared);
  if (bw.want_dx || bw.want_dw) {
    LOGITD_RETURN_IF_ERROR(CheckGradients(ctx, r, dy, *x, xd, *w, handle, bw, timer, &summary));
  }
  timer.Lap("reference");
  absl::StrAppend(&summary, " differ");
  if (!bw.want_dw) {
    absl::StrAppend(&summary, "; dw not checked (", (v * k * 4) >> 20, " MiB)");
  }
  r.summary = summary;
  return absl::OkStatus();
}

class IntegerExactSuite final : public Suite {
 public:
  std::string name() const override { return kIntegerExactSuite; }
  std::vector<Case> Cases(const Options& options) override {
    const Shapes shapes = ShapesFor(options);
    std::vector<Case> cases;
    for (std::int64_t k : shapes.ks) {
      cases.push_back(
          {absl::StrCat("K=", k), [m = shapes.m, v = shapes.v, k](RunContext& ctx, CaseResult& r) {
             return RunIntegerK(ctx, r, m, v, k);
           }});
    }
    return cases;
  }
};

}  // namespace

std::unique_ptr<Suite> MakeIntegerExactSuite() { return std::make_unique<IntegerExactSuite>(); }

}  // namespace logitd::validate
