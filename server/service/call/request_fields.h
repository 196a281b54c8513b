// A tensor call's request as a front door reads it, field by field: what an
// operation's own file in call/ (its registered row, operations.h) turns
// into its request struct, whatever the wire. logitd.v1 reads the fields of
// the method's header message by these names through protobuf's reflection
// (v1/request_fields.h), so an operation needs no translation of its own
// there: its fields are named as the proto names them. Proto-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/service/call/request.h"

namespace logitd::service {

class RequestFields {
 public:
  virtual ~RequestFields() = default;

  // Scalars by field name, as the request gave them (proto3: unset is
  // the type's zero).
  virtual std::string String(absl::string_view field) = 0;
  virtual float Float(absl::string_view field) = 0;
  virtual std::int64_t Int(absl::string_view field) = 0;
  virtual bool Bool(absl::string_view field) = 0;
  // A field with presence: nullopt when the request does not give it.
  virtual std::optional<std::int64_t> OptionalInt(absl::string_view field) = 0;
  // An enum's value by its name in the proto ("REDUCTION_MEAN"), or its
  // number ("7") for a value this build does not know.
  virtual std::string Enum(absl::string_view field) = 0;
  // An element type as requests spell it ("FP32", CallInput::dtype); empty
  // when unspecified.
  virtual std::string DType(absl::string_view field) = 0;

  // An input tensor, named as its field: the front door's own checks of it
  // (a logitd.v1 spec is named and carries a digest unless streamed, and
  // differs in name from the inputs read before it), then where its bytes
  // are. Required: a request without it is InvalidArgument. Optional: not
  // given (CallInput::given false) when absent; a shared-memory slot given
  // for it anyway is kept, for the plan to refuse.
  virtual absl::StatusOr<CallInput> Input(absl::string_view name) = 0;
  virtual absl::StatusOr<CallInput> OptionalInput(absl::string_view name) = 0;
  // The shared-memory slots the request gives for these outputs, by name.
  virtual CallOutputs Outputs(absl::Span<const absl::string_view> names) = 0;

  // OK, or the first field asked for that the request does not have (a
  // misnamed field in an operation's file: Internal, naming it).
  virtual absl::Status status() const = 0;
};

}  // namespace logitd::service
