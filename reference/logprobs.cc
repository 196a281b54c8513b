// logprobs: LogProbs' fp64 reference and its proven bounds (logprobs.h).
//
// The reference. Logits y = x·wᵀ come from a dgemm of the widened bf16
// operands; z_j = softcap(y_j) / T over the first V' = vocab_size rows, lse,
// logprob = z_t − lse, the entropy H = −Σ p log p = Σ_j p_j·(lse − z_j), the
// order of the entries (z descending, ties to the lower id) and each
// target's rank in it are then evaluated in fp64.
//
// The bounds hold for any candidate whose fp32 logits obey the proven bound
// of a sum of products (bounds.h) and whose exp, log and tanh obey the
// kFnError model (element_judgement.h); each is an inequality, not a
// first-order estimate. u = 2^-24, γ_n = n·2^-23/(1 − n·2^-23).
//   logit      |Δy_j| ≤ e_y,j = (γ_K + γ_{K+1}(fp64))·Σ_l|x_l·w_jl| + 2K·2^-149;
//              0 for exact logits.
//   z          capped as cross_entropy.cc caps it (judgement::CappedLogit),
//              over T: e_z,j = e_c,j / T, plus u·(|z_j| + e_c,j/T) for the
//              division when T != 1. E = max_j e_z,j over the row.
//   lse        as cross_entropy.cc proves it: log(1 + W) with
//              W = Σ_j p_j·(e^{e_z,j + r_j} − 1), plus its log and its final
//              addition and the reference's own evaluation.
//   logprob    B_lse + e_z,t + 4u·(|lse| + |z_t| + |logprob|).
//   entropy    Along the path ξ(s) = z + s·δ (|δ_j| ≤ e_z,j), dH/ds =
//              −Σ_j p_j(ξ)·(log p_j(ξ) + H(ξ))·δ_j, with p_j(ξ) ≤ p_j·e^{2E},
//              |log p_j(ξ)| ≤ lse − z_j + 2E and H(ξ) ≤ log V', so
//              |ΔH| ≤ e^{2E}·(Σ_j p_j·(lse − z_j)·e_z,j + (2E + log V')·
//              Σ_j p_j·e_z,j). Its evaluation Σ_j p̂_j·(L̂ − ẑ_j): with L̂ off
//              by δ the terms sum to e^{−δ}·(H + δ), within (H + B_lse)·
//              (e^{B_lse} − 1) + B_lse; each term's exp, subtraction,
//              product and share of the fp32 sum within the factor e^{ρ_j}
//              (judgement::EntropyTermError): Σ_j p_j·(lse − z_j)·(e^{ρ_j} − 1).
//   top-k      a candidate's z is within B of the reference's, so two entries
//              whose reference z differ by more than 2B are in the same
//              order for it. The id at place r is therefore decided when the
//              reference's z at place r is more than 2B from those at places
//              r − 1 and r + 1 (the entries before it are then exactly the
//              ones more than 2B above it); the candidate's id must equal the
//              reference's at every decided place. Its log-prob z_id − lse
//              is within B + B_lse + 4u·(|lse| + |z_id| + |logprob|), taken
//              at the id the candidate returned.
//   rank       at least the number of entries surely above the target
//              (z_j > z_t + 2B), at most the number possibly above it
//              (z_j ≥ z_t − 2B, j != t).
// With exact z (integer logits, no cap, a power-of-two temperature) B is 0
// and the top-k ids and ranks must equal the reference's, ties to the lower
// id; lse, logprob and entropy keep their evaluation bounds.

#include "logitd/reference/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "logit_rows.h"
#include "logitd/bf16.h"
#include "logitd/reference/accumulation_models.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/numerics.h"

