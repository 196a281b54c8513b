// backward_contract: the seed's backward path. The server casts dY to bf16
// once (round to nearest even) and runs dX = G·W, dW = Gᵀ·X with fp32
// accumulation. Proven here: its cast equals ours bit for bit on the hard
// inputs; dY given as fp32 gives the same bits as the legacy path given
// bf16(dY); with integer data the gradients are exact (so any change of the
// cast shows); and dX, dW sit inside their fp32 bounds of an fp64 reference.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/validate/random.h"
#include "client/validate/report.h"
#include "client/validate/suites.h"
#include "logitd/reference/bounds.h"
#include "logitd/reference/numerics.h"
#include "logitd/status_macros.h"

namespace logitd::validate {
namespace {

constexpr char kBackwardContractSuite[] = "backward_contract";

// ---------------------------------------------------------------------------
// cast

enum CastCategory { kNan, kInf, kPastMax, kTie, kSubnormal, kZero, kOther, kNumCategories };
constexpr const char* kCategoryNames[kNumCategories] = {"nan",       "inf",  "past_bf16_max", "tie",
                                                        "subnormal", "zero", "other"};

CastCategory Classify(std::uint32_t u) {
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kNan;
  if (a == 0x7f800000u) return kInf;
  if (a > 0x7f7f0000u) return kPastMax;
  if ((u & 0xffffu) == 0x8000u) return kTie;
  if ((a & 0x7f800000u) == 0 && a != 0) return kSubnormal;
  if (a == 0) return kZero;
  return kOther;
}

std::vector<std::uint32_t> CastInputs(std::uint64_t seed, bool quick) {
  std::vector<std::uint32_t> in = {
      0x00000000, 0x80000000,  // ±0
      0x7f800000, 0xff800000,  // ±Inf
      // NaNs: quiet, signalling (payload high and low only), negative, all ones.
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7f80ffff, 0x7f810000, 0x7fbfffff,
      0x7fffffff, 0xffffffff, 0x7fc0ffff,
      // Past the largest bf16 (0x7f7f): just below the midpoint to Inf rounds
      // down, the midpoint itself rounds to even (Inf), anything above too.
      0x7f7f7fff, 0x7f7f8000, 0x7f7f8001, 0x7f7fffff, 0xff7f7fff, 0xff7f8000, 0xff7fffff,
      0x7f7f0001, 0x7f7effff,
      // fp32 subnormals: below, at and above half the smallest bf16 subnormal.
      0x00000001, 0x00007fff, 0x00008000, 0x00008001, 0x00018000, 0x007fffff, 0x007f8000,
      0x80000001, 0x80008000, 0x80018000, 0x807fffff,
      // The smallest normal and its neighbourhood.
      0x00800000, 0x00807fff, 0x00808000, 0x00818000};
  // Ties and their neighbours at every exponent, for even and odd bf16 mantissas.
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t exp = 0; exp < 256; ++exp) {
      for (std::uint32_t mant_hi : {0x00u, 0x01u, 0x3fu, 0x40u, 0x7eu, 0x7fu}) {
        for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
          in.push_back(sign | (exp << 23) | (mant_hi << 16) | low);
        }
      }
    }
  }
  Rng rng = Rng::Stream(seed, "backward_contract/cast");
  const std::size_t random = quick ? (1u << 16) : (1u << 20);
  for (std::size_t i = 0; i < random; ++i) in.push_back(static_cast<std::uint32_t>(rng.Next()));
  return in;
}

