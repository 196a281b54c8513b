#include "server/service/v1/requests.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "logitd/status_macros.h"

namespace logitd::service {
namespace {

// The slice a ShmRef names, as the service's shared memory takes it.
ShmRef RefOf(const v1::ShmRef& ref) { return ShmRef{ref.region(), ref.offset(), ref.bytes()}; }

// A present spec as a call input, from the chunks that follow the header
// or from its shared-memory slot.
CallInput InputOf(const v1::TensorSpec& spec, const v1::ShmRef* shm_ref, const V1Shm& shm) {
  CallInput in;
  in.given = true;
  in.name = spec.name();
  in.dtype = ProtoDTypeName(spec.dtype());
  in.shape.assign(spec.shape().begin(), spec.shape().end());
  // 0: it follows the chunks (TensorDigest), and reaches the slot with them.
  if (spec.xxh3() != 0) in.xxh3 = spec.xxh3();
  if (shm_ref != nullptr) {
    in.from = CallInput::From::kShm;
    in.shm = [registry = shm.registry, tenant = shm.tenant, ref = RefOf(*shm_ref)](
                 absl::string_view what, std::uint64_t bytes, bool is_output, std::uint64_t align) {
      return registry->Resolve(tenant, what, ref, bytes, is_output, align);
    };
  }
  return in;
}

// A required input: its spec checked, then translated.
absl::StatusOr<CallInput> Required(absl::string_view what, bool present, const v1::TensorSpec& spec,
                                   bool has_shm, const v1::ShmRef& shm_ref, const V1Shm& shm) {
  LOGITD_RETURN_IF_ERROR(CheckRequestSpec(what, present, spec, /*streamed=*/!has_shm));
  return InputOf(spec, has_shm ? &shm_ref : nullptr, shm);
}

// A second input beside x (dy, targets) is named apart from it: each chunk
// names the tensor it belongs to.
absl::Status NamedApart(absl::string_view what, const CallInput& in, const CallInput& x) {
  if (in.name != x.name) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ", x: expected distinct TensorSpec names, both are '", in.name, "'"));
}

// An output's shared-memory slot, when the header gives one.
void OutputSlot(CallOutputs* outputs, absl::string_view name, bool has_shm,
                const v1::ShmRef& shm_ref, const V1Shm& shm) {
  if (!has_shm) return;
  (*outputs)[std::string(name)].shm =
      [registry = shm.registry, tenant = shm.tenant, ref = RefOf(shm_ref)](
          absl::string_view what, std::uint64_t bytes, bool is_output, std::uint64_t align) {
        return registry->Resolve(tenant, what, ref, bytes, is_output, align);
      };
}

// An output dtype field: "" when unspecified.
std::string OutputDTypeName(v1::DType dtype) {
  return dtype == v1::DTYPE_UNSPECIFIED ? std::string() : ProtoDTypeName(dtype);
}

}  // namespace

std::string ProtoDTypeName(v1::DType dtype) {
  const std::string& name = v1::DType_Name(dtype);
  if (name.empty()) return absl::StrCat("unknown dtype ", static_cast<int>(dtype));
  absl::string_view n = name;
  if (absl::StartsWith(n, "DTYPE_")) n.remove_prefix(6);
  return std::string(n);
}

absl::Status CheckRequestSpec(absl::string_view what, bool present, const v1::TensorSpec& spec,
                              bool streamed) {
  if (!present) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the header has no TensorSpec"));
  }
  if (spec.name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": TensorSpec.name is empty (chunks name the tensor they belong to)"));
  }
  if (spec.xxh3() == 0 && !streamed) {
    // 0 means "the digest follows the chunks", which only a streamed
    // tensor has.
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": TensorSpec.xxh3 is 0; this tensor's spec carries the xxh3-64 (seed 0) of its bytes "
        "(only a streamed tensor of a call may send it after its chunks, as a TensorDigest)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LogitsRequest> LogitsRequestOf(const v1::LogitsHeader& h, const V1Shm& shm) {
  LogitsRequest r;
  r.weight_handle = h.weight_handle();
  LOGITD_ASSIGN_OR_RETURN(r.x, Required("x", h.has_x(), h.x(), h.has_x_shm(), h.x_shm(), shm));
  r.out_dtype = OutputDTypeName(h.out_dtype());
  r.alpha = h.alpha();
  OutputSlot(&r.outputs, "y", h.has_y_shm(), h.y_shm(), shm);
  return r;
}

