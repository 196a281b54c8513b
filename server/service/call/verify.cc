#include "server/service/call/verify.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "logitd/bf16.h"
#include "logitd/reference/cross_entropy.h"
#include "logitd/reference/fp64_products.h"
#include "logitd/reference/logprobs.h"
#include "logitd/status_macros.h"
#include "server/service/call/row_blocks.h"
#include "server/service/state/logging.h"

namespace logitd::service {
namespace {

// The xxh3-64 the request gave for input `slot` (in its spec, or after its
// chunks), else of its bytes.
std::uint64_t DigestOf(const Call& call, absl::string_view slot, std::uint64_t bytes) {
  if (std::optional<std::uint64_t> d = call.InputDigest(slot)) return *d;
  return Xxh3(call.in(slot), bytes);
}

constexpr char kHostEngine[] = "OpenBLAS dgemm on the host";

}  // namespace

std::string VerifiedCandidate::Verdict() const {
  const std::string v = check.Verdict();
  return sampled && check.passed() ? v + "_sampled" : v;
}

std::string VerifyOutcome::Verdict() const {
  // Worst first.
  const char* const order[] = {"outside_bounds", "outside_precision_class", "within_bounds",
                               "bitwise_equal_to_logitd"};
  std::size_t worst = 3;
  bool sampled = false;
  for (const VerifiedCandidate& c : candidates) {
    const std::string v = c.check.Verdict();
    sampled = sampled || c.sampled;
    for (std::size_t i = 0; i < worst; ++i) {
      if (v == order[i]) worst = i;
    }
  }
  return sampled && worst >= 2 ? std::string(order[worst]) + "_sampled" : order[worst];
}

namespace {

// The weight on the backend, and its bf16 values on the host.
struct VerifyWeight {
  std::shared_ptr<kernels::Weight> weight;
  const Bf16Bits* host = nullptr;
  kernels::HostBuffer copy;  // a registered weight read back
  std::uint64_t xxh3 = 0;
};

// Declares every tensor of the call (a streamed weight charged to the
// weight budget and the tenant's quota before its bytes arrive, held by
// *reservation).
absl::Status DeclareVerify(const OpEnv& env, const VerifyRequest& r, const VerifyPlan& plan,
                           Call* call, BudgetReservation* reservation) {
  if (plan.weight_streamed) {
    LOGITD_ASSIGN_OR_RETURN(
        *reservation,
        env.registry->ReserveWeight(call->tenant(), "verify's streamed w", plan.v, plan.k));
    LOGITD_RETURN_IF_ERROR(call->Input("w", r.w, plan.w_bytes));
  }
  LOGITD_RETURN_IF_ERROR(call->Input("x", r.x, plan.x_bytes));
  if (plan.operation == VerifyOperation::kBackward) {
    LOGITD_RETURN_IF_ERROR(call->Input("dy", r.dy, plan.dy_bytes));
  }
  if (r.targets.given)
    LOGITD_RETURN_IF_ERROR(call->Input("targets", r.targets, plan.targets_bytes));
  for (const VerifyCandidatePlan& c : plan.candidates) {
    LOGITD_RETURN_IF_ERROR(call->Input(c.name, r.candidates[c.index], c.bytes));
  }
  call->Scratch(plan.scratch_bytes);
  return absl::OkStatus();
}

// A streamed weight loaded for this call (its bytes in), or the registered
// one.
absl::StatusOr<VerifyWeight> WeightOfCall(const OpEnv& env, const VerifyRequest& r,
                                          const VerifyPlan& plan,
                                          const std::optional<WeightRecord>& record, Call* call) {
  VerifyWeight w;
  if (plan.weight_streamed) {
    w.host = call->in<Bf16Bits>("w");
    LOGITD_ASSIGN_OR_RETURN(w.weight, env.backend->LoadWeight(w.host, plan.v, plan.k));
    return w;
  }
  w.weight = record->weight;
  w.xxh3 = record->xxh3;
  return w;
}

// A registered weight's values read back to the host, when a reference
// needs them.
absl::Status ReadBackWeight(const OpEnv& env, const VerifyPlan& plan, VerifyWeight* w) {
  if (plan.weight_streamed || !plan.weight_read_back) return absl::OkStatus();
  LOGITD_ASSIGN_OR_RETURN(w->copy, env.backend->AllocateHost(plan.w_bytes));
  LOGITD_RETURN_IF_ERROR(env.backend->ReadWeight(*w->weight, w->copy.as<Bf16Bits>()));
  w->host = w->copy.as<Bf16Bits>();
  return absl::OkStatus();
}

// The cross-entropy's or LogProbs' options, for the inputs' digest.
std::string OptionsText(const VerifyPlan& plan) {
  if (plan.cross_entropy.has_value()) {
    const CrossEntropyPlan& c = *plan.cross_entropy;
    return absl::StrFormat(";ignore=%d;reduction=%d;z_loss=%08x;softcap=%08x;grad_scale=%08x",
                           c.ignore_index, static_cast<int>(c.reduction), FloatBits(c.z_loss),
                           FloatBits(c.logit_softcap), FloatBits(c.grad_scale));
  }
  if (plan.logprobs.has_value()) {
    const LogProbsPlan& l = *plan.logprobs;
    return absl::StrFormat(";ignore=%d;temperature=%08x;softcap=%08x;vocab=%d", l.ignore_index,
                           FloatBits(l.temperature), FloatBits(l.logit_softcap), l.vocab);
  }
  return "";
}

// The targets widened to int64 and checked against the vocabulary that
// counts; the tokens not ignored.
struct VerifyTargets {
  std::vector<std::int64_t> ids;  // empty when the call has none
  std::int64_t counted = 0;
};

absl::StatusOr<VerifyTargets> TargetsOfCall(const VerifyRequest& r, const VerifyPlan& plan,
                                            Call* call) {
  VerifyTargets t;
  if (!r.targets.given) return t;
  const std::int64_t vocab = plan.logprobs ? plan.logprobs->vocab : plan.v;
  const std::int64_t ignore =
      plan.logprobs ? plan.logprobs->ignore_index : plan.cross_entropy->ignore_index;
  LOGITD_ASSIGN_OR_RETURN(t.counted, ConvertTargets(plan.targets_dtype, call->in("targets"), plan.m,
                                                    vocab, ignore, &t.ids));
  return t;
}

// logitd's own cross-entropy of the call's inputs: the per-token losses
// (into `loss` when the candidate is per token, else reduced into it as the
// CrossEntropy RPC reduces them), lse, dX (of cp.dx_dtype) and dW (fp32);
// any may be null.
absl::Status RunOwnCrossEntropy(const OpEnv& env, const CrossEntropyPlan& cp, Call* call,
                                kernels::Weight& weight, const VerifyTargets& targets, float* loss,
                                float* lse, void* dx, float* dw, kernels::Timing* timing) {
  const bool per_token = cp.reduction == Reduction::kNone && loss != nullptr;
  std::vector<float> token_loss(per_token ? 0 : static_cast<std::size_t>(cp.m));
  kernels::CrossEntropyArgs args;
  args.weight = &weight;
  args.x = call->in<Bf16Bits>("x");
  args.m = cp.m;
  args.targets = targets.ids.data();
  args.ignore_index = cp.ignore_index;
  args.z_loss = cp.z_loss;
  args.logit_softcap = cp.logit_softcap;
  args.grad_scale = CrossEntropyGradScale(cp, targets.counted);
  args.loss = per_token ? loss : token_loss.data();
  args.lse = lse;
  args.dx = dx;
  args.dx_dtype = cp.dx_dtype;
  args.dw = dw;
  LOGITD_RETURN_IF_ERROR(env.backend->Kernel(args, timing));
  if (loss != nullptr && !per_token) {
    *loss = ReduceLoss(cp, token_loss.data(), cp.m, targets.counted);
  }
  return absl::OkStatus();
}

// logitd's own outputs of the same inputs, by candidate name, in the
// candidates' dtypes.
absl::Status RunOwn(const OpEnv& env, const VerifyPlan& plan, Call* call, kernels::Weight& weight,
                    const VerifyTargets& targets, std::map<VerifyOutput, kernels::HostBuffer>* own,
                    kernels::Timing* timing) {
  for (const VerifyCandidatePlan& c : plan.candidates) {
    LOGITD_ASSIGN_OR_RETURN((*own)[c.output], env.backend->AllocateHost(OwnBytes(c)));
  }
  const auto out = [&](VerifyOutput output) -> std::byte* {
    auto it = own->find(output);
    return it == own->end() ? nullptr : it->second.data();
  };
  const auto dtype_of = [&](VerifyOutput output, DType fallback) {
    for (const VerifyCandidatePlan& c : plan.candidates) {
      if (c.output == output) return c.dtype;
    }
    return fallback;
  };
  if (plan.operation == VerifyOperation::kLogits) {
    kernels::LogitsArgs args;
    args.x = call->in<Bf16Bits>("x");
    args.m = plan.m;
    args.alpha = plan.alpha;
    args.out_dtype = dtype_of(VerifyOutput::kY, DType::kFp32);
    args.y = out(VerifyOutput::kY);
    return env.backend->Logits(weight, args, timing);
  }
  if (plan.cross_entropy.has_value()) {
    return RunOwnCrossEntropy(env, *plan.cross_entropy, call, weight, targets,
                              reinterpret_cast<float*>(out(VerifyOutput::kLoss)),
                              reinterpret_cast<float*>(out(VerifyOutput::kLse)),
                              out(VerifyOutput::kDx),
                              reinterpret_cast<float*>(out(VerifyOutput::kDw)), timing);
  }
  if (plan.logprobs.has_value()) {
    const LogProbsPlan& lp = *plan.logprobs;
    kernels::LogProbsArgs args;
    args.weight = &weight;
    args.x = call->in<Bf16Bits>("x");
    args.m = plan.m;
    args.targets = targets.ids.empty() ? nullptr : targets.ids.data();
    args.ignore_index = lp.ignore_index;
    args.temperature = lp.temperature;
    args.logit_softcap = lp.logit_softcap;
    args.vocab = lp.vocab;
    args.logprob = reinterpret_cast<float*>(out(VerifyOutput::kLogprob));
    args.lse = reinterpret_cast<float*>(out(VerifyOutput::kLse));
    args.entropy = reinterpret_cast<float*>(out(VerifyOutput::kEntropy));
    // The top-k comes as ids and log-probs together; the one no candidate
    // asked for goes to scratch.
    std::vector<std::int32_t> spare_ids;
    std::vector<float> spare_logprobs;
    if (lp.top_k > 0) {
      spare_ids.resize(
          out(VerifyOutput::kTopkIds) == nullptr ? static_cast<std::size_t>(plan.m * lp.top_k) : 0);
      spare_logprobs.resize(out(VerifyOutput::kTopkLogprobs) == nullptr
                                ? static_cast<std::size_t>(plan.m * lp.top_k)
                                : 0);
    }
    args.top_k = lp.top_k;
    args.topk_ids = out(VerifyOutput::kTopkIds) != nullptr
                        ? reinterpret_cast<std::int32_t*>(out(VerifyOutput::kTopkIds))
                        : spare_ids.data();
    args.topk_logprobs = out(VerifyOutput::kTopkLogprobs) != nullptr
                             ? reinterpret_cast<float*>(out(VerifyOutput::kTopkLogprobs))
                             : spare_logprobs.data();
    args.rank = reinterpret_cast<std::int64_t*>(out(VerifyOutput::kRank));
    return env.backend->Kernel(args, timing);
  }
  kernels::BackwardArgs args;
  args.dy = call->in("dy");
  args.dy_dtype = plan.dy_dtype;
  args.x = call->in<Bf16Bits>("x");
  args.m = plan.m;
  args.dx = out(VerifyOutput::kDx);
  args.dx_dtype = dtype_of(VerifyOutput::kDx, DType::kBf16);
  args.dw = out(VerifyOutput::kDw);
  args.dw_dtype = dtype_of(VerifyOutput::kDw, DType::kFp32);
  return env.backend->Backward(weight, args, timing);
}

// Each candidate against the references and logitd's own output, one after
// the other; Cancelled when `stop` says the caller went away.
absl::Status CheckCandidates(const VerifyPlan& plan, const LmHeadInputs& in, Call* call,
                             const std::map<VerifyOutput, kernels::HostBuffer>& own,
                             const StopCheck& stop, VerifyOutcome* outcome) {
  for (const VerifyCandidatePlan& c : plan.candidates) {
    VerifiedCandidate v{c.name, c.dtype, c.shape, 0, CandidateCheck(c.dtype)};
    const std::byte* data = call->in(c.name);
    const std::byte* mine = own.at(c.output).data();
    v.xxh3 = DigestOf(*call, c.name, c.bytes);
    if (plan.block_digests) v.block_xxh3 = BlockDigests(data, c.bytes, c.shape, &v.block_rows);
    v.sampled = !plan.rows.empty() && c.output != VerifyOutput::kDw;
    bool done = false;
    if (c.output == VerifyOutput::kY) {
      done = CheckLogits(in, plan.alpha, plan.rows, data, mine, c.dtype, &v.check, stop);
    } else if (c.output == VerifyOutput::kDx) {
      done = CheckGradInput(in, plan.rows, data, mine, c.dtype, &v.check, stop);
    } else {
      done = CheckGradWeight(in, data, mine, c.dtype, &v.check, stop);
    }
    if (!done) {
      return absl::CancelledError("verify: the caller went away while the references were formed");
    }
    outcome->candidates.push_back(std::move(v));
  }
  return absl::OkStatus();
}

const VerifyCandidatePlan* Find(const VerifyPlan& plan, VerifyOutput output) {
  for (const VerifyCandidatePlan& c : plan.candidates) {
    if (c.output == output) return &c;
  }
  return nullptr;
}

// n integers of `dtype` (INT32 or INT64) at `data`, as int64.
std::vector<std::int64_t> Integers(const std::byte* data, DType dtype, std::int64_t n) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kInt32) {
      std::int32_t v;
      std::memcpy(&v, data + i * 4, 4);
      out[static_cast<std::size_t>(i)] = v;
    } else {
      std::memcpy(&out[static_cast<std::size_t>(i)], data + i * 8, 8);
    }
  }
  return out;
}

