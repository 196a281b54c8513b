// logitctl logits: Y = alpha * X.W^T through gRPC or, with --shm, a
// shared-memory region.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "client/logitctl/shm_staging.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {
namespace {

// Logits with X and Y in one shared-memory region of this process: X is
// copied in, Y copied out into a tensor.
absl::StatusOr<Tensor> LogitsViaShm(client::Client& c, const Tensor& x, const std::string& handle,
                                    const client::LogitsOptions& options, client::Timing* timing) {
  absl::StatusOr<std::int64_t> v = WeightRows(c, handle);
  if (!v.ok()) return v.status();
  absl::StatusOr<std::int64_t> y_bytes = CheckedByteCount({x.dim(0), *v}, options.out_dtype);
  if (!y_bytes.ok()) return y_bytes.status();
  ShmStaging staging(c);
  const std::uint64_t x_at = staging.Reserve(x.nbytes());
  const std::uint64_t y_at = staging.Reserve(static_cast<std::uint64_t>(*y_bytes));
  if (absl::Status s = staging.Open(); !s.ok()) return s;
  client::LogitsShmArgs args;
  args.x = client::TensorInput::Shm(staging.Put(x, x_at), x.dtype(), x.shape());
  args.y = client::TensorOutput::Shm(staging.Slot(y_at));
  absl::StatusOr<client::LogitsShmResult> r = c.LogitsShm(args, handle, options);
  const absl::Status released = staging.Close();
  if (!r.ok()) return r.status();
  if (!released.ok()) return released;
  if (timing != nullptr) *timing = r->timing;
  return staging.Take(*r->y_shm);
}

}  // namespace

int CmdLogits(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("logits takes flags only (--x, --weight, --out)");
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("logits: --weight=HANDLE is required");
  if (out.empty()) return UsageError("logits: --out=FILE is required");
  absl::StatusOr<DType> out_dtype =
      ParseDTypeFlag("out_dtype", absl::GetFlag(FLAGS_out_dtype), {DType::kFp32, DType::kBf16});
  if (!out_dtype.ok()) return UsageError(out_dtype.status().message());
  const double alpha = absl::GetFlag(FLAGS_alpha);
  if (alpha == 0 || !std::isfinite(alpha)) {
    return UsageError(absl::StrCat("--alpha: expected a finite non-zero scale, got ", alpha));
  }
  absl::StatusOr<NamedTensor> loaded = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded.ok()) return InputError(loaded.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded), "X");
  if (!x.ok()) return InputError(x.status());

  return WithClient([&](client::Client& c) {
    client::LogitsOptions options;
    options.out_dtype = *out_dtype;
    options.alpha = static_cast<float>(alpha);
    options.pipeline = absl::GetFlag(FLAGS_pipeline);
    options.connections = absl::GetFlag(FLAGS_connections);
    client::Timing timing;
    absl::StatusOr<Tensor> y = absl::GetFlag(FLAGS_shm)
                                   ? LogitsViaShm(c, *x, handle, options, &timing)
                                   : c.Logits(*x, handle, options, &timing);
    if (!y.ok()) return ServerError(y.status());
    if (absl::Status s = WriteOutput(out, {{"logits", &*y}},
                                     {{"weight_handle", handle},
                                      {"alpha", absl::StrCat(options.alpha)},
                                      {"producer", "logitctl logits"}});
        !s.ok()) {
      return InputError(s);
    }
    std::vector<std::pair<std::string, std::string>> rows = {
        {"out", absl::StrCat(out, " (tensor \"logits\")")},
        {"shape", ShapeString(y->shape())},
        {"dtype", std::string(DTypeName(y->dtype()))}};
    AppendTiming(timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
