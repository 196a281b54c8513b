#include "server/service/validation.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/wire.h"

namespace logitd::service {
namespace {

// "FP32", or "unknown dtype 17" for a value this build does not know.
std::string ProtoDTypeName(v1::DType dtype) {
  const std::string& name = v1::DType_Name(dtype);
  if (name.empty()) return absl::StrCat("unknown dtype ", static_cast<int>(dtype));
  absl::string_view n = name;
  if (absl::StartsWith(n, "DTYPE_")) n.remove_prefix(6);
  return std::string(n);
}

std::vector<std::int64_t> ShapeOf(const v1::TensorSpec& spec) {
  return {spec.shape().begin(), spec.shape().end()};
}

absl::Status CheckPresent(absl::string_view what, bool present, const v1::TensorSpec& spec) {
  if (!present) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the header has no TensorSpec"));
  }
  if (spec.name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": TensorSpec.name is empty (chunks name the tensor they belong to)"));
  }
  if (spec.xxh3() == 0) {
    // 0 means "digest follows the chunks" on responses only; a request's
    // digest is checked when its bytes have arrived, so it must be sent.
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": TensorSpec.xxh3 is 0; a request tensor's spec carries the xxh3-64 (seed 0) of "
        "its bytes"));
  }
  return absl::OkStatus();
}

// Checks the dtype is one of `allowed` and returns it.
absl::StatusOr<DType> CheckDType(absl::string_view what, const v1::TensorSpec& spec,
                                 std::initializer_list<v1::DType> allowed) {
  for (v1::DType a : allowed) {
    if (spec.dtype() == a) return wire::FromProto(a);
  }
  std::vector<std::string> names;
  for (v1::DType a : allowed) names.push_back(ProtoDTypeName(a));
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected dtype ",
                                                 absl::StrJoin(names, " or "), ", got ",
                                                 ProtoDTypeName(spec.dtype())));
}

absl::Status CheckRank2(absl::string_view what, absl::string_view dims,
                        const std::vector<std::int64_t>& shape) {
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected rank 2 ", dims, ", got ", ShapeString(shape)));
  }
  return absl::OkStatus();
}

// Byte count with overflow and non-positive dims reported against the tensor.
absl::StatusOr<std::uint64_t> Bytes(absl::string_view what, const std::vector<std::int64_t>& shape,
                                    DType dtype) {
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, dtype);
  if (!n.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n.status().message()));
  }
  return static_cast<std::uint64_t>(*n);
}

// An output dtype: one of `allowed`, or `fallback` when unspecified.
absl::StatusOr<DType> OutputDType(absl::string_view field, v1::DType requested, v1::DType fallback,
                                  std::initializer_list<v1::DType> allowed) {
  if (requested == v1::DTYPE_UNSPECIFIED) requested = fallback;
  for (v1::DType a : allowed) {
    if (requested == a) return wire::FromProto(a);
  }
  std::vector<std::string> names;
  for (v1::DType a : allowed) names.push_back(ProtoDTypeName(a));
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", absl::StrJoin(names, " or "),
                                                 " (unspecified means ", ProtoDTypeName(fallback),
                                                 "), got ", ProtoDTypeName(requested)));
}

// One tensor of a call, for the per-call byte limit and its message.
struct Part {
  absl::string_view name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes;
};

absl::Status CheckCallBytes(absl::string_view method, const std::vector<Part>& parts,
                            std::uint64_t max_request_bytes) {
  std::uint64_t total = 0;
  bool overflow = false;
  for (const Part& p : parts) {
    if (p.bytes > std::numeric_limits<std::uint64_t>::max() - total) overflow = true;
    total += p.bytes;
  }
  if (!overflow && total <= max_request_bytes) return absl::OkStatus();
  std::vector<std::string> items;
  for (const Part& p : parts) {
    items.push_back(absl::StrFormat("%s %s %s = %d bytes", p.name, DTypeName(p.dtype),
                                    ShapeString(p.shape), p.bytes));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s: request and response need %s bytes in one call (%s), over the limit of %d bytes per "
      "call (server flag --max_request_bytes); split the call into smaller ones",
      method, overflow ? std::string("more than 2^64") : absl::StrCat(total),
      absl::StrJoin(items, ", "), max_request_bytes));
}