// A LogProbs top-k ids, top-k log-probs or rank candidate against the
// reference (logitd/reference/logprobs.h); logitd's own ids are int32, its
// ranks int64.
void CheckTopKOrRank(const VerifyCandidatePlan& c, const VerifyPlan& plan,
                     const LogProbsReference& ref, const std::vector<std::int64_t>& ids,
                     const std::vector<double>& ids_z, const std::byte* candidate,
                     const std::byte* own, CandidateCheck* check) {
  const std::int64_t k = plan.logprobs->top_k;
  if (c.output == VerifyOutput::kTopkIds) {
    CheckTopKIds(ref, k, ids.data(), Integers(own, DType::kInt32, plan.m * k).data(), ids_z.data(),
                 check);
  } else if (c.output == VerifyOutput::kTopkLogprobs) {
    CheckTopKLogProbs(ref, k, reinterpret_cast<const float*>(candidate),
                      reinterpret_cast<const float*>(own), check);
  } else {
    CheckRanks(ref, Integers(candidate, c.dtype, plan.m).data(),
               Integers(own, DType::kInt64, plan.m).data(), check);
  }
}

// The rows a per-token check references: all of the call's or, with rows
// sampled, those rows' X and targets (reference row j is the call's row
// plan.rows[j]).
struct TokenInputs {
  LmHeadInputs in;
  const std::int64_t* targets = nullptr;
  std::vector<Bf16Bits> x_rows;
  std::vector<std::int64_t> target_rows;
};

