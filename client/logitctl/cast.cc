// logitctl cast: the server's fp32 -> bf16 rounding of a tensor, through
// gRPC or, with --shm, a shared-memory region.
#include <cstdint>
#include <string>
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

// The cast with its input and output in one shared-memory region.
absl::StatusOr<Tensor> CastViaShm(client::Client& c, const Tensor& in) {
  ShmStaging staging(c);
  const std::uint64_t in_at = staging.Reserve(in.nbytes());
  const std::uint64_t out_at = staging.Reserve(in.nbytes() / 2);
  if (absl::Status s = staging.Open(); !s.ok()) return s;
  client::CastShmArgs args;
  args.input = client::TensorInput::Shm(staging.Put(in, in_at), in.dtype(), in.shape());
  args.output = client::TensorOutput::Shm(staging.Slot(out_at));
  absl::StatusOr<client::CastShmResult> r = c.CastShm(args);
  const absl::Status released = staging.Close();
  if (!r.ok()) return r.status();
  if (!released.ok()) return released;
  return staging.Take(*r->output_shm);
}

}  // namespace

int CmdCast(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("cast takes flags only (--in, --out)");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("cast: --out=FILE is required");
  absl::StatusOr<NamedTensor> in = LoadTensorRef(absl::GetFlag(FLAGS_in), "--in");
  if (!in.ok()) return InputError(in.status());
  return WithClient([&](client::Client& c) {
    absl::StatusOr<Tensor> y =
        absl::GetFlag(FLAGS_shm) ? CastViaShm(c, in->tensor) : c.CastToBf16(in->tensor);
    if (!y.ok()) return ServerError(y.status());
    // The output keeps the input's tensor name: the file is the bf16 twin.
    if (absl::Status s = WriteOutput(out, {{in->name, &*y}}, {{"producer", "logitctl cast"}});
        !s.ok()) {
      return InputError(s);
    }
    PrintRows({{"out", absl::StrCat(out, " (tensor \"", in->name, "\")")},
               {"shape", ShapeString(y->shape())},
               {"dtype", std::string(DTypeName(y->dtype()))}});
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