absl::StatusOr<BackwardRequest> BackwardRequestOf(const v1::BackwardHeader& h, const V1Shm& shm) {
  BackwardRequest r;
  r.weight_handle = h.weight_handle();
  r.want_dx = h.want_dx();
  r.want_dw = h.want_dw();
  r.accumulate_dw = h.accumulate_dw();
  LOGITD_ASSIGN_OR_RETURN(r.x, Required("x", h.has_x(), h.x(), h.has_x_shm(), h.x_shm(), shm));
  LOGITD_ASSIGN_OR_RETURN(r.dy,
                          Required("dy", h.has_dy(), h.dy(), h.has_dy_shm(), h.dy_shm(), shm));
  LOGITD_RETURN_IF_ERROR(NamedApart("dy", r.dy, r.x));
  r.dx_dtype = OutputDTypeName(h.dx_dtype());
  r.dw_dtype = OutputDTypeName(h.dw_dtype());
  OutputSlot(&r.outputs, "dx", h.has_dx_shm(), h.dx_shm(), shm);
  OutputSlot(&r.outputs, "dw", h.has_dw_shm(), h.dw_shm(), shm);
  return r;
}

absl::StatusOr<CastRequest> CastRequestOf(const v1::CastHeader& h, const V1Shm& shm) {
  CastRequest r;
  LOGITD_ASSIGN_OR_RETURN(
      r.input, Required("input", h.has_input(), h.input(), h.has_input_shm(), h.input_shm(), shm));
  OutputSlot(&r.outputs, "output", h.has_output_shm(), h.output_shm(), shm);
  return r;
}

namespace {

// A reduction as the call layer names it; *unknown receives a value this
// build does not know (refused by the plan, naming it).
Reduction ReductionOf(v1::Reduction reduction, std::string* unknown) {
  switch (reduction) {
    case v1::REDUCTION_UNSPECIFIED:
      return Reduction::kUnspecified;
    case v1::REDUCTION_NONE:
      return Reduction::kNone;
    case v1::REDUCTION_SUM:
      return Reduction::kSum;
    case v1::REDUCTION_MEAN:
      return Reduction::kMean;
    default:
      *unknown = absl::StrCat(static_cast<int>(reduction));
      return Reduction::kUnspecified;
  }
}

}  // namespace

absl::StatusOr<CrossEntropyRequest> CrossEntropyRequestOf(const v1::CrossEntropyHeader& h,
                                                          const V1Shm& shm) {
  CrossEntropyRequest r;
  r.weight_handle = h.weight_handle();
  r.want_lse = h.want_lse();
  r.want_dx = h.want_dx();
  r.want_dw = h.want_dw();
  r.accumulate_dw = h.accumulate_dw();
  LOGITD_ASSIGN_OR_RETURN(r.x, Required("x", h.has_x(), h.x(), h.has_x_shm(), h.x_shm(), shm));
  LOGITD_ASSIGN_OR_RETURN(r.targets, Required("targets", h.has_targets(), h.targets(),
                                              h.has_targets_shm(), h.targets_shm(), shm));
  LOGITD_RETURN_IF_ERROR(NamedApart("targets", r.targets, r.x));
  if (h.has_ignore_index()) r.ignore_index = h.ignore_index();
  r.reduction = ReductionOf(h.reduction(), &r.reduction_unknown);
  r.z_loss = h.z_loss();
  r.logit_softcap = h.logit_softcap();
  r.grad_scale = h.grad_scale();
  r.dx_dtype = OutputDTypeName(h.dx_dtype());
  for (const auto& [name, has, ref] : {std::make_tuple("loss", h.has_loss_shm(), &h.loss_shm()),
                                       std::make_tuple("lse", h.has_lse_shm(), &h.lse_shm()),
                                       std::make_tuple("dx", h.has_dx_shm(), &h.dx_shm()),
                                       std::make_tuple("dw", h.has_dw_shm(), &h.dw_shm())}) {
    OutputSlot(&r.outputs, name, has, *ref, shm);
  }
  return r;
}