void SampleTokens(const VerifyPlan& plan, const LmHeadInputs& call_in, const VerifyTargets& targets,
                  TokenInputs* t) {
  t->in = call_in;
  t->targets = targets.ids.empty() ? nullptr : targets.ids.data();
  if (plan.rows.empty()) return;
  for (std::int64_t i : plan.rows) {
    t->x_rows.insert(t->x_rows.end(), call_in.x + i * call_in.k, call_in.x + (i + 1) * call_in.k);
    if (t->targets != nullptr) t->target_rows.push_back(t->targets[i]);
  }
  t->in.x = t->x_rows.data();
  t->in.m = static_cast<std::int64_t>(plan.rows.size());
  if (t->targets != nullptr) t->targets = t->target_rows.data();
}

// A per-token output's reference: values, proven bounds and
// precision-class envelopes (empty for a reduced loss), [M] or [1].
struct TokenReference {
  std::vector<double> values, bounds, envelopes;
};

// The references of the cross-entropy's candidates: its per-token outputs
// by name and, for dX and dW, g with its pre-cast bound and flip weights
// [M, V]. False when `stop` ended it.
bool CrossEntropyReferences(const CrossEntropyPlan& cp, const TokenInputs& t,
                            const VerifyTargets& targets, const std::vector<std::uint8_t>& classed,
                            const StopCheck& stop, std::map<VerifyOutput, TokenReference>* refs,
                            CeGradients* grads) {
  const LmHeadInputs& in = t.in;
  CeReferenceOptions o;
  o.ignore_index = cp.ignore_index;
  o.reduction = cp.reduction == Reduction::kNone  ? CeReduction::kNone
                : cp.reduction == Reduction::kSum ? CeReduction::kSum
                                                  : CeReduction::kMean;
  o.z_loss = cp.z_loss;
  o.logit_softcap = cp.logit_softcap;
  o.grad_scale = cp.grad_scale;
  // A mean divides by the call's counted tokens, sampled rows or not.
  o.counted_tokens = targets.counted;
  o.class_envelope = true;
  o.class_rows = classed;
  CrossEntropyReference ref;
  CeGradientSink gather;
  if (cp.want_dx || cp.want_dw) {
    const std::size_t n = static_cast<std::size_t>(in.m * in.v);
    grads->g.resize(n);
    grads->pre_err.resize(n);
    // (n by value: the sink outlives this block.)
    gather = [&, n](std::int64_t row0, std::int64_t rows, const double* gb, const double* eb,
                    const double* fm, const double* fv) {
      const std::size_t first = static_cast<std::size_t>(row0 * in.v);
      const std::size_t count = static_cast<std::size_t>(rows * in.v);
      const auto into = [&](const double* from, std::vector<double>* to) {
        to->resize(n);
        std::copy(from, from + count, to->begin() + static_cast<std::ptrdiff_t>(first));
      };
      into(gb, &grads->g);
      into(eb, &grads->pre_err);
      if (fm != nullptr) {
        into(fm, &grads->flip_mean);
        into(fv, &grads->flip_var);
      }
    };
  }
  if (!ReferenceCrossEntropy(in, t.targets, o, LogitModel::kFp32Sum, &ref, gather, stop)) {
    return false;
  }
  (*refs)[VerifyOutput::kLse] = {ref.lse, ref.lse_bound, ref.lse_class};
  if (o.reduction == CeReduction::kNone) {
    (*refs)[VerifyOutput::kLoss] = {ref.loss, ref.loss_bound, ref.loss_class};
  } else if (o.reduction == CeReduction::kSum) {
    (*refs)[VerifyOutput::kLoss] = {{ref.sum}, {ref.sum_bound}, {}};
  } else {
    (*refs)[VerifyOutput::kLoss] = {{ref.mean}, {ref.mean_bound}, {}};
  }
  return true;
}