absl::Status RunCast(RunContext& ctx, CaseResult& r) {
  const std::vector<std::uint32_t> bits = CastInputs(ctx.options().seed, ctx.options().quick);
  auto input = std::make_shared<Tensor>(
      DType::kFp32, std::vector<std::int64_t>{static_cast<std::int64_t>(bits.size())});
  std::memcpy(input->bytes(), bits.data(), input->nbytes());

  absl::StatusOr<Tensor> out = ctx.client().CastToBf16(*input);
  if (!out.ok()) return Annotate(out.status(), "Cast");
  ctx.RecordOutput("cast", *out);
  if (ctx.WantsReplay(kBackwardContractSuite)) {
    Replay replay;
    replay.suite = kBackwardContractSuite;
    replay.description = absl::StrCat("Cast of ", bits.size(), " fp32 values");
    replay.send = [input](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
      absl::StatusOr<Tensor> again = c.CastToBf16(*input);
      if (!again.ok()) return again.status();
      std::vector<Tensor> outs;
      outs.push_back(*std::move(again));
      return outs;
    };
    replay.first.push_back(out->Clone());
    ctx.OfferReplay(std::move(replay));
  }
  if (!r.Check(
          out->dtype() == DType::kBf16 && out->shape() == input->shape(),
          absl::StrCat("Cast returned ", DTypeName(out->dtype()), " ", ShapeString(out->shape()),
                       ", expected bf16 ", ShapeString(input->shape())))) {
    return absl::OkStatus();
  }

  std::int64_t tested[kNumCategories] = {};
  std::int64_t wrong[kNumCategories] = {};
  std::int64_t total_wrong = 0;
  std::string first;
  const Bf16Bits* got = out->data<Bf16Bits>();
  for (std::size_t i = 0; i < bits.size(); ++i) {
    const CastCategory c = Classify(bits[i]);
    ++tested[c];
    const Bf16Bits want = FloatToBf16(BitsToFloat(bits[i]));
    if (got[i] == want) continue;
    ++wrong[c];
    if (total_wrong++ == 0) {
      first = absl::StrFormat("input 0x%08x (%s) at [%d]: server 0x%04x, RNE 0x%04x", bits[i],
                              kCategoryNames[c], i, got[i], want);
    }
  }
  nlohmann::ordered_json per;
  std::string breakdown;
  for (int c = 0; c < kNumCategories; ++c) {
    per[kCategoryNames[c]] = {{"tested", tested[c]}, {"differing", wrong[c]}};
    if (wrong[c] > 0)
      absl::StrAppend(&breakdown, breakdown.empty() ? "" : ", ", kCategoryNames[c], " ", wrong[c]);
  }
  r.figures["values"] = bits.size();
  r.figures["differing"] = total_wrong;
  r.figures["by_category"] = per;
  r.summary = absl::StrCat(total_wrong, "/", bits.size(), " casts differ (", tested[kTie],
                           " ties, ", tested[kNan], " NaNs, ", tested[kPastMax], " past bf16 max, ",
                           tested[kSubnormal], " subnormals)");
  r.Check(
      total_wrong == 0,
      absl::StrCat("the server's fp32->bf16 cast differs from round-to-nearest-even in ",
                   total_wrong, " of ", bits.size(), " values (", breakdown, "); first: ", first));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Shared helpers for the gradient cases.

struct Grads {
  Tensor dx;
  Tensor dw;
};

absl::StatusOr<Grads> Backward(client::Client& c, const Tensor& dy, const Tensor& x,
                               const std::string& handle, DType dx_dtype, DType dw_dtype,
                               absl::string_view what) {
  client::BackwardOptions o;
  o.want_dx = true;
  o.want_dw = true;
  o.dx_dtype = dx_dtype;
  o.dw_dtype = dw_dtype;
  absl::StatusOr<client::BackwardResult> res = c.Backward(dy, x, handle, o);
  if (!res.ok()) return Annotate(res.status(), absl::StrCat("Backward(", what, ")"));
  if (!res->dx.has_value() || !res->dw.has_value()) {
    return absl::InternalError(absl::StrCat("Backward(", what, ") returned no dX or no dW"));
  }
  return Grads{*std::move(res->dx), *std::move(res->dw)};
}

// The same through the run's client, its dX and dW recorded for --compare.
absl::StatusOr<Grads> Backward(RunContext& ctx, const Tensor& dy, const Tensor& x,
                               const std::string& handle, DType dx_dtype, DType dw_dtype,
                               absl::string_view what) {
  absl::StatusOr<Grads> g = Backward(ctx.client(), dy, x, handle, dx_dtype, dw_dtype, what);
  if (g.ok()) {
    ctx.RecordOutput(absl::StrCat(what, " dx"), g->dx);
    ctx.RecordOutput(absl::StrCat(what, " dw"), g->dw);
  }
  return g;
}

bool CheckShape(CaseResult& r, const Tensor& t, DType dtype, std::vector<std::int64_t> shape,
                absl::string_view what) {
  return r.Check(t.dtype() == dtype && t.shape() == shape,
                 absl::StrCat(what, ": expected ", DTypeName(dtype), " ", ShapeString(shape),
                              ", got ", DTypeName(t.dtype()), " ", ShapeString(t.shape())));
}

// G = bf16(dY) as the client computes it, widened to double.
Tensor ClientCastTensor(const Tensor& dy) {
  Tensor g(DType::kBf16, dy.shape());
  for (std::int64_t i = 0; i < dy.numel(); ++i) {
    g.data<Bf16Bits>()[i] = FloatToBf16(dy.data<float>()[i]);
  }
  return g;
}

std::int64_t GradK(const Options& o) { return o.quick ? 256 : 1024; }

// ---------------------------------------------------------------------------
// fp32 dY == bf16(dY)

absl::Status RunSameAsLegacy(RunContext& ctx, CaseResult& r) {
  const Shapes s = ShapesFor(ctx.options());
  const std::int64_t m = s.m, v = s.v, k = GradK(ctx.options());
  const std::uint64_t seed = ctx.options().seed;
  Rng x_rng = Rng::Stream(seed, "backward_contract/legacy/x");
  Rng w_rng = Rng::Stream(seed, "backward_contract/legacy/w");
  Rng g_rng = Rng::Stream(seed, "backward_contract/legacy/dy");
  const Tensor x = RandomNormal(DType::kBf16, {m, k}, 1.0, x_rng);
  const Tensor w = RandomNormal(DType::kBf16, {v, k}, 1.0, w_rng);
  Tensor dy = RandomNormal(DType::kFp32, {m, v}, 1e-3, g_rng);
  // Every fifth element an exact tie, where a cast that is not RNE shows.
  for (std::int64_t i = 0; i < dy.numel(); i += 5) {
    const std::uint32_t hi = FloatToBf16(dy.data<float>()[i]);
    dy.data<float>()[i] = BitsToFloat((hi << 16) | 0x8000u);
  }
  const Tensor dy16 = ClientCastTensor(dy);
  r.figures["m"] = m;
  r.figures["v"] = v;
  r.figures["k"] = k;

  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(ctx.client(), w, "backward_legacy");
  if (!weight.ok()) return weight.status();
  std::int64_t total_differing = 0;
  for (const auto& [dx_dtype, dw_dtype] :
       {std::pair{DType::kFp32, DType::kFp32}, std::pair{DType::kBf16, DType::kFp32}}) {
    const std::string label =
        absl::StrCat("dx ", DTypeName(dx_dtype), ", dw ", DTypeName(dw_dtype));
    absl::StatusOr<Grads> from32 =
        Backward(ctx, dy, x, weight->handle(), dx_dtype, dw_dtype, "fp32 dY, " + label);
    if (!from32.ok()) return from32.status();
    absl::StatusOr<Grads> from16 =
        Backward(ctx, dy16, x, weight->handle(), dx_dtype, dw_dtype, "bf16 dY, " + label);
    if (!from16.ok()) return from16.status();
    const CompareOptions strict{/*signed_zero_equal=*/false, /*any_nan_equal=*/false};
    const BitwiseComparison dx = CompareTensors(from32->dx, from16->dx, strict);
    const BitwiseComparison dw = CompareTensors(from32->dw, from16->dw, strict);
    const std::string key = absl::StrCat("dx_", DTypeName(dx_dtype), "_dw_", DTypeName(dw_dtype));
    r.figures[key] = {{"dx_differing", dx.differing}, {"dw_differing", dw.differing}};
    total_differing += dx.differing + dw.differing;
    r.Check(dx.differing == 0,
            absl::StrCat("dX (", label, ") from fp32 dY differs from dX from bf16(dY): ",
                         dx.Describe(from16->dx.shape())));
    r.Check(dw.differing == 0,
            absl::StrCat("dW (", label, ") from fp32 dY differs from dW from bf16(dY): ",
                         dw.Describe(from16->dw.shape())));
  }
  r.summary = absl::StrCat(total_differing, " elements differ between fp32 dY and bf16(dY)");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// exact gradients

// n (|n| <= 8) nudged so that RNE to bf16 gives n back but truncation or
// rounding ties away from zero would not: a quarter or exactly half of the
// bf16 spacing above or below |n|. bf16(n) has an even mantissa for these n.
float NudgedInteger(std::int64_t n, int variant) {
  if (n == 0) {
    // ±2^-140 is a normal fp32 value far below half the smallest bf16 subnormal.
    return variant == 0 ? 0.0f : std::ldexp(variant % 2 == 0 ? 1.0f : -1.0f, -140);
  }
  const float sign = n < 0 ? -1.0f : 1.0f;
  const float a = static_cast<float>(n < 0 ? -n : n);
  int e = 0;
  std::frexp(a, &e);  // a = f·2^e with f in [0.5, 1)
  const float up = std::ldexp(1.0f, e - 1 - 7);
  const std::int64_t magnitude = n < 0 ? -n : n;
  const bool power_of_two = (magnitude & (magnitude - 1)) == 0;
  const float down = power_of_two ? up / 2 : up;
  switch (variant % 5) {
    case 1:
      return sign * (a + up / 4);
    case 2:
      return sign * (a + up / 2);  // tie, rounds to the even n
    case 3:
      return sign * (a - down / 4);
    case 4:
      return sign * (a - down / 2);  // tie, rounds to the even n
    default:
      return sign * a;
  }
}

// A server output against the exact sums, bit for bit, recorded under
// `key`; the differing counts gathered for the summary.
struct ExactCheck {
  CaseResult& r;
  std::string summary;

  void operator()(const Tensor& got, const std::vector<float>& want, const char* key,
                  const std::string& what) {
    const BitwiseComparison c =
        CompareWith(got, want.data(), static_cast<std::int64_t>(want.size()));
    r.figures[key] = {{"compared", c.compared}, {"differing", c.differing}, {"max_ulp", c.max_ulp}};
    r.Check(c.differing == 0, absl::StrCat(what, " differs from the exact sums of bf16(dY) (RNE): ",
                                           c.Describe(got.shape())));
    absl::StrAppend(&summary, summary.empty() ? "" : ", ", key, " ", c.differing);
  }
};

// Accumulation into the server-held buffer: 0 + dW + dW = 2·dW exactly,
// counted as two calls.
absl::Status CheckAccumulation(client::Client& c, CaseResult& r, const Tensor& dy, const Tensor& x,
                               const std::string& handle, const std::vector<float>& dw_want,
                               ExactCheck& check) {
  const absl::Status zero = c.ZeroGradient(handle);
  if (!zero.ok() && zero.code() != absl::StatusCode::kNotFound &&
      zero.code() != absl::StatusCode::kFailedPrecondition) {
    return Annotate(zero, "ZeroGradient");
  }
  client::BackwardOptions acc;
  acc.want_dx = false;
  acc.want_dw = true;
  acc.accumulate_dw = true;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<client::BackwardResult> res = c.Backward(dy, x, handle, acc);
    if (!res.ok()) return Annotate(res.status(), "Backward(accumulate_dw)");
  }
  absl::StatusOr<client::GradientResult> fetched = c.FetchGradient(handle, true);
  if (!fetched.ok()) return Annotate(fetched.status(), "FetchGradient");
  r.Check(fetched->accumulated_calls == 2,
          absl::StrCat("FetchGradient counts ", fetched->accumulated_calls,
                       " accumulated calls after ZeroGradient and 2 Backward calls"));
  if (CheckShape(r, fetched->dw, DType::kFp32, {dy.dim(1), x.dim(1)}, "FetchGradient dW")) {
    std::vector<float> twice(dw_want.size());
    for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * dw_want[i];
    check(fetched->dw, twice, "dw_accumulated", "dW accumulated twice");
  }
  return absl::OkStatus();
}

absl::Status RunExactGrads(RunContext& ctx, CaseResult& r) {
  const Shapes s = ShapesFor(ctx.options());
  const std::int64_t m = s.m, v = s.v, k = 256;
  const std::uint64_t seed = ctx.options().seed;
  Rng x_rng = Rng::Stream(seed, "backward_contract/exact/x");
  Rng w_rng = Rng::Stream(seed, "backward_contract/exact/w");
  Rng g_rng = Rng::Stream(seed, "backward_contract/exact/dy");
  const Tensor x = RandomIntegers(DType::kBf16, {m, k}, -8, 8, x_rng);
  const Tensor w = RandomIntegers(DType::kBf16, {v, k}, -8, 8, w_rng);
  Tensor dy(DType::kFp32, {m, v});
  std::vector<double> g(static_cast<std::size_t>(m * v));
  for (std::int64_t i = 0; i < dy.numel(); ++i) {
    const std::int64_t n = g_rng.UniformInt(-8, 8);
    dy.data<float>()[i] = NudgedInteger(n, static_cast<int>(g_rng.UniformInt(0, 4)));
    g[static_cast<std::size_t>(i)] = static_cast<double>(n);
    if (RoundToBf16(dy.data<float>()[i]) != static_cast<float>(n)) {
      return absl::InternalError(
          absl::StrFormat("harness: nudged %d (%a) does not round to it", n, dy.data<float>()[i]));
    }
  }
  // Partial sums of dX (width V) and dW (width M) stay integers below 2^24.
  if (v * 64 >= (1 << 24)) return absl::InternalError("harness: V too wide for exact dX");
  r.figures["m"] = m;
  r.figures["v"] = v;
  r.figures["k"] = k;

  const std::vector<double> xd = ToDouble(x);
  std::vector<double> dx_exact(static_cast<std::size_t>(m * k));
  ReferenceGW(g, m, AsMatrix(w), dx_exact.data(), nullptr);
  std::vector<float> dx_want(dx_exact.begin(), dx_exact.end());
  std::vector<float> dw_want(static_cast<std::size_t>(v * k));
  ReferenceGtX(g, xd, m, v, k, false,
               [&](std::int64_t row0, std::int64_t rows, const double* value, const double*) {
                 std::copy(value, value + rows * k, dw_want.begin() + row0 * k);
               });

  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(ctx.client(), w, "backward_exact");
  if (!weight.ok()) return weight.status();
  ExactCheck check{r, {}};
  absl::StatusOr<Grads> full =
      Backward(ctx, dy, x, weight->handle(), DType::kFp32, DType::kFp32, "fp32 dX");
  if (!full.ok()) return full.status();
  if (CheckShape(r, full->dx, DType::kFp32, {m, k}, "dX") &&
      CheckShape(r, full->dw, DType::kFp32, {v, k}, "dW")) {
    check(full->dx, dx_want, "dx_fp32", "dX fp32");
    check(full->dw, dw_want, "dw_fp32", "dW fp32");
  }
  absl::StatusOr<Grads> legacy =
      Backward(ctx, dy, x, weight->handle(), DType::kBf16, DType::kFp32, "bf16 dX");
  if (!legacy.ok()) return legacy.status();
  if (CheckShape(r, legacy->dx, DType::kBf16, {m, k}, "dX bf16")) {
    // The exact accumulator rounded once to bf16.
    check(legacy->dx, dx_want, "dx_bf16", "dX bf16");
  }

  LOGITD_RETURN_IF_ERROR(
      CheckAccumulation(ctx.client(), r, dy, x, weight->handle(), dw_want, check));
  r.summary = absl::StrCat(check.summary, " differ");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// fp32 bounds

absl::Status RunBounds(RunContext& ctx, CaseResult& r) {
  const Shapes s = ShapesFor(ctx.options());
  const std::int64_t m = s.m, v = s.v, k = GradK(ctx.options());
  const std::uint64_t seed = ctx.options().seed;
  Rng x_rng = Rng::Stream(seed, "backward_contract/bounds/x");
  Rng w_rng = Rng::Stream(seed, "backward_contract/bounds/w");
  Rng g_rng = Rng::Stream(seed, "backward_contract/bounds/dy");
  const Tensor x = RandomNormal(DType::kBf16, {m, k}, 1.0, x_rng);
  const Tensor w = RandomNormal(DType::kBf16, {v, k}, 1.0, w_rng);
  const Tensor dy = RandomNormal(DType::kFp32, {m, v}, 1.0, g_rng);
  r.figures["m"] = m;
  r.figures["v"] = v;
  r.figures["k"] = k;

  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(ctx.client(), w, "backward_bounds");
  if (!weight.ok()) return weight.status();
  absl::StatusOr<Grads> g32 =
      Backward(ctx, dy, x, weight->handle(), DType::kFp32, DType::kFp32, "fp32 dX");
  if (!g32.ok()) return g32.status();
  absl::StatusOr<Grads> g16 =
      Backward(ctx, dy, x, weight->handle(), DType::kBf16, DType::kFp32, "bf16 dX");
  if (!g16.ok()) return g16.status();
  if (!CheckShape(r, g32->dx, DType::kFp32, {m, k}, "dX") ||
      !CheckShape(r, g16->dx, DType::kBf16, {m, k}, "dX bf16") ||
      !CheckShape(r, g32->dw, DType::kFp32, {v, k}, "dW")) {
    return absl::OkStatus();
  }

  const BoundStats dx32 = CheckGradInputBounds(dy, w, g32->dx);
  const BoundStats dx16 = CheckGradInputBounds(dy, w, g16->dx);
  const BoundStats dw32 = CheckGradWeightBounds(dy, x, g32->dw);
  ReportBounds(r, "dx_fp32", "dX fp32 (bound γ_V·Σ|g·w|)", {m, k}, dx32);
  ReportBounds(r, "dx_bf16", "dX bf16 (fp32 bound plus one bf16 rounding)", {m, k}, dx16);
  ReportBounds(r, "dw_fp32", "dW fp32 (bound γ_M·Σ|g·x|)", {v, k}, dw32);
  r.summary = absl::StrFormat("violations dx %d, dx16 %d, dw %d; worst %.2g%% of bound",
                              dx32.violations, dx16.violations, dw32.violations,
                              100 * std::max({dx32.worst_fraction, dw32.worst_fraction}));
  return absl::OkStatus();
}

class BackwardContractSuite final : public Suite {
 public:
  std::string name() const override { return kBackwardContractSuite; }
  std::vector<Case> Cases(const Options&) override {
    return {{"cast_rne", RunCast},
            {"fp32_dy_equals_bf16_dy", RunSameAsLegacy},
            {"exact_grads", RunExactGrads},
            {"grad_bounds", RunBounds}};
  }
};

}  // namespace

std::unique_ptr<Suite> MakeBackwardContractSuite() {
  return std::make_unique<BackwardContractSuite>();
}

}  // namespace logitd::validate
