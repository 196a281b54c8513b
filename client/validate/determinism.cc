// determinism: the same request must give the same bits. Replays the first
// request of every other selected suite (kept with its response when that
// suite ran) and sends a few requests of each kind twice in a row, then
// compares the two real responses bit for bit, NaN payloads and zero signs
// included.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/validate/random.h"
#include "client/validate/suites.h"
#include "logitd/reference/numerics.h"

namespace logitd::validate {
namespace {

constexpr char kDeterminismSuite[] = "determinism";
constexpr CompareOptions kStrict{/*signed_zero_equal=*/false, /*any_nan_equal=*/false};

using SendTwice = std::function<absl::StatusOr<std::vector<Tensor>>(client::Client&)>;

// Compares two sets of outputs; returns the number of differing elements.
std::int64_t CompareOutputs(CaseResult& r, const std::vector<Tensor>& first,
                            const std::vector<Tensor>& second, absl::string_view what) {
  if (!r.Check(first.size() == second.size(),
               absl::StrCat(what, ": ", first.size(), " outputs the first time, ", second.size(),
                            " the second"))) {
    return -1;
  }
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < first.size(); ++i) {
    const BitwiseComparison c = CompareTensors(second[i], first[i], kStrict);
    differing += c.differing;
    r.Check(c.differing == 0 && second[i].Digest() == first[i].Digest(),
            absl::StrCat(what, ", output ", i, " ", DTypeName(first[i].dtype()), " ",
                         ShapeString(first[i].shape()),
                         ": the second response differs from the "
                         "first: ",
                         c.Describe(first[i].shape())));
  }
  r.figures["outputs"] = first.size();
  r.figures["differing_elements"] = differing;
  r.summary = absl::StrCat(differing, " elements differ between two responses");
  return differing;
}

absl::Status RunReplay(RunContext& ctx, CaseResult& r, const std::string& suite) {
  const Replay* replay = ctx.FindReplay(suite);
  if (replay == nullptr) {
    r.Skip(absl::StrCat(suite, " completed no request to replay (see its own result)"));
    return absl::OkStatus();
  }
  r.figures["request"] = replay->description;
  absl::StatusOr<std::vector<Tensor>> again = replay->send(ctx.client());
  if (!again.ok()) return Annotate(again.status(), absl::StrCat("replay of ", replay->description));
  CompareOutputs(r, replay->first, *again, replay->description);
  return absl::OkStatus();
}

absl::Status RunTwice(RunContext& ctx, CaseResult& r, const std::string& what,
                      const SendTwice& send) {
  absl::StatusOr<std::vector<Tensor>> first = send(ctx.client());
  if (!first.ok()) return Annotate(first.status(), absl::StrCat(what, ", first"));
  absl::StatusOr<std::vector<Tensor>> second = send(ctx.client());
  if (!second.ok()) return Annotate(second.status(), absl::StrCat(what, ", second"));
  r.figures["request"] = what;
  CompareOutputs(r, *first, *second, what);
  return absl::OkStatus();
}

struct TwiceInputs {
  std::shared_ptr<Tensor> x, w, dy;
};

TwiceInputs MakeTwiceInputs(const Options& o) {
  const Shapes s = ShapesFor(o);
  const std::int64_t k = 1024;
  Rng x_rng = Rng::Stream(o.seed, "determinism/x");
  Rng w_rng = Rng::Stream(o.seed, "determinism/w");
  Rng g_rng = Rng::Stream(o.seed, "determinism/dy");
  TwiceInputs d;
  d.x = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {s.m, k}, 1.0, x_rng));
  d.w = std::make_shared<Tensor>(RandomNormal(DType::kBf16, {s.v, k}, 1.0, w_rng));
  d.dy = std::make_shared<Tensor>(RandomNormal(DType::kFp32, {s.m, s.v}, 1.0, g_rng));
  return d;
}

absl::Status RunLogitsTwice(RunContext& ctx, CaseResult& r, DType out_dtype) {
  const TwiceInputs d = MakeTwiceInputs(ctx.options());
  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(ctx.client(), *d.w, "determinism");
  if (!weight.ok()) return weight.status();
  client::LogitsOptions o;
  o.out_dtype = out_dtype;
  const std::string handle = weight->handle();
  return RunTwice(ctx, r, absl::StrCat("Logits ", DTypeName(out_dtype), " out"),
                  [&](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
                    absl::StatusOr<Tensor> y = c.Logits(*d.x, handle, o);
                    if (!y.ok()) return y.status();
                    std::vector<Tensor> out;
                    out.push_back(*std::move(y));
                    return out;
                  });
}

absl::Status RunBackwardTwice(RunContext& ctx, CaseResult& r) {
  const TwiceInputs d = MakeTwiceInputs(ctx.options());
  absl::StatusOr<ScopedWeight> weight = ScopedWeight::Register(ctx.client(), *d.w, "determinism");
  if (!weight.ok()) return weight.status();
  const std::string handle = weight->handle();
  return RunTwice(ctx, r, "Backward dX bf16, dW fp32",
                  [&](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
                    absl::StatusOr<client::BackwardResult> g = c.Backward(*d.dy, *d.x, handle, {});
                    if (!g.ok()) return g.status();
                    std::vector<Tensor> out;
                    if (g->dx.has_value()) out.push_back(*std::move(g->dx));
                    if (g->dw.has_value()) out.push_back(*std::move(g->dw));
                    return out;
                  });
}

absl::Status RunCastTwice(RunContext& ctx, CaseResult& r) {
  const TwiceInputs d = MakeTwiceInputs(ctx.options());
  return RunTwice(ctx, r, "Cast", [&](client::Client& c) -> absl::StatusOr<std::vector<Tensor>> {
    absl::StatusOr<Tensor> y = c.CastToBf16(*d.dy);
    if (!y.ok()) return y.status();
    std::vector<Tensor> out;
    out.push_back(*std::move(y));
    return out;
  });
}

class DeterminismSuite final : public Suite {
 public:
  std::string name() const override { return kDeterminismSuite; }
  std::vector<Case> Cases(const Options& options) override {
    std::vector<Case> cases;
    for (const std::string& suite : options.suites) {
      if (suite == kDeterminismSuite) continue;
      cases.push_back({absl::StrCat("replay_", suite), [suite](RunContext& ctx, CaseResult& r) {
                         return RunReplay(ctx, r, suite);
                       }});
    }
    cases.push_back({"logits_fp32_twice", [](RunContext& ctx, CaseResult& r) {
                       return RunLogitsTwice(ctx, r, DType::kFp32);
                     }});
    cases.push_back({"logits_bf16_twice", [](RunContext& ctx, CaseResult& r) {
                       return RunLogitsTwice(ctx, r, DType::kBf16);
                     }});
    cases.push_back({"backward_twice", RunBackwardTwice});
    cases.push_back({"cast_twice", RunCastTwice});
    return cases;
  }
};

}  // namespace

std::unique_ptr<Suite> MakeDeterminismSuite() { return std::make_unique<DeterminismSuite>(); }

}  // namespace logitd::validate