// LogProbs' references: its per-token outputs by name, and the whole
// reference for the top-k and rank candidates (with a top-k ids
// candidate's ids widened and their z, gathered with the reference's
// rows). False when `stop` ended it.
bool LogProbsReferences(const VerifyPlan& plan, const TokenInputs& t,
                        const std::vector<std::uint8_t>& classed, Call* call, const StopCheck& stop,
                        std::map<VerifyOutput, TokenReference>* refs, LogProbsReference* lp_ref,
                        std::vector<std::int64_t>* top_k_ids, std::vector<double>* top_k_z) {
  const LogProbsPlan& lp = *plan.logprobs;
  LpReferenceOptions o;
  o.ignore_index = lp.ignore_index;
  o.temperature = lp.temperature;
  o.logit_softcap = lp.logit_softcap;
  o.vocab_size = lp.vocab;
  o.top_k = lp.top_k;
  o.class_envelope = true;
  o.class_rows = classed;
  LpIdsZ ids_z;
  if (const VerifyCandidatePlan* c = Find(plan, VerifyOutput::kTopkIds); c != nullptr) {
    *top_k_ids = Integers(call->in(c->name), c->dtype, plan.m * lp.top_k);
    top_k_z->resize(top_k_ids->size());
    ids_z = LpIdsZ{top_k_ids->data(), lp.top_k, top_k_z->data()};
  }
  if (!ReferenceLogProbs(t.in, t.targets, o, LogitModel::kFp32Sum, lp_ref, {}, stop, 0, ids_z)) {
    return false;
  }
  (*refs)[VerifyOutput::kLogprob] = {lp_ref->logprob, lp_ref->logprob_bound, lp_ref->logprob_class};
  (*refs)[VerifyOutput::kLse] = {lp_ref->lse, lp_ref->lse_bound, lp_ref->lse_class};
  (*refs)[VerifyOutput::kEntropy] = {lp_ref->entropy, lp_ref->entropy_bound, lp_ref->entropy_class};
  return true;
}

