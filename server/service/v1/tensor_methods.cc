#include "server/service/v1/tensor_methods.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <functional>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "logitd/service/tensor_call.pb.h"
#include "logitd/status_macros.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/v1/logitd.pb.h"
#include "server/service/transport/message_stream.h"
#include "server/service/v1/requests.h"

namespace logitd::service {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// The message type of `message`'s field `first` (number 1, in the oneof
// "part" beside chunk = 2 and digest = 3); Internal naming what differs.
absl::StatusOr<const Descriptor*> PartType(const Descriptor* message, absl::string_view first) {
  const FieldDescriptor* f = message->FindFieldByNumber(1);
  const FieldDescriptor* chunk = message->FindFieldByNumber(2);
  const FieldDescriptor* digest = message->FindFieldByNumber(3);
  const bool shaped =
      f != nullptr && f->name() == first && f->message_type() != nullptr && chunk != nullptr &&
      chunk->message_type() == v1::TensorChunk::descriptor() && digest != nullptr &&
      digest->message_type() == v1::TensorDigest::descriptor() &&
      f->containing_oneof() != nullptr && f->containing_oneof() == chunk->containing_oneof() &&
      f->containing_oneof() == digest->containing_oneof() && message->field_count() == 3;
  if (!shaped) {
    return absl::InternalError(absl::StrCat(
        message->full_name(), " is not a tensor call's message: expected oneof part { ... ", first,
        " = 1; TensorChunk chunk = 2; TensorDigest digest = 3; }"));
  }
  return f->message_type();
}

// TensorCallTypes of every row's method, worked out once.
const absl::StatusOr<AnyTypes>& RowTypes(absl::string_view method) {
  static const auto* const types = [] {
    auto* by_method = new std::map<std::string, absl::StatusOr<AnyTypes>, std::less<>>();
    for (const OperationInfo& op : Operations()) {
      if (op.run != nullptr) by_method->emplace(op.method, TensorCallTypes(op.method));
    }
    return by_method;
  }();
  static const absl::StatusOr<AnyTypes>* const none =
      new absl::StatusOr<AnyTypes>(absl::InternalError("a method of no operation's row"));
  const auto it = types->find(method);
  return it == types->end() ? *none : it->second;
}

}  // namespace

absl::StatusOr<AnyTypes> TensorCallTypes(absl::string_view method) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Logitd::service_full_name());
  const google::protobuf::MethodDescriptor* m =
      service == nullptr ? nullptr : service->FindMethodByName(std::string(method));
  if (m == nullptr) {
    return absl::InternalError(absl::StrCat("logitd.v1.Logitd has no method ", method));
  }
  if (!m->client_streaming() || !m->server_streaming()) {
    return absl::InternalError(absl::StrCat(method, " is not a bidirectional streaming method"));
  }
  LOGITD_ASSIGN_OR_RETURN(const Descriptor* header, PartType(m->input_type(), "header"));
  LOGITD_ASSIGN_OR_RETURN(const Descriptor* result, PartType(m->output_type(), "result"));
  google::protobuf::MessageFactory* factory = google::protobuf::MessageFactory::generated_factory();
  return AnyTypes{factory->GetPrototype(header), factory->GetPrototype(result),
                  m->input_type()->full_name()};
}

grpc::Status ServeOperation(const V1Env& env, const OperationInfo& op,
                            grpc::CallbackServerContext* context, RawStream* raw) {
  const absl::StatusOr<AnyTypes>& types = RowTypes(op.method);
  MessageStream<AnyTensorResponse, AnyTensorRequest> stream(
      raw, env.max_receive_message_bytes,
      types.ok() ? types->request : AnyTensorRequest::descriptor()->full_name());
  return env.runner->Run(op.method, context, [&](CallStats* stats) -> absl::Status {
    LOGITD_RETURN_IF_ERROR(types.status());
    TensorCall<AnyTensorRequest, AnyTensorResponse> call(env.tensor, op.method, context, &stream,
                                                         stats, *types);
    LOGITD_RETURN_IF_ERROR(call.ReadHeader());
    V1RequestFields fields(call.header(), V1Shm{env.shm, call.tenant()});
    LOGITD_ASSIGN_OR_RETURN(const OpResult result, op.run(env.op, fields, &call.call(), call));
    return call.Respond(result, DigestLastOf(call.header()));
  });
}

}  // namespace logitd::service