namespace logitd {
namespace {

constexpr double kFp32U = kFp32UnitRoundoff;

bool IsPowerOfTwo(float t) {
  int e = 0;
  return t > 0 && std::frexp(static_cast<double>(t), &e) == 0.5;
}

// z and e_z of one row over the first v entries of y (y_err null: exact
// logits); returns B.
double RowZ(const double* y, const double* y_err, std::int64_t v, const LpReferenceOptions& o,
            double* z, double* ez) {
  double b = 0;
  for (std::int64_t j = 0; j < v; ++j) {
    judgement::LpLogit(y[j], y_err != nullptr ? y_err[j] : 0.0, o.logit_softcap, o.temperature,
                       y_err != nullptr, &z[j], &ez[j]);
    b = std::max(b, ez[j]);
  }
  return b;
}

// The class envelopes of a row's z [v] from its logits' (y_class [v]),
// carried as the bounds are.
void RowClassZ(const double* y, const double* y_class, std::int64_t v, const LpReferenceOptions& o,
               double* cz) {
  for (std::int64_t j = 0; j < v; ++j) {
    double zj;
    judgement::LpLogit(y[j], y_class[j], o.logit_softcap, o.temperature, true, &zj, &cz[j]);
  }
}

// The sums of a row of z (judgement::LpRowSums), without the target's;
// with the class sums when cz is given.
judgement::LpRowSums RowSums(const double* z, const double* ez, std::int64_t v, double b,
                             const double* cz = nullptr) {
  judgement::LpRowSums s;
  s.b = b;
  s.mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < v; ++j) s.mx = std::max(s.mx, z[j]);
  double sum_exp = 0;
  for (std::int64_t j = 0; j < v; ++j) sum_exp += std::exp(z[j] - s.mx);
  s.log_s = std::log(sum_exp);
  s.lse = s.mx + s.log_s;
  const double gamma_sum = Gamma(v, kFp32StepError);
  for (std::int64_t j = 0; j < v; ++j) {
    const double p = std::exp(z[j] - s.lse);
    const double d = s.mx - z[j];
    const double a = s.lse - z[j];
    s.weighted +=
        judgement::WeightedExpm1(z[j] - s.lse, ez[j] + judgement::ExpTermError(d, b, gamma_sum));
    s.weighted_ez += p * ez[j];
    s.weighted_lez += p * a * ez[j];
    if (a > 0) {
      s.eval_h +=
          a * judgement::WeightedExpm1(z[j] - s.lse, judgement::EntropyTermError(a, b, gamma_sum));
    }
    s.mean_d += p * d;
    s.entropy += p * a;
    if (cz != nullptr) {
      s.class_lin += p * cz[j];
      s.class_lin_d += p * a * cz[j];
    }
  }
  s.class_formed = cz != nullptr;
  return s;
}

// Row i of the reference from its sums, wherever they were formed: lse,
// entropy, B, and with a target its log-prob and rank.
void StoreRow(const judgement::LpRowSums& s, std::int64_t i, bool has_target,
              LogProbsReference* ref) {
  const std::int64_t v = ref->v;
  const std::size_t at = static_cast<std::size_t>(i);
  const double fp64 = Gamma(v, kFp64UnitRoundoff);
  const double spread = std::log1p(s.weighted);
  const double lse_bound = spread + judgement::kFnError * (1 + std::fabs(s.log_s) + spread) +
                           2 * kFp32U * (std::fabs(s.lse) + spread) + fp64 * (std::fabs(s.lse) + 1);
  ref->lse[at] = s.lse;
  ref->lse_bound[at] = lse_bound;
  ref->entropy[at] = s.entropy;
  const double logits =
      std::exp(2 * s.b) *
      (s.weighted_lez + (2 * s.b + std::log(static_cast<double>(v))) * s.weighted_ez);
  const double evaluation = (s.entropy + lse_bound) * std::expm1(lse_bound) + lse_bound + s.eval_h;
  ref->entropy_bound[at] = logits + evaluation + fp64 * (s.entropy + s.mean_d + 1);
  ref->z_bound[at] = s.b;
  // The precision-class envelopes (docs/PROTOCOL.md, "The precision-class
  // test of the per-token outputs"): each output's sensitivity to z_v,
  // |∂/∂z_v|, times c_z,v summed (sound whatever the logits' errors'
  // correlation), and its evaluation. The entropy's ∂H/∂z_v =
  // −p_v·(log p_v + H), at most p_v·((lse − z_v) + H); its evaluation
  // Σ p̂·(L̂ − ẑ) moves by |1 − H| per unit of L̂'s error, each term
  // within kFnError, the fp32 sum as the lse's.
  const bool classed = !ref->lse_class.empty() && s.class_formed && std::isfinite(s.class_lin) &&
                       std::isfinite(s.class_lin_d) && std::isfinite(s.lse);
  double lse_eval = 0;
  if (classed) {
    lse_eval = judgement::LseEvalEnvelope(s.log_s, s.lse, s.mean_d, v);
    ref->lse_class[at] = s.class_lin + lse_eval;
    ref->entropy_class[at] =
        s.class_lin_d + s.entropy * s.class_lin + std::fabs(1 - s.entropy) * lse_eval +
        judgement::kFnError * (s.entropy + 1) +
        kFp32U * (4 * s.mean_d + std::sqrt(static_cast<double>(v)) * s.entropy);
  }
  if (!has_target) return;
  ref->logprob[at] = s.zt - s.lse;
  ref->logprob_bound[at] =
      lse_bound + s.ezt +
      4 * kFp32U * (std::fabs(s.lse) + std::fabs(s.zt) + std::fabs(s.zt - s.lse));
  if (classed && std::isfinite(s.class_zt)) {
    ref->logprob_class[at] =
        ref->lse_class[at] + s.class_zt +
        2 * kFp32U * (std::fabs(s.lse) + std::fabs(s.zt) + std::fabs(s.zt - s.lse));
  }
  ref->rank[at] = s.rank;
  ref->rank_low[at] = ref->exact ? s.rank : s.low;
  ref->rank_high[at] = ref->exact ? s.rank : s.high;
}

// The blocks of rows of one ReferenceLogProbs call, each formed on the host
// or from the engine's sums, into the reference's rows.
class LogProbsBlocks {
 public:
  LogProbsBlocks(const LmHeadInputs& in, const std::int64_t* targets,
                 const LpReferenceOptions& options, const reference_internal::LogitRows& logit_rows,
                 bool classed, const LpZSink& z_sink, const LpIdsZ& ids_z, LogProbsReference* ref)
      : in_(in),
        targets_(targets),
        options_(options),
        logit_rows_(logit_rows),
        classed_(classed),
        z_sink_(z_sink),
        ids_z_(ids_z),
        ref_(*ref) {}