// The tokens of t whose per-token outputs take the precision-class test
// (ClassTokenRows: empty, every one): at most kClassTokens, drawn by a seed
// of the inputs, so that the same inputs draw the same tokens everywhere;
// every token when the cross-entropy's gradients are checked, whose test
// needs every row's envelopes.
std::vector<std::uint8_t> ClassTokens(const VerifyPlan& plan, const TokenInputs& t) {
  const LmHeadInputs& in = t.in;
  if (plan.cross_entropy.has_value() &&
      (plan.cross_entropy->want_dx || plan.cross_entropy->want_dw)) {
    return {};
  }
  const std::int64_t ignore_index = plan.cross_entropy.has_value()
                                        ? plan.cross_entropy->ignore_index
                                        : plan.logprobs->ignore_index;
  const std::uint64_t seed =
      t.targets != nullptr ? Xxh3(t.targets, static_cast<std::size_t>(in.m) * sizeof(std::int64_t))
                           : Xxh3(in.x, static_cast<std::size_t>(in.k) * sizeof(Bf16Bits));
  return ClassTokenRows(t.targets, in.m, ignore_index, kClassTokens, seed);
}

// The per-token candidates of the cross-entropy or LogProbs against one
// reference of all of them (its proven bound is also the probabilistic
// one: these bounds have no probabilistic form yet).
absl::Status CheckPerToken(const VerifyPlan& plan, const LmHeadInputs& call_in,
                           const VerifyTargets& targets, Call* call,
                           const std::map<VerifyOutput, kernels::HostBuffer>& own,
                           const StopCheck& stop, VerifyOutcome* outcome) {
  const absl::Status gone =
      absl::CancelledError("verify: the caller went away while the references were formed");
  TokenInputs t;
  SampleTokens(plan, call_in, targets, &t);
  const LmHeadInputs& in = t.in;
  std::map<VerifyOutput, TokenReference> refs;
  CeGradients grads;
  LogProbsReference lp_ref;
  std::vector<std::int64_t> top_k_ids;
  std::vector<double> top_k_z;
  const std::vector<std::uint8_t> classed = ClassTokens(plan, t);
  const bool done =
      plan.cross_entropy.has_value()
          ? CrossEntropyReferences(*plan.cross_entropy, t, targets, classed, stop, &refs, &grads)
          : LogProbsReferences(plan, t, classed, call, stop, &refs, &lp_ref, &top_k_ids, &top_k_z);
  if (!done) return gone;
  // lse and the entropy do not read the target: tokens with equal rows of X
  // err alike there whatever their targets. Counted among those the
  // precision-class test takes.
  const std::uint8_t* class_rows = classed.empty() ? nullptr : classed.data();
  const std::int64_t drawn_from = classed.empty() ? 0 : in.m;
  const DistinctTokenCounts distinct = CountDistinctTokens(in, t.targets, class_rows);
  const std::int64_t independent = distinct.with_targets;
  const std::int64_t independent_rows = distinct.rows;
  for (const VerifyCandidatePlan& c : plan.candidates) {
    VerifiedCandidate v{c.name, c.dtype, c.shape, 0, CandidateCheck(c.dtype)};
    const std::byte* data = call->in(c.name);
    v.xxh3 = DigestOf(*call, c.name, c.bytes);
    if (plan.block_digests) v.block_xxh3 = BlockDigests(data, c.bytes, c.shape, &v.block_rows);
    // The reduced loss and dW are refused with sample_rows.
    const VerifyOutput o = c.output;
    v.sampled = !plan.rows.empty() && o != VerifyOutput::kDw && c.shape.size() >= 1 &&
                !(o == VerifyOutput::kLoss && c.shape == std::vector<std::int64_t>{1});
    if (o == VerifyOutput::kTopkIds || o == VerifyOutput::kTopkLogprobs ||
        o == VerifyOutput::kRank) {
      CheckTopKOrRank(c, plan, lp_ref, top_k_ids, top_k_z, data, own.at(o).data(), &v.check);
    } else if (o == VerifyOutput::kDx || o == VerifyOutput::kDw) {
      if (!CheckCrossEntropyGradient(o == VerifyOutput::kDw, in, plan.rows, grads, independent,
                                     data, own.at(o).data(), c.dtype, &v.check, stop)) {
        return gone;
      }
    } else {
      const TokenReference& r = refs.at(o);
      CheckTokenValues(
          r.values, r.bounds, r.envelopes, plan.rows, reinterpret_cast<const float*>(data),
          reinterpret_cast<const float*>(own.at(o).data()),
          o == VerifyOutput::kLse || o == VerifyOutput::kEntropy ? independent_rows : independent,
          &v.check, drawn_from);
    }
    outcome->candidates.push_back(std::move(v));
  }
  return absl::OkStatus();
}

