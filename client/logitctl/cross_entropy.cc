// logitctl cross-entropy: the fused loss of the logits X.W^T against target
// ids, and its gradients, without the [M, V] logits; through gRPC or, with
// --shm, a shared-memory region.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "client/logitctl/shm_staging.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {
namespace {

// A double flag as a finite float (a cast past FLT_MAX is undefined).
absl::StatusOr<float> FiniteFloatFlag(absl::string_view flag, double value) {
  if (!std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": expected a finite fp32 value, got ", value));
  }
  return static_cast<float>(value);
}

// The fused cross-entropy with every tensor in one shared-memory region: X
// and the targets copied in, the outputs copied out into tensors.
absl::StatusOr<client::CrossEntropyResult> CrossEntropyViaShm(
    client::Client& c, const Tensor& x, const Tensor& targets, const std::string& handle,
    const client::CrossEntropyOptions& options) {
  const std::int64_t m = x.dim(0);
  absl::StatusOr<std::int64_t> v = WeightRows(c, handle);
  if (!v.ok()) return v.status();
  ShmStaging staging(c);
  const std::uint64_t x_at = staging.Reserve(x.nbytes());
  const std::uint64_t t_at = staging.Reserve(targets.nbytes());
  const std::uint64_t fp32 = sizeof(float);
  const std::int64_t loss_n = options.reduction == client::Reduction::kNone ? m : 1;
  const std::uint64_t loss_at = staging.Reserve(static_cast<std::uint64_t>(loss_n) * fp32);
  const std::uint64_t lse_at = staging.Reserve(options.want_lse ? m * fp32 : 0);
  const std::uint64_t dx_at =
      staging.Reserve(options.want_dx ? x.numel() * ElementSize(options.dx_dtype) : 0);
  const bool returns_dw = options.want_dw && !options.accumulate_dw;
  const std::uint64_t dw_at =
      staging.Reserve(returns_dw ? static_cast<std::uint64_t>(*v * x.dim(1)) * fp32 : 0);
  if (absl::Status s = staging.Open(); !s.ok()) return s;
  client::CrossEntropyShmArgs args;
  args.x = client::TensorInput::Shm(staging.Put(x, x_at), x.dtype(), x.shape());
  args.targets =
      client::TensorInput::Shm(staging.Put(targets, t_at), targets.dtype(), targets.shape());
  args.loss = client::TensorOutput::Shm(staging.Slot(loss_at));
  if (options.want_lse) args.lse = client::TensorOutput::Shm(staging.Slot(lse_at));
  if (options.want_dx) args.dx = client::TensorOutput::Shm(staging.Slot(dx_at));
  if (returns_dw) args.dw = client::TensorOutput::Shm(staging.Slot(dw_at));
  absl::StatusOr<client::CrossEntropyShmResult> r = c.CrossEntropyShm(args, handle, options);
  const absl::Status released = staging.Close();
  if (!r.ok()) return r.status();
  if (!released.ok()) return released;
  client::CrossEntropyResult out;
  out.counted_tokens = r->counted_tokens;
  out.timing = r->timing;
  absl::StatusOr<Tensor> loss = staging.Take(*r->loss_shm);
  if (!loss.ok()) return loss.status();
  out.loss = *std::move(loss);
  for (auto [from, to] :
       {std::make_pair(&r->lse_shm, &out.lse), std::make_pair(&r->dx_shm, &out.dx),
        std::make_pair(&r->dw_shm, &out.dw)}) {
    if (!from->has_value()) continue;
    absl::StatusOr<Tensor> t = staging.Take(**from);
    if (!t.ok()) return t.status();
    *to = *std::move(t);
  }
  return out;
}

// The call's options from the flags.
absl::StatusOr<client::CrossEntropyOptions> ReadOptions() {
  client::CrossEntropyOptions options;
  absl::StatusOr<client::Reduction> reduction = ParseReduction(absl::GetFlag(FLAGS_reduction));
  if (!reduction.ok()) return reduction.status();
  options.reduction = *reduction;
  options.ignore_index = absl::GetFlag(FLAGS_ignore_index);
  absl::StatusOr<float> z_loss = FiniteFloatFlag("z_loss", absl::GetFlag(FLAGS_z_loss));
  if (!z_loss.ok()) return z_loss.status();
  absl::StatusOr<float> softcap =
      FiniteFloatFlag("logit_softcap", absl::GetFlag(FLAGS_logit_softcap));
  if (!softcap.ok()) return softcap.status();
  absl::StatusOr<float> grad_scale = FiniteFloatFlag("grad_scale", absl::GetFlag(FLAGS_grad_scale));
  if (!grad_scale.ok()) return grad_scale.status();
  if (*grad_scale == 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat("--grad_scale: expected a non-zero scale, got ",
                                                   absl::GetFlag(FLAGS_grad_scale)));
  }
  options.z_loss = *z_loss;
  options.logit_softcap = *softcap;
  options.grad_scale = *grad_scale;
  options.want_lse = absl::GetFlag(FLAGS_lse);
  options.want_dx = absl::GetFlag(FLAGS_dx);
  options.want_dw = absl::GetFlag(FLAGS_dw);
  options.accumulate_dw = absl::GetFlag(FLAGS_accumulate);
  options.pipeline = absl::GetFlag(FLAGS_pipeline);
  if (options.accumulate_dw && !options.want_dw) {
    return absl::InvalidArgumentError(
        "cross-entropy: --accumulate adds dW into the server-held buffer; add --dw");
  }
  absl::StatusOr<DType> dx_dtype =
      ParseDTypeFlag("dx_dtype", absl::GetFlag(FLAGS_dx_dtype), {DType::kBf16, DType::kFp32});
  if (!dx_dtype.ok()) return dx_dtype.status();
  options.dx_dtype = *dx_dtype;
  return options;
}

