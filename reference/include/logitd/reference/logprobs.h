// LogProbs' fp64 reference and proven error bounds, shared by the
// validation harness and the server's Verify: logits from a dgemm of the
// widened bf16 operands, then z = softcap(y) / temperature over the first
// vocab_size entries, lse, log-probs, entropy, the top-k order (z
// descending, ties to the lower id) and the targets' ranks. Next to each
// value it carries a bound on how far a correct fp32 implementation may be
// from it; the derivation is at the top of logprobs.cc.
//
// The reference is formed a block of rows of M at a time, so no [M, V] of
// doubles is ever held whole: the per-token values and the order are
// returned; z is handed to the caller one block of rows at a time, for the
// checks that need it at ids of the implementation's choosing.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "logitd/reference/candidate_check.h"
#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/verify_checks.h"

namespace logitd {

// The options of one LogProbs request.
struct LpReferenceOptions {
  std::int64_t ignore_index = -100;
  float temperature = 1.0f;
  float logit_softcap = 0.0f;   // 0: no soft-capping
  std::int64_t top_k = 0;       // 0: no top-k
  std::int64_t vocab_size = 0;  // 0: all of V
  // Form the per-token outputs' precision-class envelopes (fp32-sum
  // logits only; Verify's): LogProbsReference::lse_class and the others.
  bool class_envelope = false;
  // With class_envelope, the rows [M] to form them for (non-zero), the
  // others' left 0 (ClassTokenRows); empty: every row.
  std::vector<std::uint8_t> class_rows;
};

struct LogProbsReference {
  std::int64_t m = 0;
  std::int64_t v = 0;  // the vocabulary that counts (vocab_size, or V)
  // True when an implementation's z are exactly the reference's (exact
  // logits, no soft-capping, a power-of-two temperature): the top-k ids and
  // ranks must then equal the reference's, ties going to the lower id.
  bool exact = false;
  // Per token [M]: values and bounds on |implementation − value|. logprob is
  // 0 with bound 0 for an ignored token (and for every token without
  // targets).
  std::vector<double> lse, lse_bound, logprob, logprob_bound, entropy, entropy_bound;
  // With options.class_envelope, per token [M]: the precision-class test's
  // envelopes (docs/PROTOCOL.md, "The precision-class test of the per-token
  // outputs"); 0 where not formed. Empty otherwise.
  std::vector<double> lse_class, logprob_class, entropy_class;
  // Per token: B, the largest bound on an implementation's z of the row.
  std::vector<double> z_bound;
  // [M, order_cols], order_cols = min(top_k + 1, v): the ids of the best
  // entries, by z descending, ties to the lower id (one past top_k, for the
  // separation rule), and their z.
  std::vector<std::int64_t> order;
  std::vector<double> order_z;
  std::int64_t order_cols = 0;
  // Per token: the target's rank by that order (−1 for an ignored token or
  // without targets), and, when not exact, how many entries are surely
  // above the target (z_j > z_t + 2B) and possibly above it
  // (z_j >= z_t − 2B, j != t); both equal the rank when exact.
  std::vector<std::int64_t> rank, rank_low, rank_high;
};

// Rows [row0, row0 + rows) of M: the fp64 z, [rows, v] row-major with v the
// vocabulary that counts, valid during the call only. Blocks come in order
// of rows.
using LpZSink = std::function<void(std::int64_t row0, std::int64_t rows, const double* z)>;

// Another implementation's ids [m, k] (its top-k) whose fp64 z the
// reference gathers into z [m, k]: NaN for an id outside [0, vocab) or
// repeated in its row (as TopKIdsZ).
struct LpIdsZ {
  const std::int64_t* ids = nullptr;  // null: none wanted
  std::int64_t k = 0;
  double* z = nullptr;
};

// The reference of `in` (x [m, k] and w [v, k]; dy unused) with targets [m]
// (null: none; otherwise those other than ignore_index must lie in
// [0, vocab)), a block of `block_rows` rows of M at a time (0: as many as
// kReferenceBlockElements logits hold). `stop` is asked between blocks:
// true returns false, *out then incomplete. With fp32-sum logits, an
// engine (in.products) that judges on its device and a finite weight, and
// no `z` sink, rows whose X is finite are formed there and only their sums,
// order and the ids' z come back (Fp64Products::LpRowSums); the host forms
// the rest as before.
bool ReferenceLogProbs(const LmHeadInputs& in, const std::int64_t* targets,
                       const LpReferenceOptions& options, LogitModel logits, LogProbsReference* out,
                       const LpZSink& z = {}, const StopCheck& stop = {},
                       std::int64_t block_rows = 0, const LpIdsZ& ids_z = {});

// The top-k separation rule: whether the id at place p of row i is decided,
// i.e. the same for every implementation within the bounds (always when
// exact). p < min(top_k, v).
bool TopKPlaceDecided(const LogProbsReference& ref, std::int64_t i, std::int64_t p);
// The bound on an implementation's top-k log-prob of row i at id `id`,
// whose fp64 z is z_id: B + Δlse + 4u·(|lse| + |z_id| + |z_id − lse|).
double TopKLogProbBound(const LogProbsReference& ref, std::int64_t i, double z_id);

// Another implementation's top-k and ranks held against `ref` (formed with
// top_k = k), element by element, as Verify judges them (proofs in
// docs/PROTOCOL.md):
// - topk_ids [M, k]: the id at place p of row i must be one an
//   implementation within the bounds may put there: in [0, vocab), not
//   repeated in its row, and with z within 2·B of the reference's p-th
//   largest z (B = ref.z_bound[i]; 0 when exact, ties then being the only
//   freedom). ids_z [M, k] holds each candidate id's fp64 z (NaN for one out
//   of range or repeated), gathered by TopKIdsZ.
// - topk_logprobs [M, k]: by place, against the reference's p-th largest z
//   minus lse with TopKLogProbBound: the p-th largest of values each within
//   B of its exact one is within B of the exact p-th largest, whichever ids
//   they belong to.
// - rank [M]: within [rank_low, rank_high] (−1 for an ignored token).
void CheckTopKIds(const LogProbsReference& ref, std::int64_t k, const std::int64_t* ids,
                  const std::int64_t* own_ids, const double* ids_z, CandidateCheck* check);
void CheckTopKLogProbs(const LogProbsReference& ref, std::int64_t k, const float* logprobs,
                       const float* own, CandidateCheck* check);
void CheckRanks(const LogProbsReference& ref, const std::int64_t* rank, const std::int64_t* own,
                CandidateCheck* check);
// A sink for ReferenceLogProbs that gathers the z of each id of ids [m, k]
// into ids_z [m, k] (NaN for an id outside [0, vocab) or repeated in its
// row).
LpZSink TopKIdsZ(const std::int64_t* ids, std::int64_t k, std::int64_t vocab, double* ids_z);

// The most memory ReferenceLogProbs takes besides its arguments and *out
// (7·M doubles, 3·M ids and (top_k + 1)·M ids and z): a block's widened
// rows, logits, their bounds and z, a row's scratch and a block of the
// weight widened.
std::uint64_t LogProbsReferenceBytes(std::int64_t m, std::int64_t v, std::int64_t k,
                                     std::int64_t block_rows = 0);

}  // namespace logitd