// Where a call's time went, stage by stage, for the debug log.
class StageLog {
 public:
  void Mark(const char* name) {
    const absl::Time now = absl::Now();
    absl::StrAppendFormat(&text_, " %s %.1f ms;", name, absl::ToDoubleMilliseconds(now - mark_));
    mark_ = now;
  }
  void Append(absl::string_view more) { absl::StrAppend(&text_, more); }
  const std::string& text() const { return text_; }

 private:
  absl::Time mark_ = absl::Now();
  std::string text_;
};

// The backend's engine of fp64 products for `weight`, when it offers one
// (else *engine stays null: the host's), and its name or why not; how long
// making it took.
absl::Duration MakeEngine(kernels::Backend& backend, kernels::Weight& weight,
                          std::shared_ptr<Fp64Products>* engine, std::string* name) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<Fp64Products>> e = backend.ReferenceProducts(weight);
  if (e.ok() && *e != nullptr) {
    *engine = *std::move(e);
    *name = (*engine)->name();
  } else if (!e.ok()) {
    *name = absl::StrCat(kHostEngine, " (the device's engine: ", e.status().message(), ")");
  }
  return absl::Now() - start;
}

// The call's inputs as the checks read them.
LmHeadInputs InputsOf(const VerifyPlan& plan, const Call& call, const VerifyWeight& w,
                      Fp64Products* engine) {
  LmHeadInputs in;
  in.products = engine;
  in.x = call.in<Bf16Bits>("x");
  in.w = w.host;
  in.dy = call.in("dy");
  in.dy_dtype = plan.dy_dtype;
  in.m = plan.m;
  in.v = plan.v;
  in.k = plan.k;
  return in;
}