  // The rows [r0, r0 + n) on the host: their logits, then each row on
  // threads.
  void Host(std::int64_t r0, std::int64_t n);
  // The chunk's rows from the sums, order and ids' z the engine forms;
  // false when it did not form them.
  bool Device(const reference_internal::RowChunk& chunk);

 private:
  // The block's rows [first, last) (from r0) on the caller's thread, with
  // their own e_z and ids.
  void HostRows(std::int64_t r0, std::int64_t first, std::int64_t last);
  // The block's rows from r0 whose class envelopes to form: null for none
  // (classed_ false) or, with options_.class_rows empty, every row.
  const std::uint8_t* ClassRows(std::int64_t r0, std::int64_t n);

  const LmHeadInputs& in_;
  const std::int64_t* const targets_;
  const LpReferenceOptions& options_;
  const reference_internal::LogitRows& logit_rows_;
  const bool classed_;
  const LpZSink& z_sink_;
  const LpIdsZ& ids_z_;
  LogProbsReference& ref_;
  std::vector<double> y_, y_err_, y_class_, z_block_;
  std::vector<std::uint8_t> every_row_;
  const std::uint8_t* block_class_rows_ = nullptr;  // Host's block's ClassRows
};

const std::uint8_t* LogProbsBlocks::ClassRows(std::int64_t r0, std::int64_t n) {
  return reference_internal::BlockClassRows(classed_, options_.class_rows, r0, n, &every_row_);
}

void LogProbsBlocks::Host(std::int64_t r0, std::int64_t n) {
  const std::int64_t vv = ref_.v;
  block_class_rows_ = ClassRows(r0, n);
  logit_rows_.Compute(r0, n, &y_, &y_err_, classed_ ? &y_class_ : nullptr, block_class_rows_);
  z_block_.resize(static_cast<std::size_t>(n * vv));
  // The rows on threads, each with its own e_z and ids.
  reference_internal::ForRowsInParallel(
      n, n * vv,
      [&](std::int64_t first, std::int64_t last, int /*part*/) { HostRows(r0, first, last); });
  if (z_sink_) z_sink_(r0, n, z_block_.data());
  if (ids_z_.ids != nullptr) TopKIdsZ(ids_z_.ids, ids_z_.k, vv, ids_z_.z)(r0, n, z_block_.data());
}

void LogProbsBlocks::HostRows(std::int64_t r0, std::int64_t first, std::int64_t last) {
  const std::int64_t v = in_.v, vv = ref_.v;
  std::vector<double> ez(static_cast<std::size_t>(vv));
  std::vector<double> cz(classed_ ? ez.size() : 0);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(vv));
  for (std::int64_t r = first; r < last; ++r) {
    const std::int64_t i = r0 + r;
    double* z = z_block_.data() + r * vv;
    const double b = RowZ(y_.data() + r * v, y_err_.empty() ? nullptr : y_err_.data() + r * v, vv,
                          options_, z, ez.data());
    const bool classed = classed_ && block_class_rows_[r] != 0;
    if (classed) RowClassZ(y_.data() + r * v, y_class_.data() + r * v, vv, options_, cz.data());
    judgement::LpRowSums sums = RowSums(z, ez.data(), vv, b, classed ? cz.data() : nullptr);
    std::iota(ids.begin(), ids.end(), std::int64_t{0});
    const auto mid = ids.begin() + ref_.order_cols;
    std::partial_sort(ids.begin(), mid, ids.end(), [z](std::int64_t a, std::int64_t c) {
      return judgement::LpBefore(z[a], a, z[c], c);
    });
    for (std::int64_t p = 0; p < ref_.order_cols; ++p) {
      const std::size_t at = static_cast<std::size_t>(i * ref_.order_cols + p);
      ref_.order[at] = ids[static_cast<std::size_t>(p)];
      ref_.order_z[at] = z[ids[static_cast<std::size_t>(p)]];
    }
    const bool has_target = targets_ != nullptr && targets_[i] != options_.ignore_index;
    if (has_target) {
      const std::int64_t t = targets_[i];
      sums.zt = z[t];
      sums.ezt = ez[static_cast<std::size_t>(t)];
      if (classed) sums.class_zt = cz[static_cast<std::size_t>(t)];
      sums.rank = sums.low = sums.high = 0;
      for (std::int64_t j = 0; j < vv; ++j) {
        if (j == t) continue;
        sums.rank += judgement::LpBefore(z[j], j, sums.zt, t) ? 1 : 0;
        sums.low += z[j] > sums.zt + 2 * b ? 1 : 0;
        sums.high += z[j] >= sums.zt - 2 * b ? 1 : 0;
      }
    }
    StoreRow(sums, i, has_target, &ref_);
  }
}