// x: BF16 [M, K] with K equal to the weight's.
absl::StatusOr<std::uint64_t> CheckActivations(bool present, const v1::TensorSpec& x,
                                               const WeightDims& weight) {
  absl::Status s = CheckPresent("x", present, x);
  if (!s.ok()) return s;
  absl::StatusOr<DType> dtype = CheckDType("x", x, {v1::DTYPE_BF16});
  if (!dtype.ok()) return dtype.status();
  const std::vector<std::int64_t> shape = ShapeOf(x);
  s = CheckRank2("x", "[M, K]", shape);
  if (!s.ok()) return s;
  absl::StatusOr<std::uint64_t> bytes = Bytes("x", shape, DType::kBf16);
  if (!bytes.ok()) return bytes.status();
  if (shape[1] != weight.k) {
    return absl::InvalidArgumentError(absl::StrCat("x: expected K=", weight.k, " to match weight ",
                                                   weight.label, ", got ", ShapeString(shape)));
  }
  return bytes;
}

// An output slot in shared memory for an output the call does not return.
absl::Status UnusedOutputSlot(bool given, absl::string_view field, absl::string_view why) {
  if (!given) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": given, but ", why));
}

// The start of a Backward or CrossEntropy plan: the gradients asked for
// (accumulating is a way of delivering dW, so it asks for dW) and x, which
// sets M.
template <typename Header>
absl::Status StartGradientPlan(const Header& header, const WeightDims& weight, GradientPlan* plan) {
  plan->want_dx = header.want_dx();
  plan->want_dw = header.want_dw();
  plan->accumulate_dw = header.accumulate_dw();
  if (plan->accumulate_dw && !plan->want_dw) {
    return absl::InvalidArgumentError(
        "accumulate_dw: expected want_dw=true (accumulation computes dW), got want_dw=false");
  }
  absl::StatusOr<std::uint64_t> x_bytes = CheckActivations(header.has_x(), header.x(), weight);
  if (!x_bytes.ok()) return x_bytes.status();
  plan->x_bytes = *x_bytes;
  plan->m = header.x().shape(0);
  return absl::OkStatus();
}

// dx_dtype: BF16 (the default) or FP32.
absl::Status SetDxDType(v1::DType requested, GradientPlan* plan) {
  absl::StatusOr<DType> dx_dtype =
      OutputDType("dx_dtype", requested, v1::DTYPE_BF16, {v1::DTYPE_BF16, v1::DTYPE_FP32});
  if (!dx_dtype.ok()) return dx_dtype.status();
  plan->dx_dtype = *dx_dtype;
  return absl::OkStatus();
}

// A call's second input beside x (dy, targets): present, and named apart from
// x, since each chunk names the tensor it belongs to.
absl::Status CheckPresentBesideX(absl::string_view what, bool present, const v1::TensorSpec& spec,
                                 const v1::TensorSpec& x) {
  absl::Status s = CheckPresent(what, present, spec);
  if (!s.ok()) return s;
  if (spec.name() == x.name()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ", x: expected distinct TensorSpec names, both are '", spec.name(), "'"));
  }
  return absl::OkStatus();
}

// The target ids of a call over activations `x` of M rows: INT32 or INT64
// [M], named apart from x. Sets their dtype and byte count.
absl::Status CheckTargets(bool present, const v1::TensorSpec& targets, const v1::TensorSpec& x,
                          std::int64_t m, DType* dtype, std::uint64_t* bytes) {
  absl::Status s = CheckPresentBesideX("targets", present, targets, x);
  if (!s.ok()) return s;
  absl::StatusOr<DType> targets_dtype =
      CheckDType("targets", targets, {v1::DTYPE_INT32, v1::DTYPE_INT64});
  if (!targets_dtype.ok()) return targets_dtype.status();
  *dtype = *targets_dtype;
  const std::vector<std::int64_t> shape = ShapeOf(targets);
  if (shape.size() != 1 || shape[0] != m) {
    return absl::InvalidArgumentError(absl::StrCat("targets: expected rank 1 [M] with M=", m,
                                                   " to match x ", ShapeString(ShapeOf(x)),
                                                   ", got ", ShapeString(shape)));
  }
  absl::StatusOr<std::uint64_t> b = Bytes("targets", shape, *dtype);
  if (!b.ok()) return b.status();
  *bytes = *b;
  return absl::OkStatus();
}

