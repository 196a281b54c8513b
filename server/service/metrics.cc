#include "server/service/metrics.h"

#include <civetweb.h>

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/service/logging.h"

namespace logitd::service {

const std::vector<double>& RequestDurationBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1,      2.5,     5,      10,    30,     60};
  return kBuckets;
}

Metrics::Metrics(const MetricsBuildInfo& build, const std::vector<std::string>& rpcs)
    : registry_(std::make_shared<prometheus::Registry>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("logitd_requests_total")
                   .Help("logitd.v1.Logitd calls finished, by method and gRPC status code.")
                   .Register(*registry_);
  duration_ = &prometheus::BuildHistogram()
                   .Name("logitd_request_duration_seconds")
                   .Help(
                       "Duration of logitd.v1.Logitd calls, from the handler's start to its "
                       "status, by method.")
                   .Register(*registry_);
  bytes_received_ = &prometheus::BuildCounter()
                         .Name("logitd_bytes_received_total")
                         .Help("Tensor payload bytes received in chunks, by method.")
                         .Register(*registry_);
  bytes_sent_ = &prometheus::BuildCounter()
                     .Name("logitd_bytes_sent_total")
                     .Help("Tensor payload bytes sent in chunks, by method.")
                     .Register(*registry_);
  weight_bytes_ = &prometheus::BuildGauge()
                       .Name("logitd_weight_bytes")
                       .Help(
                           "Bytes of registered weights (bf16) plus their fp32 gradient "
                           "buffers, as counted against --weight_budget_bytes.")
                       .Register(*registry_)
                       .Add({});
  weight_budget_bytes_ = &prometheus::BuildGauge()
                              .Name("logitd_weight_budget_bytes")
                              .Help("--weight_budget_bytes: the most logitd_weight_bytes may be.")
                              .Register(*registry_)
                              .Add({});
  weights_ = &prometheus::BuildGauge()
                  .Name("logitd_weights")
                  .Help("Distinct weights registered.")
                  .Register(*registry_)
                  .Add({});
  inflight_ = &prometheus::BuildGauge()
                   .Name("logitd_inflight_requests")
                   .Help("logitd.v1.Logitd calls running now.")
                   .Register(*registry_)
                   .Add({});
  prometheus::BuildGauge()
      .Name("logitd_build_info")
      .Help("Always 1; the labels say which logitd, backend and device serve.")
      .Register(*registry_)
      .Add({{"version", build.version}, {"backend", build.backend}, {"device", build.device}})
      .Set(1);
  absl::MutexLock lock(&mutex_);
  for (const std::string& rpc : rpcs) {
    ForRpc(rpc);
    requests_->Add({{"rpc", rpc}, {"code", "OK"}});
  }
}

Metrics::~Metrics() = default;

Metrics::PerRpc& Metrics::ForRpc(absl::string_view rpc) {
  auto it = rpcs_.find(rpc);
  if (it != rpcs_.end()) return it->second;
  const std::string name(rpc);
  PerRpc per;
  per.duration = &duration_->Add({{"rpc", name}}, RequestDurationBuckets());
  per.bytes_received = &bytes_received_->Add({{"rpc", name}});
  per.bytes_sent = &bytes_sent_->Add({{"rpc", name}});
  return rpcs_.emplace(name, per).first->second;
}

void Metrics::SetGaugeSource(std::function<MetricsGauges()> source) {
  const MetricsGauges now = source ? source() : MetricsGauges{};
  absl::MutexLock lock(&mutex_);
  gauge_source_ = std::move(source);
  if (now.device_total_bytes > 0 && device_in_use_ == nullptr) {
    prometheus::Family<prometheus::Gauge>& family =
        prometheus::BuildGauge()
            .Name("logitd_device_memory_bytes")
            .Help(
                "Device memory: in_use is what the backend allocated itself (weights, "
                "gradients, workspaces, scratch); total is the device's memory.")
            .Register(*registry_);
    device_in_use_ = &family.Add({{"kind", "in_use"}});
    device_total_ = &family.Add({{"kind", "total"}});
  }
}