bool LogProbsBlocks::Device(const reference_internal::RowChunk& chunk) {
  const std::vector<std::int64_t>& rows = chunk.rows;
  const std::int64_t n = static_cast<std::int64_t>(rows.size());
  std::vector<double> xd;
  if (!reference_internal::WidenFiniteRows(in_.x, rows, in_.k, &xd)) return false;
  std::vector<std::int64_t> row_targets(rows.size(), -1);
  for (std::size_t r = 0; r < rows.size() && targets_ != nullptr; ++r) {
    if (targets_[rows[r]] != options_.ignore_index) row_targets[r] = targets_[rows[r]];
  }
  // The ids of the chunk's rows in its order; the order and the ids' z
  // come back in it and go to their rows.
  const std::int64_t ids_k = ids_z_.ids != nullptr ? ids_z_.k : 0;
  std::vector<std::int64_t> ids(rows.size() * static_cast<std::size_t>(ids_k));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::copy_n(ids_z_.ids + rows[r] * ids_k, ids_k, ids.begin() + r * ids_k);
  }
  const std::int64_t cols = ref_.order_cols;
  std::vector<std::int64_t> order(rows.size() * static_cast<std::size_t>(cols));
  std::vector<double> order_z(order.size()), ids_z(ids.size());
  every_row_.assign(rows.size(), 1);
  LpRowsRequest request;
  request.targets = row_targets.data();
  request.gamma = Gamma(in_.k, kFp32StepError) + Gamma(in_.k + 1, kFp64UnitRoundoff);
  request.absolute = 2 * static_cast<double>(in_.k) * kFp32Underflow;
  request.cap = options_.logit_softcap;
  request.temperature = options_.temperature;
  request.vocab = ref_.v;
  request.order_cols = ref_.order_cols;
  request.ids = ids_k > 0 ? ids.data() : nullptr;
  request.ids_k = ids_k;
  request.class_rows = chunk.classed ? every_row_.data() : nullptr;
  std::vector<judgement::LpRowSums> sums(rows.size());
  LpRowsResult result;
  result.sums = sums.data();
  result.order = order.data();
  result.order_z = order_z.data();
  result.ids_z = ids_k > 0 ? ids_z.data() : nullptr;
  if (!in_.products->LpRowSums(xd.data(), n, request, result)) return false;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::int64_t i = rows[r];
    std::copy_n(order.begin() + r * cols, cols, ref_.order.begin() + i * cols);
    std::copy_n(order_z.begin() + r * cols, cols, ref_.order_z.begin() + i * cols);
    std::copy_n(ids_z.begin() + r * ids_k, ids_k, ids_z_.z + i * ids_k);
    StoreRow(sums[r], i, row_targets[r] >= 0, &ref_);
  }
  return true;
}

}  // namespace