// The end of a Backward or CrossEntropy plan. The gradients it returns: dX
// [M, K] when wanted, dW [V, K] of `dw_dtype` when it travels back rather
// than being accumulated; sets their byte counts and adds them to the call's
// `parts`. Then no shared-memory slot for a gradient the call does not
// return, and the per-call byte limit over all the parts.
template <typename Header>
absl::Status FinishGradientPlan(absl::string_view method, const Header& header,
                                const WeightDims& weight, DType dw_dtype, std::vector<Part> parts,
                                std::uint64_t max_request_bytes, GradientPlan* plan) {
  if (plan->want_dx) {
    const std::vector<std::int64_t> dx_shape = {plan->m, weight.k};
    absl::StatusOr<std::uint64_t> b = Bytes("dx", dx_shape, plan->dx_dtype);
    if (!b.ok()) return b.status();
    plan->dx_bytes = *b;
    parts.push_back({"dx", plan->dx_dtype, dx_shape, plan->dx_bytes});
  }
  if (plan->returns_dw()) {
    const std::vector<std::int64_t> dw_shape = {weight.v, weight.k};
    absl::StatusOr<std::uint64_t> b = Bytes("dw", dw_shape, dw_dtype);
    if (!b.ok()) return b.status();
    plan->dw_bytes = *b;
    parts.push_back({"dw", dw_dtype, dw_shape, plan->dw_bytes});
  }
  absl::Status s = UnusedOutputSlot(header.has_dx_shm() && !plan->want_dx, "dx_shm",
                                    "dX is not asked for (want_dx)");
  if (!s.ok()) return s;
  s = UnusedOutputSlot(header.has_dw_shm() && !plan->returns_dw(), "dw_shm",
                       "dW is not returned (want_dw without accumulate_dw)");
  if (!s.ok()) return s;
  return CheckCallBytes(method, parts, max_request_bytes);
}

}  // namespace

absl::StatusOr<std::filesystem::path> ResolveWeightPath(const std::filesystem::path& dir,
                                                        absl::string_view relative) {
  namespace fs = std::filesystem;
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "this server was started without --weights_dir, so it loads no weights from files");
  }
  if (relative.empty()) {
    return absl::InvalidArgumentError(
        "path: expected a file relative to the server's --weights_dir, got an empty path");
  }
  if (relative.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path: expected a file name, got one with a NUL byte");
  }
  const fs::path rel{std::string(relative)};
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    return absl::PermissionDeniedError(
        absl::StrCat("path '", relative,
                     "': expected a path relative to the server's --weights_dir, got an "
                     "absolute one"));
  }
  for (const fs::path& part : rel) {
    if (part == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("path '", relative,
                       "': expected a path inside the server's --weights_dir, got one "
                       "with a '..' component"));
    }
  }
  std::error_code ec;
  // Messages name only what the caller sent: the server's own paths are
  // the operator's business (its log has them).
  const fs::path root = fs::canonical(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("the server's --weights_dir cannot be resolved (", ec.message(),
                     "); its operator must fix it"));
  }
  const fs::path resolved = fs::weakly_canonical(root / rel, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("path '", relative, "' cannot be resolved: ", ec.message()));
  }
  // Inside means: every component of root, then at least one more.
  auto r = root.begin();
  auto p = resolved.begin();
  for (; r != root.end() && p != resolved.end(); ++r, ++p) {
    if (*r != *p) break;
  }
  if (r != root.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "path '", relative, "' leads outside the server's --weights_dir (symbolic links count)"));
  }
  if (p == resolved.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path '", relative, "' names the --weights_dir itself; expected a file in it"));
  }
  const fs::file_status status = fs::status(resolved, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat("path '", relative, "': no such file in the server's --weights_dir"));
  }
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path '", relative, "': expected a safetensors file, got a directory or special file"));
  }
  return resolved;
}

absl::Status ValidateHandle(absl::string_view handle) {
  if (handle.empty()) {
    return absl::InvalidArgumentError(
        "weight_handle: expected a handle from RegisterWeight, got an empty string");
  }
  return absl::OkStatus();
}

