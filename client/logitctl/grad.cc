// logitctl grad fetch and zero: the fp32 dW the server accumulates for a
// weight.
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

int CmdGrad(const std::vector<std::string>& words) {
  if (words.size() != 3 || (words[1] != "fetch" && words[1] != "zero")) {
    return UsageError("usage: grad fetch HANDLE --out=FILE [--zero] | grad zero HANDLE");
  }
  const std::string handle = words[2];
  if (words[1] == "zero") {
    return WithClient([&](client::Client& c) {
      if (absl::Status s = c.ZeroGradient(handle); !s.ok()) return ServerError(s);
      PrintRows({{"zeroed", handle}});
      return kExitOk;
    });
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return UsageError("grad fetch: --out=FILE is required");
  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::GradientResult> g = c.FetchGradient(handle, absl::GetFlag(FLAGS_zero));
    if (!g.ok()) return ServerError(g.status());
    if (absl::Status s = WriteOutput(out, {{"dw", &g->dw}},
                                     {{"weight_handle", handle},
                                      {"accumulated_calls", absl::StrCat(g->accumulated_calls)},
                                      {"producer", "logitctl grad fetch"}});
        !s.ok()) {
      return InputError(s);
    }
    PrintRows({{"out", absl::StrCat(out, " (tensor \"dw\")")},
               {"shape", ShapeString(g->dw.shape())},
               {"dtype", std::string(DTypeName(g->dw.dtype()))},
               {"accumulated_calls", absl::StrCat(g->accumulated_calls)},
               {"zeroed", absl::GetFlag(FLAGS_zero) ? "true" : "false"}});
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