// The digest of everything the verdicts depend on but the candidates: the
// operation, alpha, the inputs' digests and the options (inputs_xxh3).
std::uint64_t InputsDigest(const VerifyRequest& r, const VerifyPlan& plan, const Call& call,
                           std::uint64_t w_xxh3) {
  std::string inputs = absl::StrFormat("verify;%s;alpha=%08x;w=%016x;x=%016x;dy=%016x",
                                       VerifyOperationName(plan.operation), FloatBits(plan.alpha),
                                       w_xxh3, DigestOf(call, "x", plan.x_bytes),
                                       r.dy.given ? DigestOf(call, "dy", plan.dy_bytes) : 0);
  if (r.targets.given) {
    absl::StrAppendFormat(&inputs, ";targets=%016x", DigestOf(call, "targets", plan.targets_bytes));
  }
  absl::StrAppend(&inputs, OptionsText(plan));
  return Xxh3(inputs.data(), inputs.size());
}

// The registered weight the request names, if any, and the call's plan.
absl::StatusOr<VerifyPlan> PlanOfCall(const OpEnv& env, const VerifyRequest& r, const Call& call,
                                      std::optional<WeightRecord>* record) {
  WeightDims registered;
  if (!r.weight_handle.empty()) {
    LOGITD_ASSIGN_OR_RETURN(*record, FindWeight(*env.registry, call.tenant(), r.weight_handle));
    registered = WeightDims{(*record)->v, (*record)->k, (*record)->Label()};
  }
  return PlanVerify(r, record->has_value() ? &registered : nullptr, env.max_request_bytes);
}

}  // namespace