absl::StatusOr<WeightPlan> ValidateRegisterWeight(const v1::RegisterWeightHeader& header) {
  if (header.name().size() > kMaxWeightNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name: expected at most ", kMaxWeightNameBytes,
                                                   " bytes, got ", header.name().size()));
  }
  const v1::TensorSpec& w = header.weight();
  absl::Status s = CheckPresent("weight", header.has_weight(), w);
  if (!s.ok()) return s;
  absl::StatusOr<DType> dtype = CheckDType("weight", w, {v1::DTYPE_BF16});
  if (!dtype.ok()) return dtype.status();
  return WeightPlanOf(ShapeOf(w));
}

absl::StatusOr<WeightPlan> WeightPlanOf(const std::vector<std::int64_t>& shape) {
  absl::Status s = CheckRank2("weight", "[V, K]", shape);
  if (!s.ok()) return s;
  // The fp32 gradient buffer may follow; its size must be representable too.
  absl::StatusOr<std::uint64_t> grad_bytes = Bytes("weight", shape, DType::kFp32);
  if (!grad_bytes.ok()) return grad_bytes.status();
  WeightPlan plan;
  plan.v = shape[0];
  plan.k = shape[1];
  plan.bytes = *grad_bytes / 2;
  return plan;
}

absl::StatusOr<LogitsPlan> ValidateLogits(const v1::LogitsHeader& header, const WeightDims& weight,
                                          std::uint64_t max_request_bytes) {
  LogitsPlan plan;
  absl::StatusOr<std::uint64_t> x_bytes = CheckActivations(header.has_x(), header.x(), weight);
  if (!x_bytes.ok()) return x_bytes.status();
  plan.x_bytes = *x_bytes;
  plan.m = header.x().shape(0);

  absl::StatusOr<DType> out = OutputDType("out_dtype", header.out_dtype(), v1::DTYPE_FP32,
                                          {v1::DTYPE_FP32, v1::DTYPE_BF16});
  if (!out.ok()) return out.status();
  plan.out_dtype = *out;

  const float alpha = header.alpha();
  if (!std::isfinite(alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alpha: expected a finite scale (0 means 1), got ", alpha));
  }
  plan.alpha = alpha == 0.0f ? 1.0f : alpha;

  const std::vector<std::int64_t> y_shape = {plan.m, weight.v};
  absl::StatusOr<std::uint64_t> y_bytes = Bytes("y", y_shape, plan.out_dtype);
  if (!y_bytes.ok()) return y_bytes.status();
  plan.y_bytes = *y_bytes;

  absl::Status s = CheckCallBytes("logits",
                                  {{"x", DType::kBf16, ShapeOf(header.x()), plan.x_bytes},
                                   {"y", plan.out_dtype, y_shape, plan.y_bytes}},
                                  max_request_bytes);
  if (!s.ok()) return s;
  return plan;
}

absl::StatusOr<BackwardPlan> ValidateBackward(const v1::BackwardHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes) {
  if (!header.want_dx() && !header.want_dw()) {
    return absl::InvalidArgumentError(
        "want_dx, want_dw: expected at least one gradient to be requested, got neither");
  }
  BackwardPlan plan;
  absl::Status s = StartGradientPlan(header, weight, &plan);
  if (!s.ok()) return s;

  const v1::TensorSpec& dy = header.dy();
  s = CheckPresentBesideX("dy", header.has_dy(), dy, header.x());
  if (!s.ok()) return s;
  absl::StatusOr<DType> dy_dtype = CheckDType("dy", dy, {v1::DTYPE_FP32, v1::DTYPE_BF16});
  if (!dy_dtype.ok()) return dy_dtype.status();
  plan.dy_dtype = *dy_dtype;
  const std::vector<std::int64_t> dy_shape = ShapeOf(dy);
  s = CheckRank2("dy", "[M, V]", dy_shape);
  if (!s.ok()) return s;
  absl::StatusOr<std::uint64_t> dy_bytes = Bytes("dy", dy_shape, plan.dy_dtype);
  if (!dy_bytes.ok()) return dy_bytes.status();
  plan.dy_bytes = *dy_bytes;
  if (dy_shape[1] != weight.v) {
    return absl::InvalidArgumentError(absl::StrCat("dy: expected V=", weight.v, " to match weight ",
                                                   weight.label, ", got ", ShapeString(dy_shape)));
  }
  if (dy_shape[0] != plan.m) {
    return absl::InvalidArgumentError(absl::StrCat("dy: expected M=", plan.m, " to match x ",
                                                   ShapeString(ShapeOf(header.x())), ", got ",
                                                   ShapeString(dy_shape)));
  }

  s = SetDxDType(header.dx_dtype(), &plan);
  if (!s.ok()) return s;
  if (plan.accumulate_dw) {
    if (header.dw_dtype() != v1::DTYPE_UNSPECIFIED && header.dw_dtype() != v1::DTYPE_FP32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dw_dtype: accumulate_dw adds into the fp32 gradient buffer, so expected FP32 or "
          "unspecified, got ",
          ProtoDTypeName(header.dw_dtype())));
    }
    plan.dw_dtype = DType::kFp32;
  } else {
    absl::StatusOr<DType> dw_dtype = OutputDType("dw_dtype", header.dw_dtype(), v1::DTYPE_FP32,
                                                 {v1::DTYPE_FP32, v1::DTYPE_BF16});
    if (!dw_dtype.ok()) return dw_dtype.status();
    plan.dw_dtype = *dw_dtype;
  }

  s = FinishGradientPlan("backward", header, weight, plan.dw_dtype,
                         {{"dy", plan.dy_dtype, dy_shape, plan.dy_bytes},
                          {"x", DType::kBf16, ShapeOf(header.x()), plan.x_bytes}},
                         max_request_bytes, &plan);
  if (!s.ok()) return s;
  return plan;
}