void Metrics::RecordCall(absl::string_view rpc, absl::string_view code, double seconds,
                         std::uint64_t tensor_bytes_in, std::uint64_t tensor_bytes_out) {
  PerRpc per;
  prometheus::Counter* requests = nullptr;
  {
    absl::MutexLock lock(&mutex_);
    per = ForRpc(rpc);
    // Family::Add returns the existing series for labels it already has.
    requests = &requests_->Add({{"rpc", std::string(rpc)}, {"code", std::string(code)}});
  }
  requests->Increment();
  per.duration->Observe(seconds);
  per.bytes_received->Increment(static_cast<double>(tensor_bytes_in));
  per.bytes_sent->Increment(static_cast<double>(tensor_bytes_out));
}

void Metrics::CallStarted() { inflight_->Increment(); }
void Metrics::CallFinished() { inflight_->Decrement(); }

void Metrics::UpdateGauges() {
  if (!gauge_source_) return;
  const MetricsGauges g = gauge_source_();
  weight_bytes_->Set(static_cast<double>(g.weight_bytes));
  weight_budget_bytes_->Set(static_cast<double>(g.weight_budget_bytes));
  weights_->Set(static_cast<double>(g.weights));
  if (device_in_use_ != nullptr) {
    device_in_use_->Set(static_cast<double>(g.device_in_use_bytes));
    device_total_->Set(static_cast<double>(g.device_total_bytes));
  }
}

std::string Metrics::Expose() {
  absl::MutexLock lock(&mutex_);
  UpdateGauges();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

namespace {

// civetweb's own messages (a failed bind, a broken connection) go to the log.
int LogCivetwebMessage(const struct mg_connection* /*conn*/, const char* message) {
  LogWarning(absl::StrCat("metrics endpoint: ", message != nullptr ? message : "(no message)"));
  return 1;
}

}  // namespace

absl::Status CheckMetricsAddress(absl::string_view address) {
  const std::size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535 ||
      absl::StartsWith(address, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_address: expected HOST:PORT with HOST an IP address and PORT in 0..65535 "
        "(e.g. 127.0.0.1:9464, 0.0.0.0:9464, [::1]:0), got '",
        address, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    absl::string_view address, Metrics* metrics) {
  if (absl::Status s = CheckMetricsAddress(address); !s.ok()) return s;
  static const unsigned init = mg_init_library(0);
  (void)init;

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->metrics_ = metrics;
  const std::string ports(address);
  const char* options[] = {
      "listening_ports", ports.c_str(),       "num_threads", "2",    "request_timeout_ms",
      "10000",           "enable_keep_alive", "no",          nullptr};
  struct mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = LogCivetwebMessage;
  struct mg_init_data init_data;
  std::memset(&init_data, 0, sizeof(init_data));
  init_data.callbacks = &callbacks;
  init_data.user_data = server.get();
  init_data.configuration_options = options;
  unsigned error_code = 0;
  char error_text[256] = {0};
  struct mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  server->context_ = mg_start2(&init_data, &error);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_address: cannot listen on ", address, ": ",
                     error_text[0] != '\0' ? error_text : "civetweb failed to start",
                     " (address in use, not local, or not permitted)"));
  }
  struct mg_server_port bound;
  std::memset(&bound, 0, sizeof(bound));
  if (mg_get_server_ports(server->context_, 1, &bound) != 1 || bound.port <= 0) {
    return absl::InternalError(
        absl::StrCat("--metrics_address: listening on ", address, " but the port is unknown"));
  }
  server->port_ = bound.port;
  mg_set_request_handler(server->context_, "/metrics$", &MetricsHttpServer::HandleMetrics,
                         server.get());
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (context_ != nullptr) mg_stop(context_);
}

int MetricsHttpServer::HandleMetrics(struct mg_connection* conn, void* self) {
  const struct mg_request_info* request = mg_get_request_info(conn);
  const absl::string_view method =
      request != nullptr && request->request_method != nullptr ? request->request_method : "";
  if (method != "GET" && method != "HEAD") {
    mg_send_http_error(conn, 405, "%s", "only GET and HEAD are served here\n");
    return 405;
  }
  const std::string body = static_cast<MetricsHttpServer*>(self)->metrics_->Expose();
  const std::string content_type(kMetricsContentType);
  mg_send_http_ok(conn, content_type.c_str(), static_cast<long long>(body.size()));
  if (method == "GET") mg_write(conn, body.data(), body.size());
  return 200;
}

}  // namespace logitd::service
