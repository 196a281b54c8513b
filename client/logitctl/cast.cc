// logitctl cast: the server's fp32 -> bf16 rounding of a tensor.
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {

int CmdCast(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("cast takes flags only (--in, --out)");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("cast: --out=FILE is required");
  absl::StatusOr<NamedTensor> in = LoadTensorRef(absl::GetFlag(FLAGS_in), "--in");
  if (!in.ok()) return InputError(in.status());
  return WithClient([&](client::Client& c) {
    absl::StatusOr<Tensor> y = c.CastToBf16(in->tensor);
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