absl::StatusOr<CrossEntropyPlan> ValidateCrossEntropy(const v1::CrossEntropyHeader& header,
                                                      const WeightDims& weight,
                                                      std::uint64_t max_request_bytes) {
  CrossEntropyPlan plan;
  plan.want_lse = header.want_lse();
  absl::Status s = StartGradientPlan(header, weight, &plan);
  if (!s.ok()) return s;

  s = CheckTargets(header.has_targets(), header.targets(), header.x(), plan.m, &plan.targets_dtype,
                   &plan.targets_bytes);
  if (!s.ok()) return s;
  const std::vector<std::int64_t> targets_shape = ShapeOf(header.targets());

  plan.ignore_index = header.has_ignore_index() ? header.ignore_index() : -100;
  switch (header.reduction()) {
    case v1::REDUCTION_UNSPECIFIED:
    case v1::REDUCTION_MEAN:
      plan.reduction = v1::REDUCTION_MEAN;
      break;
    case v1::REDUCTION_NONE:
    case v1::REDUCTION_SUM:
      plan.reduction = header.reduction();
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("reduction: expected NONE, SUM or MEAN (unspecified means MEAN), got ",
                       static_cast<int>(header.reduction())));
  }

  const float z_loss = header.z_loss();
  if (!std::isfinite(z_loss) || z_loss < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("z_loss: expected a finite coefficient >= 0 (0 = off), got ", z_loss));
  }
  plan.z_loss = z_loss;
  const float cap = header.logit_softcap();
  if (!std::isfinite(cap) || cap < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_softcap: expected 0 (off) or a finite cap > 0, got ", cap));
  }
  plan.logit_softcap = cap;
  const float grad_scale = header.grad_scale();
  if (!std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_scale: expected a finite incoming gradient (0 means 1), got ", grad_scale));
  }
  plan.grad_scale = grad_scale == 0.0f ? 1.0f : grad_scale;

  s = SetDxDType(header.dx_dtype(), &plan);
  if (!s.ok()) return s;

  std::vector<Part> parts = {{"x", DType::kBf16, ShapeOf(header.x()), plan.x_bytes},
                             {"targets", plan.targets_dtype, targets_shape, plan.targets_bytes}};
  plan.loss_shape = {plan.reduction == v1::REDUCTION_NONE ? plan.m : 1};
  absl::StatusOr<std::uint64_t> b = Bytes("loss", plan.loss_shape, DType::kFp32);
  if (!b.ok()) return b.status();
  plan.loss_bytes = *b;
  parts.push_back({"loss", DType::kFp32, plan.loss_shape, plan.loss_bytes});
  if (plan.want_lse) {
    const std::vector<std::int64_t> lse_shape = {plan.m};
    b = Bytes("lse", lse_shape, DType::kFp32);
    if (!b.ok()) return b.status();
    plan.lse_bytes = *b;
    parts.push_back({"lse", DType::kFp32, lse_shape, plan.lse_bytes});
  }
  s = UnusedOutputSlot(header.has_lse_shm() && !plan.want_lse, "lse_shm",
                       "the log-sum-exp is not asked for (want_lse)");
  if (!s.ok()) return s;
  // CrossEntropy's dW is always fp32 (its header has no dw_dtype).
  s = FinishGradientPlan("cross entropy", header, weight, DType::kFp32, std::move(parts),
                         max_request_bytes, &plan);
  if (!s.ok()) return s;
  return plan;
}

