// logitctl backward: dX and dW of the logits from dY, returned or dW
// accumulated on the server.
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
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {

int CmdBackward(const std::vector<std::string>& words) {
  if (words.size() != 1)
    return UsageError("backward takes flags only (--dy, --x, --weight, --out)");
  client::BackwardOptions options;
  options.want_dx = !absl::GetFlag(FLAGS_no_dx);
  options.want_dw = !absl::GetFlag(FLAGS_no_dw);
  options.accumulate_dw = absl::GetFlag(FLAGS_accumulate);
  absl::StatusOr<DType> dx_dtype =
      ParseDTypeFlag("dx_dtype", absl::GetFlag(FLAGS_dx_dtype), {DType::kBf16, DType::kFp32});
  if (!dx_dtype.ok()) return UsageError(dx_dtype.status().message());
  absl::StatusOr<DType> dw_dtype =
      ParseDTypeFlag("dw_dtype", absl::GetFlag(FLAGS_dw_dtype), {DType::kFp32, DType::kBf16});
  if (!dw_dtype.ok()) return UsageError(dw_dtype.status().message());
  options.dx_dtype = *dx_dtype;
  options.dw_dtype = *dw_dtype;
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("backward: --weight=HANDLE is required");
  // With --accumulate and --no_dx nothing comes back, so no file is needed.
  const bool returns_tensors = options.want_dx || (options.want_dw && !options.accumulate_dw);
  if (out.empty() && returns_tensors) return UsageError("backward: --out=FILE is required");

  absl::StatusOr<NamedTensor> dy = LoadTensorRef(absl::GetFlag(FLAGS_dy), "--dy");
  if (!dy.ok()) return InputError(dy.status());
  absl::StatusOr<NamedTensor> loaded_x = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded_x.ok()) return InputError(loaded_x.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded_x), "X");
  if (!x.ok()) return InputError(x.status());

  return WithClient([&](client::Client& c) {
    // dY travels as it is: rounding it to bf16 is the server's documented step.
    absl::StatusOr<client::BackwardResult> r = c.Backward(dy->tensor, *x, handle, options);
    if (!r.ok()) return ServerError(r.status());
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    std::vector<std::pair<std::string, std::string>> rows;
    if (r->dx) {
      tensors.emplace_back("dx", &*r->dx);
      rows.emplace_back("dx",
                        absl::StrCat(DTypeName(r->dx->dtype()), " ", ShapeString(r->dx->shape())));
    }
    if (r->dw) {
      tensors.emplace_back("dw", &*r->dw);
      rows.emplace_back("dw",
                        absl::StrCat(DTypeName(r->dw->dtype()), " ", ShapeString(r->dw->shape())));
    } else if (options.accumulate_dw && options.want_dw) {
      rows.emplace_back("dw", "accumulated on the server (grad fetch to read it)");
    }
    if (!tensors.empty()) {
      if (out.empty()) return UsageError("backward: --out=FILE is required");
      if (absl::Status s = WriteOutput(
              out, tensors, {{"weight_handle", handle}, {"producer", "logitctl backward"}});
          !s.ok()) {
        return InputError(s);
      }
      rows.insert(rows.begin(), {"out", out});
    }
    AppendTiming(r->timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