absl::StatusOr<LogProbsRequest> LogProbsRequestOf(const v1::LogProbsHeader& h, const V1Shm& shm) {
  LogProbsRequest r;
  r.weight_handle = h.weight_handle();
  LOGITD_ASSIGN_OR_RETURN(r.x, Required("x", h.has_x(), h.x(), h.has_x_shm(), h.x_shm(), shm));
  if (h.has_targets()) {
    LOGITD_ASSIGN_OR_RETURN(r.targets, Required("targets", true, h.targets(), h.has_targets_shm(),
                                                h.targets_shm(), shm));
    LOGITD_RETURN_IF_ERROR(NamedApart("targets", r.targets, r.x));
  } else if (h.has_targets_shm()) {
    // A slot for targets the header does not have: the plan refuses it.
    r.targets = InputOf(h.targets(), &h.targets_shm(), shm);
    r.targets.given = false;
  }
  if (h.has_ignore_index()) r.ignore_index = h.ignore_index();
  r.temperature = h.temperature();
  r.logit_softcap = h.logit_softcap();
  r.vocab_size = h.vocab_size();
  r.top_k = static_cast<std::int64_t>(h.top_k());
  r.want_entropy = h.want_entropy();
  r.want_lse = h.want_lse();
  r.want_rank = h.want_rank();
  for (const auto& [name, has, ref] :
       {std::make_tuple("logprob", h.has_logprob_shm(), &h.logprob_shm()),
        std::make_tuple("lse", h.has_lse_shm(), &h.lse_shm()),
        std::make_tuple("entropy", h.has_entropy_shm(), &h.entropy_shm()),
        std::make_tuple("topk_ids", h.has_topk_ids_shm(), &h.topk_ids_shm()),
        std::make_tuple("topk_logprobs", h.has_topk_logprobs_shm(), &h.topk_logprobs_shm()),
        std::make_tuple("rank", h.has_rank_shm(), &h.rank_shm())}) {
    OutputSlot(&r.outputs, name, has, *ref, shm);
  }
  return r;
}

namespace {

// The cross-entropy's or LogProbs' options a Verify carries in their own
// headers (the rest of those headers is not read).
// The fields of `options` that are set (proto3: different from their
// defaults), by name.
std::vector<std::string> SetFields(const google::protobuf::Message& options) {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  options.GetReflection()->ListFields(options, &fields);
  std::vector<std::string> names;
  for (const google::protobuf::FieldDescriptor* f : fields) names.push_back(f->name());
  return names;
}

// Options the operation does not read are refused, by name: another
// operation's options block, or a field of the operation's own block that
// Verify does not take from it (its tensors, wants, weight and shared
// memory are the Verify header's).
absl::Status CheckUnreadOptions(const v1::VerifyHeader& h, VerifyOperation op,
                                const std::string& op_name) {
  const auto refuse = [&](const std::string& block, const std::vector<std::string>& fields,
                          const std::vector<std::string>& read) -> absl::Status {
    for (const std::string& f : fields) {
      if (std::find(read.begin(), read.end(), f) != read.end()) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          block, ".", f, ": given, but ", op_name, " does not read it",
          read.empty() ? absl::StrCat(" (it reads no ", block, " options)")
                       : absl::StrCat(" (it reads ", block, ".", absl::StrJoin(read, ", "),
                                      "; tensors, the weight and shared memory come in the "
                                      "Verify header)")));
    }
    return absl::OkStatus();
  };
  const std::vector<std::string> ce_read = {"ignore_index", "reduction", "z_loss", "logit_softcap",
                                            "grad_scale"};
  const std::vector<std::string> lp_read = {"ignore_index", "temperature", "logit_softcap",
                                            "vocab_size"};
  if (h.has_cross_entropy()) {
    LOGITD_RETURN_IF_ERROR(
        refuse("cross_entropy", SetFields(h.cross_entropy()),
               op == VerifyOperation::kCrossEntropy ? ce_read : std::vector<std::string>{}));
  }
  if (h.has_logprobs()) {
    LOGITD_RETURN_IF_ERROR(
        refuse("logprobs", SetFields(h.logprobs()),
               op == VerifyOperation::kLogProbs ? lp_read : std::vector<std::string>{}));
  }
  return absl::OkStatus();
}

