// Where the references' fp64 products are formed. By default OpenBLAS's
// dgemm on the host (numerics.h); a server with a device of its own offers
// another engine for the weight of one call (the cuda backend: cuBLAS DGEMM
// on the GPU). The proofs do not depend on the engine: every one multiplies
// the bf16 values widened to fp64, whose products are exact (8 x 8
// significand bits), and sums them in fp64 in some order, so each sum lies
// within γ_K(fp64)·Σ|x·w| of the exact one whatever the engine, its order,
// blocking or fused multiply-adds (Higham, Lemma 3.1); the bounds already
// carry that term. Elements whose operands include a NaN or an infinity are
// formed again on the host one product at a time either way.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "logitd/reference/candidate_check.h"
#include "logitd/reference/numerics.h"
#include "logitd/reference/token_judgement.h"

namespace logitd {

// The most elements of an operand's block (and of its product's) that an
// engine judging on its device takes at once: JudgeBlockRows(cols)·cols
// stays within it, so a caller that admits work by its memory can count the
// block (2^25 doubles, 256 MiB) whatever the engine.
inline constexpr std::int64_t kJudgeBlockElements = std::int64_t{1} << 25;

// What LpRowSums forms for a block of rows, and where it puts it.
struct LpRowsRequest {
  const std::int64_t* targets = nullptr;  // [m], −1 for a row without one
  double gamma = 0;
  double absolute = 0;  // the logits' bounds are gamma·Σ|x·w| + absolute
  double cap = 0;       // 0: no soft-capping
  double temperature = 1;
  std::int64_t vocab = 0;
  std::int64_t order_cols = 0;
  const std::int64_t* ids = nullptr;  // [m, ids_k], or null
  std::int64_t ids_k = 0;
  // The rows [m] whose precision-class sums to form too, as CeRowSums'
  // class_rows (null: none).
  const std::uint8_t* class_rows = nullptr;
};
struct LpRowsResult {
  judgement::LpRowSums* sums = nullptr;  // [m]
  std::int64_t* order = nullptr;         // [m, order_cols]
  double* order_z = nullptr;             // [m, order_cols]
  double* ids_z = nullptr;               // [m, ids_k] when ids are given
};

// Counts of a weight that every check of it asks for (the distinct classes
// of its rows and of its columns, verify_checks.cc), kept beside the
// weight so that each is formed once: a registered weight never changes.
class WeightMemo {
 public:
  enum Key { kRowClasses, kColumnClasses };
  // The value of `key`, from `count` the first time (two callers at once
  // may both count; they agree).
  std::int64_t Get(Key key, const std::function<std::int64_t()>& count);

 private:
  // The values counted so far; mu_ guards them (not the counting itself).
  absl::Mutex mu_;
  std::map<Key, std::int64_t> values_ ABSL_GUARDED_BY(mu_);
};

class Fp64Products {
 public:
  virtual ~Fp64Products() = default;

  // WeightMemo::Get of the memo the engine's maker gave it (set_weight_memo),
  // else `count` itself.
  std::int64_t WeightCount(WeightMemo::Key key, const std::function<std::int64_t()>& count) {
    return memo_ != nullptr ? memo_->Get(key, count) : count();
  }
  void set_weight_memo(std::shared_ptr<WeightMemo> memo) { memo_ = std::move(memo); }

  // y [m, V] = x·Wᵀ and, when y_abs is not null, y_abs [m, V] = |x|·|W|ᵀ,
  // for x [m, K] as doubles and the weight W [V, K] this engine was made
  // for. False when the engine could not form them (error() says why); the
  // caller then forms them on the host.
  virtual bool XWt(const double* x, std::int64_t m, double* y, double* y_abs) = 0;
  // dx [m, K] = g·W and dx_abs = |g|·|W|, for g [m, V] as doubles.
  virtual bool GW(const double* g, std::int64_t m, double* dx, double* dx_abs) = 0;

  // A block of a check judged where its products are formed, so that only
  // counts cross to the host: the products x·Wᵀ of x [m, K] (JudgeXWt) or
  // g·W of g [m, V] (JudgeGW), given as doubles with every value finite
  // (and W's too), are the sums; each element's reference and bounds follow
  // `rule`, and it is judged as CandidateCheck judges it
  // (element_judgement.h). Row r of the block is row rows[r] of the
  // candidate and of logitd's own output (host memory, cols = V or K
  // elements of the rule's dtype a row), flat index rows[r]·cols + column.
  // *figures gets the block's counts with its first outside elements
  // (CheckFigures). False when the engine judges nowhere but the host (the
  // default) or could not (error() says why): the caller then judges the
  // block on the host, and *figures is not to be used.
  virtual bool JudgeXWt(const double* /*x*/, const std::int64_t* /*rows*/, std::int64_t /*m*/,
                        const void* /*candidate*/, const void* /*own*/,
                        const judgement::ProductRule& /*rule*/, CheckFigures* /*figures*/) {
    return false;
  }
  virtual bool JudgeGW(const double* /*g*/, const std::int64_t* /*rows*/, std::int64_t /*m*/,
                       const void* /*candidate*/, const void* /*own*/,
                       const judgement::ProductRule& /*rule*/, CheckFigures* /*figures*/) {
    return false;
  }

