#include "server/service/transport/call_runner.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "logitd/wire/raw_call.h"
#include "server/service/call/operations.h"
#include "server/service/state/logging.h"
#include "server/service/state/status.h"

namespace logitd::service {
namespace {

constexpr std::size_t kMaxLoggedMessage = 300;

// The "logitd-timing" trailer: the measured parts only, in a fixed order.
std::string TimingTrailer(std::initializer_list<std::pair<absl::string_view, std::int64_t>> parts) {
  std::string out;
  for (const auto& [key, us] : parts) {
    if (us < 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ",", key, "=", us);
  }
  return out;
}

// Counts a call in logitd_inflight_requests while it runs.
class InflightCall {
 public:
  explicit InflightCall(Metrics* metrics) : metrics_(metrics) {
    if (metrics_ != nullptr) metrics_->CallStarted();
  }
  ~InflightCall() {
    if (metrics_ != nullptr) metrics_->CallFinished();
  }
  InflightCall(const InflightCall&) = delete;
  InflightCall& operator=(const InflightCall&) = delete;

 private:
  Metrics* metrics_;
};

}  // namespace

bool NeedsDevice(absl::string_view method) {
  if (absl::StartsWith(method, "oip.")) return method == "oip.ModelInfer";
  // logitd.v1's from the service's table; a method without a row is taken
  // as needing the device (operations_test.cc asks every method for one).
  const OperationInfo* op = FindOperation(method);
  return op == nullptr || op->uses_device;
}

grpc::Status CallRunner::Run(absl::string_view method, grpc::ServerContextBase* context,
                             const CallBody& body) const {
  const absl::Time start = absl::Now();
  const InflightCall inflight(metrics_);
  CallStats stats;
  // The one authentication step of every logitd.v1 call: the body runs only
  // for an authenticated caller, and acts for its tenant.
  absl::Status status;
  if (absl::StatusOr<Tenant> tenant = auth_->Authenticate(*context); !tenant.ok()) {
    status = tenant.status();
  } else if (absl::Status health = backend_->Health(); !health.ok() && NeedsDevice(method)) {
    // A lost device fails every call that needs it at once, with the cause;
    // UNAVAILABLE tells clients to retry (another replica, or this one
    // after its restart).
    status = health;
  } else {
    stats.tenant = *std::move(tenant);
    status = body(&stats);
  }
  const absl::Time end = absl::Now();
  const std::int64_t send_us = stats.send_start ? Micros(end - *stats.send_start) : -1;
  context->AddTrailingMetadata(std::string(wire::kTimingTrailer),
                               TimingTrailer({{"queue_us", stats.queue_us},
                                              {"receive_us", stats.receive_us},
                                              {"h2d_us", stats.h2d_us},
                                              {"compute_us", stats.compute_us},
                                              {"d2h_us", stats.d2h_us},
                                              {"send_us", send_us},
                                              {"total_us", Micros(end - start)},
                                              {"pipeline_rows", stats.pipeline_rows}}));
  if (!stats.gemms.empty()) {
    context->AddTrailingMetadata(std::string(wire::kGemmTrailer), stats.gemms);
  }
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled && context->IsCancelled()) {
    // The failure is a consequence of the client going away, not its cause.
    status = absl::CancelledError(
        absl::StrCat("call cancelled by the client or its deadline (", status.message(), ")"));
  }
  if (metrics_ != nullptr) {
    metrics_->RecordCall(method, absl::StatusCodeToString(status.code()),
                         absl::ToDoubleSeconds(end - start), stats.tensor_bytes_in,
                         stats.tensor_bytes_out);
  }
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    std::string line =
        absl::StrFormat("rpc=%s code=%s in=%d out=%d ms=%.3f peer=%s", method,
                        absl::StatusCodeToString(status.code()), stats.bytes_in, stats.bytes_out,
                        absl::ToDoubleMilliseconds(end - start), context->peer());
    if (auth_->tokens_enabled()) {
      absl::StrAppend(&line, " tenant=", stats.tenant.id.empty() ? "-" : stats.tenant.id);
    }
    if (!status.ok()) {
      absl::string_view msg = status.message();
      if (msg.size() > kMaxLoggedMessage) msg = msg.substr(0, kMaxLoggedMessage);
      absl::StrAppend(&line, " error=\"", msg, "\"");
    }
    Log(level, line);
  }
  return ToGrpcStatus(status);
}

}  // namespace logitd::service