absl::StatusOr<CastPlan> ValidateCast(const v1::CastHeader& header,
                                      std::uint64_t max_request_bytes) {
  CastPlan plan;
  const v1::TensorSpec& in = header.input();
  absl::Status s = CheckPresent("input", header.has_input(), in);
  if (!s.ok()) return s;
  absl::StatusOr<DType> dtype = CheckDType("input", in, {v1::DTYPE_FP32});
  if (!dtype.ok()) return dtype.status();
  plan.shape = ShapeOf(in);
  if (plan.shape.empty()) {
    return absl::InvalidArgumentError("input: expected rank >= 1, got a shape with no dimensions");
  }
  absl::StatusOr<std::uint64_t> in_bytes = Bytes("input", plan.shape, DType::kFp32);
  if (!in_bytes.ok()) return in_bytes.status();
  plan.in_bytes = *in_bytes;
  plan.n = static_cast<std::int64_t>(plan.in_bytes / 4);
  plan.out_bytes = plan.in_bytes / 2;
  s = CheckCallBytes("cast",
                     {{"input", DType::kFp32, plan.shape, plan.in_bytes},
                      {"output", DType::kBf16, plan.shape, plan.out_bytes}},
                     max_request_bytes);
  if (!s.ok()) return s;
  return plan;
}

absl::StatusOr<ProbePlan> ValidateProbe(const v1::ProbeHeader& header, std::size_t chunk_bytes,
                                        std::uint64_t max_request_bytes) {
  ProbePlan plan;
  plan.request_bytes = header.request_bytes();
  plan.response_bytes = header.response_bytes();
  if (header.chunk_bytes() > chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "probe: chunk_bytes: expected 1 to %d (the server's --chunk_bytes) or 0 for that, got %d",
        chunk_bytes, header.chunk_bytes()));
  }
  plan.chunk_bytes =
      header.chunk_bytes() == 0 ? chunk_bytes : static_cast<std::size_t>(header.chunk_bytes());
  const bool overflow =
      plan.request_bytes > std::numeric_limits<std::uint64_t>::max() - plan.response_bytes;
  if (overflow || plan.request_bytes + plan.response_bytes > max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "probe: request_bytes %d and response_bytes %d need %s bytes in one call, over the limit "
        "of %d bytes per call (server flag --max_request_bytes)",
        plan.request_bytes, plan.response_bytes,
        overflow ? std::string("more than 2^64")
                 : absl::StrCat(plan.request_bytes + plan.response_bytes),
        max_request_bytes));
  }
  return plan;
}