  // JudgeGW of the rows rows[0, m) of G = bf16(dY), rounded to nearest even
  // once where the products are formed, from dY [M, V] as sent (fp32, or
  // bf16 when dy_bf16, whose rounding is itself; host memory): what crosses
  // is dY's bytes rather than G as doubles. False as JudgeGW, and when a
  // value of those rows of G is a NaN or an infinity (the host then forms
  // the block one product at a time where it must).
  virtual bool JudgeGWOfDy(const void* /*dy*/, bool /*dy_bf16*/, const std::int64_t* /*rows*/,
                           std::int64_t /*m*/, const void* /*candidate*/, const void* /*own*/,
                           const judgement::ProductRule& /*rule*/, CheckFigures* /*figures*/) {
    return false;
  }

  // dW [V, K] = Gᵀ·X judged where its products are formed, every row of it:
  // G = bf16(dY) rounded to nearest even once (dy [m, V] fp32, or bf16 when
  // dy_bf16, whose rounding is itself) and x [m, K], host memory; each
  // element's reference and bounds follow `rule` (sums of m products) and it
  // is judged as JudgeGW judges dX's, into *check (empty, of the rule's
  // dtype), flat index row·K + column of the candidate and of logitd's own
  // dW. False when the engine judges nowhere but the host (the default),
  // when a value of G or X is NaN or infinite (which the host forms one
  // product at a time), when `stop` said to stop, or when it could not
  // (error() says why): the caller then judges dW on the host, and *check
  // is not to be used.
  virtual bool JudgeGtX(const void* /*dy*/, bool /*dy_bf16*/, const Bf16Bits* /*x*/,
                        std::int64_t /*m*/, const void* /*candidate*/, const void* /*own*/,
                        const judgement::ProductRule& /*rule*/, CandidateCheck* /*check*/,
                        const std::function<bool()>& /*stop*/) {
    return false;
  }

  // The cross-entropy's softmax sums of each row of x·Wᵀ where the logits
  // are formed, for x [m, K] as doubles (every value finite, and W's too):
  // the logits' bounds are gamma·Σ|x·w| + absolute, `cap` soft-caps them
  // (0: not), and sums[r] (element_judgement.h) takes the z of targets[r]
  // (none outside [0, V)); for the rows r with class_rows[r] non-zero
  // (class_rows null: none), the precision-class sums too, from the models
  // of each logit (accumulation_models.h) and
  // judgement::LogitClassEnvelope. False when the engine forms them nowhere
  // but the host (the default) or could not (error() says why).
  virtual bool CeRowSums(const double* /*x*/, std::int64_t /*m*/, const std::int64_t* /*targets*/,
                         double /*gamma*/, double /*absolute*/, double /*cap*/,
                         const std::uint8_t* /*class_rows*/, judgement::CeRowSums* /*sums*/) {
    return false;
  }

  // LogProbs' rows where the logits are formed, for x [m, K] as doubles
  // (every value finite, and W's too): each row's sums (element_judgement.h:
  // LpRowSums, z from judgement::LpLogit with the logits' bounds
  // request.gamma·Σ|x·w|) over the first request.vocab entries, with
  // request.targets[r]'s z and ranks (−1: no target); its first
  // request.order_cols entries by judgement::LpBefore into result.order and
  // result.order_z [m, order_cols]; and, when request.ids is not null, the z
  // of ids [m, ids_k] into result.ids_z (NaN for an id outside [0, vocab) or
  // repeated in its row). False as CeRowSums.
  virtual bool LpRowSums(const double* /*x*/, std::int64_t /*m*/, const LpRowsRequest& /*request*/,
                         const LpRowsResult& /*result*/) {
    return false;
  }

  // Rows of a block that JudgeXWt, JudgeGW, CeRowSums and LpRowSums take best at once, for
  // blocks of `cols` doubles a row (the larger of the operand's and the
  // product's); 0 when the engine does not judge.
  virtual std::int64_t JudgeBlockRows(std::int64_t /*cols*/) const { return 0; }
  // True when the engine has seen every value of W finite, so that a caller
  // need not look for NaNs and infinities in it.
  virtual bool WeightFinite() const { return false; }

  // Why the last product was not formed here; empty while every one was.
  virtual std::string error() const = 0;
  // "cuBLAS DGEMM on NVIDIA H200", for logs and results.
  virtual std::string name() const = 0;

 private:
  std::shared_ptr<WeightMemo> memo_;
};

// ReferenceXWt and ReferenceGW (numerics.h) through `engine` when it is not
// null and forms them, else on the host.
void FormXWt(Fp64Products* engine, const std::vector<double>& x, std::int64_t m, Bf16Matrix w,
             double* y, double* y_abs);
void FormGW(Fp64Products* engine, const std::vector<double>& g, std::int64_t m, Bf16Matrix w,
            double* dx, double* dx_abs);

}  // namespace logitd
