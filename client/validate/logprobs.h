// The logprobs suite's reference and checks, exposed so that unit tests can
// feed them doctored results and see them fail.
//
// The reference is fp64: logits from a dgemm of the widened bf16 operands,
// then z = softcap(y) / temperature over the first vocab_size rows, lse,
// log-probs, entropy, the top-k order (z descending, ties to the lower id)
// and the targets' ranks. Next to each value it carries a bound on how far a
// correct fp32 server may be from it. Both come from logitd_reference
// (logitd/reference/logprobs.h, whose logprobs.cc derives the bounds); this
// harness holds z whole and checks a server's results against them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/validate/harness.h"
#include "logitd/client.h"
#include "logitd/reference/logprobs.h"
#include "logitd/tensor.h"

namespace logitd::validate {

// One LogProbs request as the reference sees it.
struct LpRequest {
  std::vector<std::int64_t> targets;  // [M]; empty for none
  std::int64_t ignore_index = -100;
  float temperature = 1.0f;
  float logit_softcap = 0.0f;
  std::int64_t top_k = 0;
  std::int64_t vocab_size = 0;  // 0: all of V

  // Every output the request can ask for.
  client::LogProbsOptions Options() const;
  // The options as the reference library takes them.
  LpReferenceOptions ReferenceOptions() const;
  // The targets as an int64 [M] tensor.
  Tensor TargetsTensor() const;
  bool Ignored(std::int64_t i) const {
    return targets[static_cast<std::size_t>(i)] == ignore_index;
  }
};

// The library's reference (per token: lse, logprob, entropy and their
// bounds, B, the top-k order and the ranks; see LogProbsReference) and z
// whole, which the top-k check reads at the ids the server returned.
struct LpReference : LogProbsReference {
  // [M, v]: the fp64 z.
  std::vector<double> z;
};

// The reference of bf16 x [M, K] and w [V, K] for `request`, from
// ReferenceLogProbs (logitd/reference/logprobs.h) with z gathered whole.
// `logits`: kExact for small integers, whose fp32 sums are exact.
LpReference ComputeLogProbsReference(const Tensor& x, const Tensor& w, const LpRequest& request,
                                     LogitModel logits = LogitModel::kFp32Sum);

// Figures of one checked response (also written to r.figures[label]).
struct LpErrors {
  double lse_worst_fraction = 0;
  double logprob_worst_fraction = 0;
  double entropy_worst_fraction = 0;
  double topk_logprob_worst_fraction = 0;
  double logprob_max_abs = 0;
  std::int64_t topk_places = 0;
  // Places whose id the reference decides (all of them when exact).
  std::int64_t topk_decided = 0;
  std::int64_t violations = 0;
};

// Checks every output of `got` (as asked for by request.Options()) against
// the reference: dtypes and shapes; lse, logprob, entropy and top-k
// log-probs inside their bounds; ignored tokens with logprob +0 and rank −1;
// top-k ids in range, distinct, equal to the reference's at every decided
// place; ranks between the surely-above and possibly-above counts (equal
// when exact). Failures go to r.
LpErrors CheckLogProbs(const LpReference& ref, const LpRequest& request,
                       const client::LogProbsResult& got, CaseResult& r, const std::string& label);

}  // namespace logitd::validate
