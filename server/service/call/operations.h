// The service's methods in one table: for each logitd.v1 method, whether it
// needs the device, and for a tensor call the tensors its header sends and
// its result returns (their names in the proto) and, for one that Verify
// checks, the operation it checks it as. What the layers that dispatch on
// methods read instead of listing them again: the runner's check of a lost
// device (transport/call_runner.cc) and Verify's outputs (verify_plan.cc);
// tests/unit/operations_test.cc holds the table to the proto, so a method
// added without its row, or a tensor without its name here, fails there.
// Proto-free, as the rest of call/.
#pragma once

#include <optional>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/service/call/request.h"

namespace logitd::service {

struct OperationInfo {
  // The method of logitd.v1.Logitd.
  absl::string_view method;
  // Fails at once with the cause while the device is lost (UNAVAILABLE).
  bool uses_device = false;
  // The TensorSpec fields of its header (or request) and of its result (or
  // response), in the proto's order.
  absl::Span<const absl::string_view> inputs;
  absl::Span<const absl::string_view> outputs;
  // The operation Verify checks its outputs as; none: not verifiable.
  std::optional<VerifyOperation> verify;
};

// Every method of logitd.v1.Logitd, in the proto's order.
absl::Span<const OperationInfo> Operations();
// The row of `method` (logitd.v1's name, "Logits"); null for none.
const OperationInfo* FindOperation(absl::string_view method);
// The row of the method Verify checks as `operation`; null for none.
const OperationInfo* FindVerifiable(VerifyOperation operation);

}  // namespace logitd::service
