// The service's methods in one table: for each logitd.v1 method, whether it
// needs the device, and for a tensor call the tensors its header sends and
// its result returns (their names in the proto), the operation Verify
// checks it as, and how any front door runs it. The methods a front door
// serves itself (weights, history, Verify) are listed in operations.cc; a
// tensor operation registers its row from its own file in call/
// (LOGITD_OPERATION), which holds all of it: the request read from the
// request's fields (request_fields.h), the plan, the slots and the backend
// kernel. What the layers that dispatch on methods read instead of listing
// them again: logitd.v1 serves every row with a `run` (v1/tensor_methods.h),
// the runner checks a lost device by `uses_device`
// (transport/call_runner.cc), Verify takes its outputs (verify_plan.cc).
// tests/service/server_state_test.cc holds the table to the proto, so a
// method added without its row, or a tensor without its name here, fails
// there. Proto-free, as the rest of call/.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/service/call/ops.h"
#include "server/service/call/request.h"
#include "server/service/call/request_fields.h"

namespace logitd::service {

// A tensor operation's run: its request read from `fields`, then planned
// and run as every front door runs it (ops.h).
using OperationRun = absl::StatusOr<OpResult> (*)(const OpEnv& env, RequestFields& fields,
                                                  Call* call, Transport& transport);

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
  // A tensor operation of its own file: how it runs. Null for a method a
  // front door serves itself.
  OperationRun run = nullptr;
  // Its request read from `fields` and nothing run: the status of a field
  // the operation names and the request type lacks (tests read every row's
  // request from its method's header type).
  absl::Status (*read)(RequestFields& fields) = nullptr;
};

// Every method of logitd.v1.Logitd: the listed ones in the proto's order,
// then the registered ones by name.
absl::Span<const OperationInfo> Operations();
// The row of `method` (logitd.v1's name, "Logits"); null for none.
const OperationInfo* FindOperation(absl::string_view method);
// The row of the method Verify checks as `operation`; null for none.
const OperationInfo* FindVerifiable(VerifyOperation operation);

// Adds a tensor operation's row (before main; LOGITD_OPERATION). Its spans
// must outlive the process: constexpr arrays of the operation's file.
bool RegisterOperation(const OperationInfo& row);

// The row of a tensor operation whose request struct `Request` is read by
// `From(RequestFields&)` and run by `Run(env, request, call, transport)`.
template <typename Request, absl::StatusOr<Request> (*From)(RequestFields&),
          absl::StatusOr<OpResult> (*Run)(const OpEnv&, const Request&, Call*, Transport&)>
OperationInfo TensorOperation(absl::string_view method, bool uses_device,
                              absl::Span<const absl::string_view> inputs,
                              absl::Span<const absl::string_view> outputs,
                              std::optional<VerifyOperation> verify) {
  OperationInfo row{method, uses_device, inputs, outputs, verify};
  row.run = [](const OpEnv& env, RequestFields& fields, Call* call,
               Transport& transport) -> absl::StatusOr<OpResult> {
    absl::StatusOr<Request> request = From(fields);
    if (absl::Status s = fields.status(); !s.ok()) return s;
    if (!request.ok()) return request.status();
    return Run(env, *request, call, transport);
  };
  row.read = [](RequestFields& fields) -> absl::Status {
    absl::StatusOr<Request> request = From(fields);
    if (absl::Status s = fields.status(); !s.ok()) return s;
    return request.status();
  };
  return row;
}

}  // namespace logitd::service

// Registers an operation's row from its file in call/:
//   LOGITD_OPERATION(Logits, TensorOperation<LogitsRequest, &LogitsRequestFrom, &RunLogits>(
//                                "Logits", true, kInputs, kOutputs, VerifyOperation::kLogits));
// The service's core is linked whole, so a file nothing names registers.
#define LOGITD_OPERATION(name, row)                            \
  [[maybe_unused]] static const bool logitd_operation_##name = \
      ::logitd::service::RegisterOperation(row)