absl::StatusOr<LogProbsPlan> ValidateLogProbs(const v1::LogProbsHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes) {
  LogProbsPlan plan;
  absl::StatusOr<std::uint64_t> x_bytes = CheckActivations(header.has_x(), header.x(), weight);
  if (!x_bytes.ok()) return x_bytes.status();
  plan.x_bytes = *x_bytes;
  plan.m = header.x().shape(0);
  std::vector<Part> parts = {{"x", DType::kBf16, ShapeOf(header.x()), plan.x_bytes}};
  plan.has_targets = header.has_targets();
  if (plan.has_targets) {
    absl::Status s = CheckTargets(true, header.targets(), header.x(), plan.m, &plan.targets_dtype,
                                  &plan.targets_bytes);
    if (!s.ok()) return s;
    parts.push_back({"targets", plan.targets_dtype, {plan.m}, plan.targets_bytes});
  }
  plan.ignore_index = header.has_ignore_index() ? header.ignore_index() : -100;
  const float temperature = header.temperature();
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature: expected a finite temperature > 0 (0 means 1), got ", temperature));
  }
  plan.temperature = temperature == 0.0f ? 1.0f : temperature;
  const float cap = header.logit_softcap();
  if (!std::isfinite(cap) || cap < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_softcap: expected 0 (off) or a finite cap > 0, got ", cap));
  }
  plan.logit_softcap = cap;
  if (header.vocab_size() < 0 || header.vocab_size() > weight.v) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size: expected 0 (all ", weight.v,
                                                   ") to ", weight.v, " entries of weight ",
                                                   weight.label, ", got ", header.vocab_size()));
  }
  plan.vocab = header.vocab_size() == 0 ? weight.v : header.vocab_size();
  const std::int64_t max_k = std::min<std::int64_t>(kMaxTopK, plan.vocab);
  if (header.top_k() > static_cast<std::uint64_t>(max_k)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k: expected 0 to ", max_k, ", got ", header.top_k()));
  }
  plan.top_k = static_cast<std::int64_t>(header.top_k());
  plan.want_entropy = header.want_entropy();
  plan.want_lse = header.want_lse();
  plan.want_rank = header.want_rank();
  if (plan.want_rank && !plan.has_targets) {
    return absl::InvalidArgumentError("want_rank: the rank of a target needs targets, got none");
  }
  const std::uint64_t m = static_cast<std::uint64_t>(plan.m);
  if (plan.has_targets) plan.logprob_bytes = m * sizeof(float);
  if (plan.want_lse) plan.lse_bytes = m * sizeof(float);
  if (plan.want_entropy) plan.entropy_bytes = m * sizeof(float);
  plan.topk_ids_bytes = m * static_cast<std::uint64_t>(plan.top_k) * sizeof(std::int32_t);
  plan.topk_logprobs_bytes = m * static_cast<std::uint64_t>(plan.top_k) * sizeof(float);
  if (plan.want_rank) plan.rank_bytes = m * sizeof(std::int64_t);
  if (plan.logprob_bytes + plan.lse_bytes + plan.entropy_bytes + plan.topk_ids_bytes +
          plan.rank_bytes ==
      0) {
    return absl::InvalidArgumentError(
        "expected at least one output: targets (log-probs), top_k, want_entropy or want_lse");
  }
  parts.push_back({"outputs",
                   DType::kFp32,
                   {plan.m},
                   plan.logprob_bytes + plan.lse_bytes + plan.entropy_bytes + plan.topk_ids_bytes +
                       plan.topk_logprobs_bytes + plan.rank_bytes});
  for (const auto& [given, field, why] :
       {std::make_tuple(header.has_logprob_shm() && !plan.has_targets, "logprob_shm",
                        "log-probs need targets"),
        std::make_tuple(header.has_lse_shm() && !plan.want_lse, "lse_shm",
                        "the log-sum-exp is not asked for (want_lse)"),
        std::make_tuple(header.has_entropy_shm() && !plan.want_entropy, "entropy_shm",
                        "the entropy is not asked for (want_entropy)"),
        std::make_tuple(header.has_topk_ids_shm() && plan.top_k == 0, "topk_ids_shm", "top_k is 0"),
        std::make_tuple(header.has_topk_logprobs_shm() && plan.top_k == 0, "topk_logprobs_shm",
                        "top_k is 0"),
        std::make_tuple(header.has_rank_shm() && !plan.want_rank, "rank_shm",
                        "the rank is not asked for (want_rank)"),
        std::make_tuple(header.has_targets_shm() && !plan.has_targets, "targets_shm",
                        "the header has no targets")}) {
    if (absl::Status s = UnusedOutputSlot(given, field, why); !s.ok()) return s;
  }
  absl::Status s = CheckCallBytes("log probs", parts, max_request_bytes);
  if (!s.ok()) return s;
  return plan;
}

}  // namespace logitd::service