bool ReferenceLogProbs(const LmHeadInputs& in, const std::int64_t* targets,
                       const LpReferenceOptions& options, LogitModel logits, LogProbsReference* out,
                       const LpZSink& z_sink, const StopCheck& stop, std::int64_t block_rows,
                       const LpIdsZ& ids_z) {
  const std::int64_t m = in.m, v = in.v;
  LogProbsReference& ref = *out;
  ref = LogProbsReference();
  ref.m = m;
  ref.v = options.vocab_size > 0 ? std::min(options.vocab_size, v) : v;
  ref.exact = logits != LogitModel::kFp32Sum && options.logit_softcap == 0 &&
              IsPowerOfTwo(options.temperature);
  const std::int64_t vv = ref.v;
  const std::size_t rows = static_cast<std::size_t>(m);
  for (auto* vec : {&ref.lse, &ref.lse_bound, &ref.logprob, &ref.logprob_bound, &ref.entropy,
                    &ref.entropy_bound, &ref.z_bound}) {
    vec->assign(rows, 0.0);
  }
  ref.order_cols = std::min(options.top_k + 1, vv);
  ref.order.resize(rows * static_cast<std::size_t>(ref.order_cols));
  ref.order_z.resize(ref.order.size());
  ref.rank.assign(rows, -1);
  ref.rank_low.assign(rows, -1);
  ref.rank_high.assign(rows, -1);
  const bool classed = options.class_envelope && logits == LogitModel::kFp32Sum;
  if (classed) {
    for (auto* vec : {&ref.lse_class, &ref.logprob_class, &ref.entropy_class}) {
      vec->assign(rows, 0.0);
    }
  }
  const std::int64_t block = block_rows > 0 ? block_rows : reference_internal::DefaultBlockRows(v);
  const reference_internal::LogitRows logit_rows(in, logits);
  LogProbsBlocks blocks(in, targets, options, logit_rows, classed, z_sink, ids_z, &ref);
  // Where the engine forms the logits, when it does, every operand is
  // finite (the rows of X are looked at as they are widened) and no caller
  // wants z itself: each row's sums, order and the ids' z there, the rows
  // finished here from them (StoreRow, as the host's).
  const bool on_device = !z_sink && logits == LogitModel::kFp32Sum && in.products != nullptr &&
                         in.products->WeightFinite();
  const std::int64_t device_rows = on_device ? in.products->JudgeBlockRows(std::max(v, in.k)) : 0;
  return reference_internal::FormRows(
      m, block, device_rows, classed, options.class_rows,
      [&](const reference_internal::RowChunk& chunk) { return blocks.Device(chunk); },
      [&](std::int64_t r0, std::int64_t n) { blocks.Host(r0, n); }, stop);
}

bool TopKPlaceDecided(const LogProbsReference& ref, std::int64_t i, std::int64_t p) {
  if (ref.exact) return true;
  const double* z = ref.order_z.data() + i * ref.order_cols;
  const double sep = 2 * ref.z_bound[static_cast<std::size_t>(i)];
  return (p == 0 || z[p - 1] - z[p] > sep) && (p + 1 >= ref.order_cols || z[p] - z[p + 1] > sep);
}

double TopKLogProbBound(const LogProbsReference& ref, std::int64_t i, double z_id) {
  const std::size_t s = static_cast<std::size_t>(i);
  const double lse = ref.lse[s];
  const double lp = z_id - lse;
  return ref.z_bound[s] + ref.lse_bound[s] +
         4 * kFp32U * (std::fabs(lse) + std::fabs(z_id) + std::fabs(lp));
}

