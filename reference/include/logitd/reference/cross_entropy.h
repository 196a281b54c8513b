// The fused LM-head cross-entropy's fp64 reference and proven error bounds,
// shared by the validation harness and the server's Verify: logits from a
// dgemm of the widened bf16 operands, then z, lse, loss and the exact
// pre-cast gradient g = dL/dy · scale in fp64 with the formulas of
// logitd.v1.CrossEntropyHeader. Next to every value it carries a bound on
// how far a correct fp32 implementation may be from it; the derivation is
// at the top of cross_entropy.cc.
//
// The reference is formed a block of rows of M at a time, so no [M, V] of
// doubles is ever held whole: the per-token values are returned, g and its
// bound are handed to the caller one block of rows at a time, from which it
// forms dX = G·W and dW = Gᵀ·X and their bounds (CastGradientError,
// CastGradientMagnitude, GradientProductCoefficient). A block's results do
// not depend on the block size wherever the dgemm's do not.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "logitd/reference/numerics.h"
#include "logitd/reference/token_judgement.h"
#include "logitd/reference/verify_checks.h"

namespace logitd {

// How an implementation's fp32 logits stand to the reference's fp64 ones.
enum class LogitModel {
  // fp32 sums of K products in any order: each within
  // (γ_K(fp32) + γ_K(fp64))·Σ_k|x_k·w_vk| of the fp64 logit.
  kFp32Sum,
  // Exact (small integers, whose fp32 sums are exact): no logit error.
  kExact,
  // The fp64 logits rounded once to bf16 (to nearest even) and then taken
  // as exact: what a path through bf16 logits gives at best.
  kBf16Rounded,
};

enum class CeReduction { kNone, kSum, kMean };

// The options of one cross-entropy request.
struct CeReferenceOptions {
  std::int64_t ignore_index = -100;
  CeReduction reduction = CeReduction::kMean;
  float z_loss = 0.0f;
  float logit_softcap = 0.0f;  // 0: no soft-capping
  float grad_scale = 1.0f;
  // The tokens a mean divides by; 0 counts them from the targets given. A
  // reference of some of a call's rows (Verify's sample_rows) gives the
  // whole call's count, so that its g are the call's.
  std::int64_t counted_tokens = 0;
  // Form the per-token outputs' precision-class envelopes (fp32-sum
  // logits only; Verify's): CrossEntropyReference::lse_class, loss_class.
  bool class_envelope = false;
  // With class_envelope, the rows [M] to form them for (non-zero), the
  // others' left 0 (ClassTokenRows); empty: every row.
  std::vector<std::uint8_t> class_rows;
};

// One token's values and the bounds on |implementation − value|.
struct CeTokenReference {
  double lse = 0, lse_bound = 0, loss = 0, loss_bound = 0;
  // The precision-class test's envelopes (docs/PROTOCOL.md, "The
  // precision-class test of the per-token outputs"): the scale of a
  // conforming implementation's error; 0 where not formed.
  double lse_class = 0, loss_class = 0;
};

struct CrossEntropyReference {
  std::int64_t m = 0;
  std::int64_t v = 0;
  std::int64_t counted = 0;
  // What dL/dz is multiplied by: grad_scale, divided by `counted` for a mean.
  double scale = 0;
  // Per token [M]: values and bounds. Ignored tokens have loss 0 with bound
  // 0; their lse is that of the row like any other.
  std::vector<double> lse, lse_bound, loss, loss_bound;
  // With options.class_envelope, per token [M]: the precision-class
  // test's envelopes of lse and loss (0 where not formed: a non-finite
  // logit, an ignored token's loss). Empty otherwise.
  std::vector<double> lse_class, loss_class;
  // The reduced loss (sum or mean over counted tokens; NaN mean when none
  // counts) and its bound. Both are filled whatever the reduction.
  double sum = 0, sum_bound = 0, mean = 0, mean_bound = 0;
};

// Rows [row0, row0 + rows) of M: the exact pre-cast gradient g = dL/dy ·
// scale (0 on ignored rows) and a bound on |g_fp32 − g| for an
// implementation's fp32 value of it before the bf16 cast, each [rows, V]
// row-major, valid during the call only; with options.class_envelope, the
// flips' weights too (CastFlip's mean and var, [rows, V] each), else null.
// Blocks come in order of rows.
using CeGradientSink =
    std::function<void(std::int64_t row0, std::int64_t rows, const double* g,
                       const double* g_pre_err, const double* flip_mean, const double* flip_var)>;

// The reference of `in` (x [m, k] and w [v, k]; dy unused) with targets
// [m], a block of `block_rows` rows of M at a time (0: as many as
// kReferenceBlockElements logits hold). Targets other than ignore_index
// must lie in [0, v). g is formed only when `gradients` is given. `stop` is
// asked between blocks: true returns false, *out then incomplete.
bool ReferenceCrossEntropy(const LmHeadInputs& in, const std::int64_t* targets,
                           const CeReferenceOptions& options, LogitModel logits,
                           CrossEntropyReference* out, const CeGradientSink& gradients = {},
                           const StopCheck& stop = {}, std::int64_t block_rows = 0);

// The pieces, for callers with logits of their own.

// Tokens whose target is not ignore_index.
std::int64_t CountedTokens(const std::int64_t* targets, std::int64_t m, std::int64_t ignore_index);
// The scale of dL/dz for a request whose mean counts `counted` tokens
// (at least 1).
double CrossEntropyGradScale(const CeReferenceOptions& options, std::int64_t counted);
// One token's values and bounds from its row's softmax sums (a device's,
// or the host's: CrossEntropyReferenceRow forms them and calls this).
CeTokenReference CrossEntropyTokenFromSums(const judgement::CeRowSums& sums, std::int64_t v,
                                           bool counted, const CeReferenceOptions& options);
// A row's softmax sums (judgement::CeRowSums, without the target's) from its
// z [v] and their bounds ez [v], with the class sums when cz [v] (the
// class envelopes of z) is given.
judgement::CeRowSums CrossEntropyRowSums(const double* z, const double* ez, std::int64_t v,
                                         const double* cz = nullptr);
// One token from its logits y [v] and their bounds y_err [v] (null: exact
// logits): lse, loss and their bounds (and class envelopes, from the
// logits' y_class [v] when given: LogitClassEnvelope); g [v] and its pre-cast bound
// g_pre_err [v] for the row too unless g is null (zeros when not counted).
// With y_class, flip_mean and flip_var [v] get each element's CastFlip
// (when not null).
CeTokenReference CrossEntropyReferenceRow(const double* y, const double* y_err, std::int64_t v,
                                          std::int64_t target, bool counted, double scale,
                                          const CeReferenceOptions& options, double* g,
                                          double* g_pre_err, const double* y_class = nullptr,
                                          double* flip_mean = nullptr, double* flip_var = nullptr);

// The precision-class test of the gradients (docs/PROTOCOL.md, "The
// precision-class test of the gradients"). ModelCast(g) = bf16(fp32(g)),
// each rounded to nearest even: the G of an implementation whose fp32 g is
// g's nearest. A conforming implementation's fp32 g stands off the exact
// one by an error of scale sigma (the class envelopes of its logits and of
// its softmax, times kClassSpread); where that may carry it across the
// midpoint between g's two bf16 neighbours its G is the other neighbour
// (or, past the far midpoint, the one beyond ModelCast(g)). With the error
// N(0, sigma), CastFlip(g, sigma) gives that G's change from ModelCast(g):
// its mean, π_near·(other − ModelCast(g)), and a bound on its variance,
// (π_near + π_far)·s², with π the probabilities of crossing each midpoint
// and s the spacing.
struct CastFlipWeights {
  double mean = 0;
  double var = 0;
};
double ModelCast(double g);
CastFlipWeights CastFlip(double g, double sigma);

// The bf16 cast of g: bounds on |G − g| and on |G| for an implementation's
// bf16 G, from g and its pre-cast bound.
double CastGradientError(double g, double g_pre_err);
double CastGradientMagnitude(double g, double g_pre_err);
// The bound of a product of G with n terms per sum (n = V for dX = G·W,
// n = M for dW = Gᵀ·X) is C·|W| (or Cᵀ·|X|) with, per element of G,
// C = CastGradientError + gamma·CastGradientMagnitude and
// gamma = GradientProductGamma(n) = γ_n(fp32)·(1 + 2^-8) + γ_n(fp64).
double GradientProductGamma(std::int64_t n);
double GradientProductCoefficient(double g, double g_pre_err, double gamma);

// The cross-entropy's gradients from g [m, v] and its pre-cast bound
// g_pre_err [m, v] (gathered from ReferenceCrossEntropy's blocks): dX = G·W
// [m, k] with bounds C·|W| (n = V), and dW = Gᵀ·X [v, k] with bounds Cᵀ·|X|
// (n = M), handed to `sink` a block of rows at a time, in order. A bf16 dX
// adds its own rounding to the bound when `dx_bf16`. `stop` is asked
// between blocks: true returns false. dX's two products go through
// `products` (fp64_products.h: the engine of the weight w) when it is not
// null, else OpenBLAS on the host.
bool CrossEntropyGradInputReference(const double* g, const double* g_pre_err, std::int64_t m,
                                    Bf16Matrix w, bool dx_bf16, const RowBlockSink& sink,
                                    const StopCheck& stop = {}, Fp64Products* products = nullptr);
bool CrossEntropyGradWeightReference(const double* g, const double* g_pre_err, const Bf16Bits* x,
                                     std::int64_t m, std::int64_t v, std::int64_t k,
                                     const RowBlockSink& sink, const StopCheck& stop = {});
// The most memory the two take besides g and g_pre_err.
std::uint64_t CrossEntropyGradientReferenceBytes(std::int64_t m, std::int64_t v, std::int64_t k,
                                                 bool dx, bool dw);

// The most memory ReferenceCrossEntropy takes besides its arguments and
// *out's per-token vectors (4·M doubles): a block's widened rows, logits and
// their bounds, g and its bound when `with_gradients`, a row's scratch and
// a block of the weight widened.
std::uint64_t CrossEntropyReferenceBytes(std::int64_t m, std::int64_t v, std::int64_t k,
                                         bool with_gradients, std::int64_t block_rows = 0);

}  // namespace logitd
