// What every logitd.v1 call goes through, whatever it carries: the caller
// authenticated (and its tenant found), a lost device refused for the calls
// that need it, the timing trailers, the metrics and the log line.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/kernels/backend.h"
#include "server/service/call/stats.h"
#include "server/service/state/auth.h"
#include "server/service/state/metrics.h"

namespace logitd::service {

// Whether a call needs the backend's device, and so is refused with the
// cause once the device is lost. Every call does, except those that only
// read or forget the server's own records (server info, the weight list,
// releasing a weight or a region, registering a region, the transport
// probe) and the Open Inference Protocol's metadata calls ("oip.*" but
// ModelInfer). A new operation needs the device unless it is added here.
bool NeedsDevice(absl::string_view method);

// The body of a call: its status, with `stats` filled as it goes.
using CallBody = std::function<absl::Status(CallStats* stats)>;

// Runs call bodies. Not owning: the authenticator, backend and metrics
// outlive it.
class CallRunner {
 public:
  CallRunner(const Authenticator* auth, const kernels::Backend* backend, Metrics* metrics)
      : auth_(auth), backend_(backend), metrics_(metrics) {}

  // Authenticates the caller, refuses a call that needs a lost device, runs
  // `body`, then adds the trailers, records the call and logs it. The
  // returned status is the body's mapped to gRPC (status.h), CANCELLED when
  // the failure followed the client going away.
  grpc::Status Run(absl::string_view method, grpc::ServerContextBase* context,
                   const CallBody& body) const;

 private:
  const Authenticator* auth_;
  const kernels::Backend* backend_;
  Metrics* metrics_;
};

}  // namespace logitd::service