void OperationOptionsOf(const v1::VerifyHeader& h, VerifyRequest* out) {
  VerifyRequest& r = *out;
  if (r.operation == VerifyOperation::kCrossEntropy) {
    const v1::CrossEntropyHeader& o = h.cross_entropy();
    CrossEntropyRequest& ce = r.cross_entropy;
    if (o.has_ignore_index()) ce.ignore_index = o.ignore_index();
    ce.reduction = ReductionOf(o.reduction(), &ce.reduction_unknown);
    ce.z_loss = o.z_loss();
    ce.logit_softcap = o.logit_softcap();
    ce.grad_scale = o.grad_scale();
  }
  if (r.operation == VerifyOperation::kLogProbs) {
    const v1::LogProbsHeader& o = h.logprobs();
    LogProbsRequest& lp = r.logprobs;
    if (o.has_ignore_index()) lp.ignore_index = o.ignore_index();
    lp.temperature = o.temperature();
    lp.logit_softcap = o.logit_softcap();
    lp.vocab_size = o.vocab_size();
  }
}

}  // namespace

absl::StatusOr<VerifyRequest> VerifyRequestOf(const v1::VerifyHeader& h, const V1Shm& shm) {
  VerifyRequest r;
  switch (h.operation()) {
    case v1::VERIFY_OPERATION_UNSPECIFIED:
      r.operation = VerifyOperation::kUnspecified;
      break;
    case v1::VERIFY_LOGITS:
      r.operation = VerifyOperation::kLogits;
      break;
    case v1::VERIFY_BACKWARD:
      r.operation = VerifyOperation::kBackward;
      break;
    case v1::VERIFY_CROSS_ENTROPY:
      r.operation = VerifyOperation::kCrossEntropy;
      break;
    case v1::VERIFY_LOGPROBS:
      r.operation = VerifyOperation::kLogProbs;
      break;
    default:
      r.operation = VerifyOperation::kUnknown;
      break;
  }
  r.operation_name = v1::VerifyOperation_Name(h.operation());
  if (r.operation_name.empty()) {
    r.operation_name = absl::StrCat("unknown operation ", static_cast<int>(h.operation()));
  }
  // An operation not served is refused as such (call/verify.h), before
  // anything about its tensors.
  if (r.operation == VerifyOperation::kUnspecified || r.operation == VerifyOperation::kUnknown) {
    return r;
  }
  LOGITD_RETURN_IF_ERROR(CheckUnreadOptions(h, r.operation, r.operation_name));
  OperationOptionsOf(h, &r);
  // Slots by name; each one used is taken off, and any left over names a
  // tensor the header does not have.
  std::map<std::string, const v1::ShmRef*> slots;
  for (const auto& [name, ref] : h.shm()) slots[name] = &ref;
  const auto input = [&](absl::string_view what, bool present,
                         const v1::TensorSpec& spec) -> absl::StatusOr<CallInput> {
    auto it = slots.find(std::string(what));
    const v1::ShmRef* ref = it == slots.end() ? nullptr : it->second;
    if (it != slots.end()) slots.erase(it);
    LOGITD_RETURN_IF_ERROR(CheckRequestSpec(what, present, spec, /*streamed=*/ref == nullptr));
    return InputOf(spec, ref, shm);
  };
  r.weight_handle = h.weight_handle();
  if (h.has_w()) {
    LOGITD_ASSIGN_OR_RETURN(r.w, input("w", true, h.w()));
  }
  LOGITD_ASSIGN_OR_RETURN(r.x, input("x", h.has_x(), h.x()));
  if (h.has_dy()) {
    LOGITD_ASSIGN_OR_RETURN(r.dy, input("dy", true, h.dy()));
  }
  if (h.has_targets()) {
    LOGITD_ASSIGN_OR_RETURN(r.targets, input("targets", true, h.targets()));
  }
  r.alpha = h.alpha();
  r.sample_rows = h.sample_rows();
  r.sample_seed = h.sample_seed();
  r.block_digests = h.has_record();
  for (const v1::TensorSpec& spec : h.candidates()) {
    LOGITD_ASSIGN_OR_RETURN(CallInput c,
                            input(spec.name().empty() ? "candidates" : spec.name(), true, spec));
    r.candidates.push_back(std::move(c));
  }
  if (!slots.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm: '", slots.begin()->first,
                     "' names no tensor of this call (x, dy, w, targets, or a candidate's name)"));
  }
  return r;
}

}  // namespace logitd::service
