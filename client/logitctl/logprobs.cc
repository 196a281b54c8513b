// logitctl logprobs: per-token log-probabilities of the fp32 logits X.W^T,
// with the entropy, lse, top-k and rank, without the [M, V] logits.
#include <cmath>
#include <cstdint>
#include <optional>
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

int CmdLogProbs(const std::vector<std::string>& words) {
  if (words.size() != 1) return UsageError("logprobs takes flags only (--x, --weight, --out)");
  const std::string handle = absl::GetFlag(FLAGS_weight);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (handle.empty()) return UsageError("logprobs: --weight=HANDLE is required");
  if (out.empty()) return UsageError("logprobs: --out=FILE is required");
  client::LogProbsOptions options;
  const double temperature = absl::GetFlag(FLAGS_temperature);
  if (!std::isfinite(temperature) || temperature <= 0) {
    return UsageError(
        absl::StrCat("--temperature: expected a finite value > 0, got ", temperature));
  }
  options.temperature = static_cast<float>(temperature);
  const double cap = absl::GetFlag(FLAGS_logit_softcap);
  if (!std::isfinite(cap) || cap < 0) {
    return UsageError(absl::StrCat("--logit_softcap: expected 0 (off) or a cap > 0, got ", cap));
  }
  options.logit_softcap = static_cast<float>(cap);
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.want_entropy = absl::GetFlag(FLAGS_entropy);
  options.want_lse = absl::GetFlag(FLAGS_lse);
  options.want_rank = absl::GetFlag(FLAGS_rank);
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.ignore_index = absl::GetFlag(FLAGS_ignore_index);
  options.pipeline = absl::GetFlag(FLAGS_pipeline);
  options.connections = absl::GetFlag(FLAGS_connections);

  absl::StatusOr<NamedTensor> loaded_x = LoadTensorRef(absl::GetFlag(FLAGS_x), "--x");
  if (!loaded_x.ok()) return InputError(loaded_x.status());
  absl::StatusOr<Tensor> x = ToBf16(*std::move(loaded_x), "X");
  if (!x.ok()) return InputError(x.status());
  std::optional<NamedTensor> targets;
  if (!absl::GetFlag(FLAGS_targets).empty()) {
    absl::StatusOr<NamedTensor> t = LoadTensorRef(absl::GetFlag(FLAGS_targets), "--targets");
    if (!t.ok()) return InputError(t.status());
    targets = *std::move(t);
  }

  return WithClient([&](client::Client& c) {
    absl::StatusOr<client::LogProbsResult> r =
        c.LogProbs(*x, targets ? &targets->tensor : nullptr, handle, options);
    if (!r.ok()) return ServerError(r.status());
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (const auto& [name, t] :
         {std::make_pair("logprob", &r->logprob), std::make_pair("lse", &r->lse),
          std::make_pair("entropy", &r->entropy), std::make_pair("topk_ids", &r->topk_ids),
          std::make_pair("topk_logprobs", &r->topk_logprobs), std::make_pair("rank", &r->rank)}) {
      if (t->has_value()) tensors.emplace_back(name, &**t);
    }
    if (absl::Status s = WriteOutput(out, tensors,
                                     {{"weight_handle", handle},
                                      {"temperature", absl::StrCat(options.temperature)},
                                      {"logit_softcap", absl::StrCat(options.logit_softcap)},
                                      {"top_k", absl::StrCat(options.top_k)},
                                      {"producer", "logitctl logprobs"}});
        !s.ok()) {
      return InputError(s);
    }
    std::vector<std::pair<std::string, std::string>> rows = {{"out", out}};
    for (const auto& [name, t] : tensors) {
      rows.emplace_back(name, absl::StrCat(DTypeName(t->dtype()), " ", ShapeString(t->shape())));
    }
    AppendTiming(r->timing, &rows);
    PrintRows(rows);
    return kExitOk;
  });
}

}  // namespace logitd::logitctl
