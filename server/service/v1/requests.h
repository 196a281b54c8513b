// logitd.v1's tensor-call headers read as the protocol-neutral requests of
// call/request.h, with the checks only this wire has: every tensor the call
// needs has a TensorSpec with a name (its chunks name it) and an xxh3 (a
// request's digest is always sent), and the names of one call's inputs
// differ. Its shared-memory slots resolve through the service's RegisterShm
// regions, for the caller's tenant. An operation's header is read by its
// fields' names (V1RequestFields), so no operation has a translation here;
// Verify's header, which names its tensors by slot, has its own.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "logitd/v1/logitd.pb.h"
#include "server/service/call/request.h"
#include "server/service/call/request_fields.h"
#include "server/service/state/registry.h"
#include "server/service/state/shm.h"

namespace logitd::service {

// Where a request's shared-memory slots resolve.
struct V1Shm {
  const ShmRegistry* registry = nullptr;
  Tenant tenant;
};

// A header's fields read by name through protobuf's reflection, for an
// operation's own file in call/ (request_fields.h): a TensorSpec field is an
// input, checked as CheckRequestSpec says, with its slot the ShmRef field
// "<name>_shm"; an output's slot is the ShmRef field "<output>_shm". A field
// the header does not have, or of another type, is remembered for status().
class V1RequestFields final : public RequestFields {
 public:
  V1RequestFields(const google::protobuf::Message& header, const V1Shm& shm)
      : header_(header), shm_(shm) {}

  std::string String(absl::string_view field) override;
  float Float(absl::string_view field) override;
  std::int64_t Int(absl::string_view field) override;
  bool Bool(absl::string_view field) override;
  std::optional<std::int64_t> OptionalInt(absl::string_view field) override;
  std::string Enum(absl::string_view field) override;
  std::string DType(absl::string_view field) override;
  absl::StatusOr<CallInput> Input(absl::string_view name) override;
  absl::StatusOr<CallInput> OptionalInput(absl::string_view name) override;
  CallOutputs Outputs(absl::Span<const absl::string_view> names) override;
  absl::Status status() const override { return status_; }

 private:
  // The field `name` of one of `types`; null (and status() says so) for none.
  const google::protobuf::FieldDescriptor* Field(
      absl::string_view name,
      std::initializer_list<google::protobuf::FieldDescriptor::CppType> types);
  // The ShmRef field "<name>_shm" when the header sets it; null otherwise.
  const v1::ShmRef* Slot(absl::string_view name);
  absl::StatusOr<CallInput> ReadInput(absl::string_view name, bool required);

  const google::protobuf::Message& header_;
  const V1Shm shm_;
  absl::Status status_;
  // The inputs read so far, for their names to differ.
  std::vector<std::pair<std::string, std::string>> read_;
};

// An operation's request read from its header by `from` (call/ops.h).
template <typename Request>
absl::StatusOr<Request> RequestOf(absl::StatusOr<Request> (*from)(RequestFields&),
                                  const google::protobuf::Message& header, const V1Shm& shm) {
  V1RequestFields fields(header, shm);
  absl::StatusOr<Request> request = from(fields);
  if (absl::Status s = fields.status(); !s.ok()) return s;
  return request;
}

// Verify's header: the weight by handle or streamed, the inputs, the
// candidates (each named as the operation names its output), and the
// shared-memory slots of any of them by name; a slot for a tensor the
// header does not have is refused, naming it.
absl::StatusOr<VerifyRequest> VerifyRequestOf(const v1::VerifyHeader& header, const V1Shm& shm);

// A TensorSpec's dtype as requests spell it: "FP32", or "unknown dtype 17"
// for a value this build does not know.
std::string ProtoDTypeName(v1::DType dtype);

// The header's checks of a request tensor: present, named, with a digest
// unless it is `streamed` (its digest may then follow its chunks).
absl::Status CheckRequestSpec(absl::string_view what, bool present, const v1::TensorSpec& spec,
                              bool streamed);

}  // namespace logitd::service