// The rows printed after a call: where the outputs went, the loss, and each
// output's dtype and shape.
std::vector<std::pair<std::string, std::string>> ResultRows(
    const std::string& out, const client::CrossEntropyOptions& options,
    const client::CrossEntropyResult& r) {
  std::vector<std::pair<std::string, std::string>> rows = {{"out", out}};
  if (r.loss.numel() == 1 && r.loss.dtype() == DType::kFp32) {
    rows.emplace_back("loss", absl::StrFormat("%.9g", r.loss.data<float>()[0]));
  } else {
    rows.emplace_back("loss",
                      absl::StrCat(DTypeName(r.loss.dtype()), " ", ShapeString(r.loss.shape())));
  }
  rows.emplace_back("reduction", std::string(ReductionName(options.reduction)));
  rows.emplace_back("counted_tokens", absl::StrCat(r.counted_tokens));
  if (r.lse) {
    rows.emplace_back("lse",
                      absl::StrCat(DTypeName(r.lse->dtype()), " ", ShapeString(r.lse->shape())));
  }
  if (r.dx) {
    rows.emplace_back("dx",
                      absl::StrCat(DTypeName(r.dx->dtype()), " ", ShapeString(r.dx->shape())));
  }
  if (r.dw) {
    rows.emplace_back("dw",
                      absl::StrCat(DTypeName(r.dw->dtype()), " ", ShapeString(r.dw->shape())));
  } else if (options.accumulate_dw && options.want_dw) {
    rows.emplace_back("dw", "accumulated on the server (grad fetch to read it)");
  }
  return rows;
}

}  // namespace

int CmdCrossEntropy(const std::vector<std::string>& words) {
  if (words.size() != 1) {
    return UsageError("cross-entropy takes flags only (--x, --targets, --weight, --out)");
  }
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("cross-entropy: --weight=HANDLE is required");
  if (out.empty()) return UsageError("cross-entropy: --out=FILE is required");
  absl::StatusOr<client::CrossEntropyOptions> parsed = ReadOptions();
  if (!parsed.ok()) return UsageError(parsed.status().message());
  const client::CrossEntropyOptions& options = *parsed;

  absl::StatusOr<NamedTensor> loaded_x = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded_x.ok()) return InputError(loaded_x.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded_x), "X");
  if (!x.ok()) return InputError(x.status());
  absl::StatusOr<NamedTensor> targets = LoadTensorRef(absl::GetFlag(FLAGS_targets), "--targets");
  if (!targets.ok()) return InputError(targets.status());
  if (targets->tensor.dtype() != DType::kInt32 && targets->tensor.dtype() != DType::kInt64) {
    return InputError(absl::InvalidArgumentError(
        absl::StrCat("--targets '", targets->name, "': expected int32 or int64 token ids, got ",
                     DTypeName(targets->tensor.dtype()))));
  }

  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::CrossEntropyResult> r =
        absl::GetFlag(FLAGS_shm) ? CrossEntropyViaShm(c, *x, targets->tensor, handle, options)
                                 : c.CrossEntropy(*x, targets->tensor, handle, options);
    if (!r.ok()) return ServerError(r.status());
    std::vector<std::pair<std::string, const Tensor*>> tensors = {{"loss", &r->loss}};
    if (r->lse) tensors.emplace_back("lse", &*r->lse);
    if (r->dx) tensors.emplace_back("dx", &*r->dx);
    if (r->dw) tensors.emplace_back("dw", &*r->dw);
    if (absl::Status s = WriteOutput(out, tensors,
                                     {{"weight_handle", handle},
                                      {"reduction", std::string(ReductionName(options.reduction))},
                                      {"ignore_index", absl::StrCat(options.ignore_index)},
                                      {"z_loss", absl::StrCat(options.z_loss)},
                                      {"logit_softcap", absl::StrCat(options.logit_softcap)},
                                      {"grad_scale", absl::StrCat(options.grad_scale)},
                                      {"counted_tokens", absl::StrCat(r->counted_tokens)},
                                      {"producer", "logitctl cross-entropy"}});
        !s.ok()) {
      return InputError(s);
    }
    std::vector<std::pair<std::string, std::string>> rows = ResultRows(out, options, *r);
    AppendTiming(r->timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