absl::StatusOr<VerifyOutcome> RunVerify(const OpEnv& env, const VerifyRequest& r, Call* call,
                                        Transport& transport, const StopCheck& stop) {
  LOGITD_RETURN_IF_ERROR(CheckVerifyRequest(r));
  std::optional<WeightRecord> record;
  LOGITD_ASSIGN_OR_RETURN(const VerifyPlan plan, PlanOfCall(env, r, *call, &record));
  BudgetReservation reservation;
  LOGITD_RETURN_IF_ERROR(DeclareVerify(env, r, plan, call, &reservation));
  StageLog stages;
  VerifyWeight w;
  VerifyTargets targets;
  VerifyOutcome outcome;
  std::map<VerifyOutput, kernels::HostBuffer> own;
  // The fp64 products on the backend's device when it offers them; on the
  // host when it has none or cannot hold the widened weight.
  std::shared_ptr<Fp64Products> engine;
  outcome.reference_engine = kHostEngine;
  std::string aside;  // the side thread's stages
  // While the candidates arrive (the bulk of a Logits or Backward verify's
  // bytes): the weight read back and the reference engine made, each on a
  // thread of its own, and logitd's own outputs formed on this one as soon
  // as the inputs they need are in. Every digest is checked before a
  // reference is formed or anything is judged.
  LOGITD_RETURN_IF_ERROR(call->ReceiveWhile("verify", transport, [&](const Call::WaitWhole& whole) {
    if (plan.weight_streamed) LOGITD_RETURN_IF_ERROR(whole("w"));
    LOGITD_ASSIGN_OR_RETURN(w, WeightOfCall(env, r, plan, record, call));
    absl::Status read_back;
    absl::Duration made_in, read_in;
    std::thread making(
        [&] { made_in = MakeEngine(*env.backend, *w.weight, &engine, &outcome.reference_engine); });
    std::thread reading([&] {
      const absl::Time start = absl::Now();
      read_back = ReadBackWeight(env, plan, &w);
      read_in = absl::Now() - start;
    });
    absl::Status status = whole("x");
    if (status.ok() && plan.operation == VerifyOperation::kBackward) status = whole("dy");
    if (status.ok() && r.targets.given) status = whole("targets");
    if (status.ok()) {
      absl::StatusOr<VerifyTargets> t = TargetsOfCall(r, plan, call);
      status = t.status();
      if (t.ok()) targets = *std::move(t);
    }
    if (status.ok()) status = RunOwn(env, plan, call, *w.weight, targets, &own, &outcome.timing);
    making.join();
    reading.join();
    aside =
        absl::StrFormat(" (beside them: reference engine %.1f ms; weight read back %.1f ms)",
                        absl::ToDoubleMilliseconds(made_in), absl::ToDoubleMilliseconds(read_in));
    if (status.ok()) status = read_back;
    return status;
  }));
  // A streamed weight's digest, which may have followed its chunks.
  if (plan.weight_streamed) w.xxh3 = DigestOf(*call, "w", plan.w_bytes);
  stages.Mark("inputs and logitd's own outputs");
  stages.Append(aside);
  const absl::Time reference_start = absl::Now();
  const LmHeadInputs in = InputsOf(plan, *call, w, engine.get());
  if (plan.cross_entropy || plan.logprobs) {
    LOGITD_RETURN_IF_ERROR(CheckPerToken(plan, in, targets, call, own, stop, &outcome));
  } else {
    LOGITD_RETURN_IF_ERROR(CheckCandidates(plan, in, call, own, stop, &outcome));
  }
  outcome.reference_us = Micros(absl::Now() - reference_start);
  stages.Mark("references and checks");
  // A product the device could not form was formed on the host.
  if (engine != nullptr && !engine->error().empty()) {
    absl::StrAppend(&outcome.reference_engine, " and ", kHostEngine, " after: ", engine->error());
  }
  outcome.rows = plan.rows;
  outcome.rows_total = plan.m;
  outcome.sample_seed = r.sample_seed;
  outcome.inputs_xxh3 = InputsDigest(r, plan, *call, w.xxh3);
  call->ReleaseInputs();
  call->Finish(outcome.timing);
  stages.Mark("inputs released");
  LogDebug(absl::StrCat("verify ", VerifyOperationName(plan.operation), " [", plan.m, ", ", plan.k,
                        "] x [", plan.v, ", ", plan.k, "]:", stages.text(), " (",
                        outcome.reference_engine, ")"));
  return outcome;
}

}  // namespace logitd::service
