// The logprobs suite's reference and checks, exposed so that unit tests can
// feed them doctored results and see them fail.
//
// The reference is fp64: logits from a dgemm of the widened bf16 operands
// (ReferenceLogits of cross_entropy.h), then z = softcap(y) / temperature
// over the first vocab_size rows, lse, log-probs, entropy, the top-k order
// (z descending, ties to the lower id) and the targets' ranks. Next to each
// value it carries a bound on how far a correct fp32 server may be from it;
// the derivation is at the top of logprobs_reference.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/validate/harness.h"
#include "logitd/client.h"
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
  // The targets as an int64 [M] tensor.
  Tensor TargetsTensor() const;
  bool Ignored(std::int64_t i) const {
    return targets[static_cast<std::size_t>(i)] == ignore_index;
  }
};

struct LpReference {
  std::int64_t m = 0;
  std::int64_t v = 0;  // the vocabulary that counts (vocab_size, or V)
  // True when the server's z are exactly the reference's (exact logits, no
  // soft-capping, a power-of-two temperature): the top-k ids and ranks must
  // then equal the reference's, ties going to the lower id.
  bool exact = false;
  // Per token: values and bounds on |server − value|. logprob is 0 with
  // bound 0 for an ignored token.
  std::vector<double> lse, lse_bound, logprob, logprob_bound, entropy, entropy_bound;
  // Per token: B, the largest bound on a server z of the row.
  std::vector<double> z_bound;
  // [M, v]: the fp64 z.
  std::vector<double> z;
  // [M, top_k + 1]: the ids of the best entries, by z descending, ties to
  // the lower id (one past top_k, for the separation rule; fewer when v is).
  std::vector<std::int64_t> order;
  std::int64_t order_cols = 0;
  // Per token: the target's rank by that order (−1 for an ignored token),
  // and, when not exact, how many entries are surely above the target
  // (z_j > z_t + 2B) and possibly above it (z_j >= z_t − 2B, j != t).
  std::vector<std::int64_t> rank, rank_low, rank_high;
};

// The reference from logits y [M, V] and per-logit bounds y_err [M, V] on
// the server's fp32 logits (null: the logits are exact, e.g. small integers).
LpReference LogProbsReference(const std::vector<double>& y, const std::vector<double>* y_err,
                              std::int64_t m, std::int64_t v, const LpRequest& request);
// ReferenceLogits (cross_entropy.h), then LogProbsReference.
LpReference ComputeLogProbsReference(const Tensor& x, const Tensor& w, const LpRequest& request,
                                     bool exact_logits = false);

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