void CheckTopKIds(const LogProbsReference& ref, std::int64_t k, const std::int64_t* ids,
                  const std::int64_t* own_ids, const double* ids_z, CandidateCheck* check) {
  for (std::int64_t i = 0; i < ref.m; ++i) {
    const double sep = ref.exact ? 0.0 : 2 * ref.z_bound[static_cast<std::size_t>(i)];
    for (std::int64_t p = 0; p < k; ++p) {
      const std::int64_t at = i * k + p;
      const std::size_t place = static_cast<std::size_t>(i * ref.order_cols + p);
      const double z_place =
          p < ref.order_cols ? ref.order_z[place] : std::numeric_limits<double>::quiet_NaN();
      const double shown = p < ref.order_cols ? static_cast<double>(ref.order[place]) : -1.0;
      check->AddInteger(at, ids[at], own_ids[at], ids_z[at], z_place, sep, shown);
    }
  }
}

void CheckTopKLogProbs(const LogProbsReference& ref, std::int64_t k, const float* logprobs,
                       const float* own, CandidateCheck* check) {
  std::vector<double> value(static_cast<std::size_t>(k)), bound(value.size());
  for (std::int64_t i = 0; i < ref.m; ++i) {
    for (std::int64_t p = 0; p < k; ++p) {
      const std::size_t s = static_cast<std::size_t>(p);
      if (p >= ref.order_cols) {  // k past the vocabulary: no such place
        value[s] = std::numeric_limits<double>::quiet_NaN();
        bound[s] = 0;
        continue;
      }
      const double z = ref.order_z[static_cast<std::size_t>(i * ref.order_cols + p)];
      value[s] = z - ref.lse[static_cast<std::size_t>(i)];
      bound[s] = TopKLogProbBound(ref, i, z);
    }
    check->AddRange(i * k, k, logprobs + i * k, own + i * k, value.data(), bound.data(),
                    bound.data());
  }
}

void CheckRanks(const LogProbsReference& ref, const std::int64_t* rank, const std::int64_t* own,
                CandidateCheck* check) {
  for (std::int64_t i = 0; i < ref.m; ++i) {
    const std::size_t s = static_cast<std::size_t>(i);
    const double low = static_cast<double>(ref.rank_low[s]);
    const double high = static_cast<double>(ref.rank_high[s]);
    check->AddInteger(i, rank[i], own[i], static_cast<double>(rank[i]), (low + high) / 2,
                      (high - low) / 2, static_cast<double>(ref.rank[s]));
  }
}

LpZSink TopKIdsZ(const std::int64_t* ids, std::int64_t k, std::int64_t vocab, double* ids_z) {
  return [=](std::int64_t row0, std::int64_t rows, const double* z) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t* row = ids + (row0 + r) * k;
      for (std::int64_t p = 0; p < k; ++p) {
        const std::int64_t id = row[p];
        bool valid = id >= 0 && id < vocab;
        for (std::int64_t q = 0; q < p && valid; ++q) valid = row[q] != id;
        ids_z[(row0 + r) * k + p] =
            valid ? z[r * vocab + id] : std::numeric_limits<double>::quiet_NaN();
      }
    }
  };
}

std::uint64_t LogProbsReferenceBytes(std::int64_t m, std::int64_t v, std::int64_t k,
                                     std::int64_t block_rows) {
  constexpr std::uint64_t kDouble = sizeof(double);
  const std::int64_t rows =
      std::min(m, block_rows > 0 ? block_rows : reference_internal::DefaultBlockRows(v));
  const std::uint64_t n = static_cast<std::uint64_t>(std::max<std::int64_t>(rows, 1));
  const std::uint64_t uv = static_cast<std::uint64_t>(v), uk = static_cast<std::uint64_t>(k);
  // The block's rows of X widened, with their magnitudes; its logits, their
  // bounds and z.
  std::uint64_t bytes = n * (2 * uk + 3 * uv) * kDouble;
  // A row's e_z and ids on each of up to 16 threads; a block of W widened
  // (whole rows, at most kReferenceBlockElements elements); the rows of W
  // with a NaN or an infinity.
  const std::uint64_t w_rows =
      static_cast<std::uint64_t>(std::min(v, reference_internal::DefaultBlockRows(k)));
  bytes += 16 * uv * (kDouble + sizeof(std::int64_t)) + uv * sizeof(std::int64_t) +
           w_rows * uk * kDouble;
  // The precision-class test's: the block's class envelopes and models (a
  // float and a double a logit), a row's c_z on each thread, the models'
  // panels.
  bytes += n * uv * (2 * kDouble + sizeof(float)) + 16 * uv * kDouble +
           2 * uk * static_cast<std::uint64_t>(kModelPanel) * sizeof(float);
  return bytes;
}

}  // namespace logitd
