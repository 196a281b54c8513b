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
#include "server/service/call/ops.h"

namespace logitd::service {
namespace {

// The slice a ShmRef names, as the service's shared memory takes it.
ShmRef RefOf(const v1::ShmRef& ref) { return ShmRef{ref.region(), ref.offset(), ref.bytes()}; }

// A slot's resolver, through the service's regions for the caller's tenant.
ShmResolver ResolverOf(const v1::ShmRef& slot, const V1Shm& shm) {
  return [registry = shm.registry, tenant = shm.tenant, ref = RefOf(slot)](
             absl::string_view what, std::uint64_t bytes, bool is_output, std::uint64_t align) {
    return registry->Resolve(tenant, what, ref, bytes, is_output, align);
  };
}

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
    in.shm = ResolverOf(*shm_ref, shm);
  }
  return in;
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

using google::protobuf::FieldDescriptor;

const FieldDescriptor* V1RequestFields::Field(
    absl::string_view name, std::initializer_list<FieldDescriptor::CppType> types) {
  const FieldDescriptor* f = header_.GetDescriptor()->FindFieldByName(std::string(name));
  if (f != nullptr && !f->is_repeated() &&
      std::find(types.begin(), types.end(), f->cpp_type()) != types.end()) {
    return f;
  }
  if (status_.ok()) {
    status_ = absl::InternalError(absl::StrCat(header_.GetDescriptor()->full_name(),
                                               " has no field '", name, "' of the type asked for"));
  }
  return nullptr;
}

std::string V1RequestFields::String(absl::string_view name) {
  const FieldDescriptor* f = Field(name, {FieldDescriptor::CPPTYPE_STRING});
  return f == nullptr ? std::string() : header_.GetReflection()->GetString(header_, f);
}

float V1RequestFields::Float(absl::string_view name) {
  const FieldDescriptor* f = Field(name, {FieldDescriptor::CPPTYPE_FLOAT});
  return f == nullptr ? 0.0f : header_.GetReflection()->GetFloat(header_, f);
}

std::int64_t V1RequestFields::Int(absl::string_view name) {
  const FieldDescriptor* f =
      Field(name, {FieldDescriptor::CPPTYPE_INT32, FieldDescriptor::CPPTYPE_INT64,
                   FieldDescriptor::CPPTYPE_UINT32, FieldDescriptor::CPPTYPE_UINT64});
  if (f == nullptr) return 0;
  const google::protobuf::Reflection* r = header_.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return r->GetInt32(header_, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return r->GetUInt32(header_, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<std::int64_t>(r->GetUInt64(header_, f));
    default:
      return r->GetInt64(header_, f);
  }
}

bool V1RequestFields::Bool(absl::string_view name) {
  const FieldDescriptor* f = Field(name, {FieldDescriptor::CPPTYPE_BOOL});
  return f != nullptr && header_.GetReflection()->GetBool(header_, f);
}

std::optional<std::int64_t> V1RequestFields::OptionalInt(absl::string_view name) {
  const FieldDescriptor* f = header_.GetDescriptor()->FindFieldByName(std::string(name));
  if (f != nullptr && !f->has_presence()) {
    if (status_.ok()) {
      status_ = absl::InternalError(absl::StrCat(header_.GetDescriptor()->full_name(), ".", name,
                                                 " has no presence (declare it optional)"));
    }
    return std::nullopt;
  }
  if (f != nullptr && !header_.GetReflection()->HasField(header_, f)) return std::nullopt;
  const std::int64_t value = Int(name);  // a missing field is remembered
  if (f == nullptr) return std::nullopt;
  return value;
}

std::string V1RequestFields::Enum(absl::string_view name) {
  const FieldDescriptor* f = Field(name, {FieldDescriptor::CPPTYPE_ENUM});
  if (f == nullptr) return std::string();
  const int number = header_.GetReflection()->GetEnumValue(header_, f);
  const google::protobuf::EnumValueDescriptor* value = f->enum_type()->FindValueByNumber(number);
  return value == nullptr ? absl::StrCat(number) : value->name();
}

std::string V1RequestFields::DType(absl::string_view name) {
  const FieldDescriptor* f = Field(name, {FieldDescriptor::CPPTYPE_ENUM});
  if (f == nullptr) return std::string();
  const auto dtype = static_cast<v1::DType>(header_.GetReflection()->GetEnumValue(header_, f));
  return dtype == v1::DTYPE_UNSPECIFIED ? std::string() : ProtoDTypeName(dtype);
}

const v1::ShmRef* V1RequestFields::Slot(absl::string_view name) {
  const std::string field = absl::StrCat(name, "_shm");
  const FieldDescriptor* f = header_.GetDescriptor()->FindFieldByName(field);
  if (f == nullptr || f->message_type() != v1::ShmRef::descriptor()) return nullptr;
  if (!header_.GetReflection()->HasField(header_, f)) return nullptr;
  return static_cast<const v1::ShmRef*>(&header_.GetReflection()->GetMessage(header_, f));
}

absl::StatusOr<CallInput> V1RequestFields::ReadInput(absl::string_view name, bool required) {
  const FieldDescriptor* f = Field(name, {FieldDescriptor::CPPTYPE_MESSAGE});
  if (f == nullptr) return CallInput();
  if (f->message_type() != v1::TensorSpec::descriptor()) {
    status_ = absl::InternalError(
        absl::StrCat(header_.GetDescriptor()->full_name(), ".", name, " is not a TensorSpec"));
    return CallInput();
  }
  const google::protobuf::Reflection* r = header_.GetReflection();
  const bool present = r->HasField(header_, f);
  const auto& spec = static_cast<const v1::TensorSpec&>(r->GetMessage(header_, f));
  const v1::ShmRef* slot = Slot(name);
  if (!present && !required) {
    if (slot == nullptr) return CallInput();
    // A slot for a tensor the header does not have: the plan refuses it.
    CallInput in = InputOf(spec, slot, shm_);
    in.given = false;
    return in;
  }
  LOGITD_RETURN_IF_ERROR(CheckRequestSpec(name, present, spec, /*streamed=*/slot == nullptr));
  CallInput in = InputOf(spec, slot, shm_);
  // Each chunk names the tensor it belongs to.
  for (const auto& [other, other_name] : read_) {
    if (other_name == in.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ", ", other, ": expected distinct TensorSpec names, both are '", in.name, "'"));
    }
  }
  read_.emplace_back(std::string(name), in.name);
  return in;
}

absl::StatusOr<CallInput> V1RequestFields::Input(absl::string_view name) {
  return ReadInput(name, /*required=*/true);
}

absl::StatusOr<CallInput> V1RequestFields::OptionalInput(absl::string_view name) {
  return ReadInput(name, /*required=*/false);
}

CallOutputs V1RequestFields::Outputs(absl::Span<const absl::string_view> names) {
  CallOutputs outputs;
  for (absl::string_view name : names) {
    const v1::ShmRef* slot = Slot(name);
    if (slot == nullptr) continue;
    outputs[std::string(name)].shm = ResolverOf(*slot, shm_);
  }
  return outputs;
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

void OperationOptionsOf(const v1::VerifyHeader& h, VerifyRequest* r) {
  if (r->operation == VerifyOperation::kCrossEntropy) {
    V1RequestFields fields(h.cross_entropy(), V1Shm{});
    CrossEntropyOptionsFrom(fields, &r->cross_entropy);
  }
  if (r->operation == VerifyOperation::kLogProbs) {
    V1RequestFields fields(h.logprobs(), V1Shm{});
    LogProbsOptionsFrom(fields, &r->logprobs);
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
