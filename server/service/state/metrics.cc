#include "server/service/state/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/service/state/logging.h"

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
  device_lost_ =
      &prometheus::BuildCounter()
           .Name("logitd_device_lost_total")
           .Help(
               "Times the device was found unusable (cause=fault: an error that poisoned the "
               "CUDA context; cause=hang: device work outlived --device_timeout). The server "
               "then stops serving and exits for its supervisor to restart it.")
           .Register(*registry_);
  RegisterHistoryFamilies();
  device_healthy_ = &prometheus::BuildGauge()
                         .Name("logitd_device_healthy")
                         .Help("1 while the backend's device can serve calls, 0 once it is lost.")
                         .Register(*registry_)
                         .Add({});
  device_healthy_->Set(1);
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

void Metrics::RegisterHistoryFamilies() {
  runs_recorded_ = &prometheus::BuildCounter()
                        .Name("logitd_history_runs_recorded_total")
                        .Help("Verify runs recorded in the server's history, by verdict.")
                        .Register(*registry_);
  compared_ = &prometheus::BuildCounter()
                   .Name("logitd_history_candidates_compared_total")
                   .Help(
                       "Candidates of recorded runs compared with a baseline run, by how their "
                       "bits compared (identical, different_within_bounds, "
                       "different_outside_bounds, new).")
                   .Register(*registry_);
  alerts_ = &prometheus::BuildCounter()
                 .Name("logitd_history_alerts_total")
                 .Help(
                     "Alerts raised by recorded runs that broke a rule of their project, by the "
                     "rule's check (bits_unchanged, max_worst_fraction_growth, max_p99_ulp).")
                 .Register(*registry_);
}

void Metrics::RecordRun(absl::string_view verdict, const std::vector<std::string>& compared_bits,
                        const std::vector<std::string>& alert_checks) {
  runs_recorded_->Add({{"verdict", std::string(verdict)}}).Increment();
  for (const std::string& bits : compared_bits) compared_->Add({{"bits", bits}}).Increment();
  for (const std::string& check : alert_checks) alerts_->Add({{"check", check}}).Increment();
}

void Metrics::RecordDeviceLost(absl::string_view cause) {
  device_lost_->Add({{"cause", std::string(cause)}}).Increment();
  device_healthy_->Set(0);
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

namespace {

// A connection's peer as gRPC names one ("ipv4:127.0.0.1:PORT",
// "ipv6:[::1]:PORT"), for the same loopback rule.
std::string PeerOf(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (info == nullptr || info->client_addr == nullptr) return "unknown";
  char text[INET6_ADDRSTRLEN] = {0};
  if (info->client_addr->sa_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(info->client_addr);
    inet_ntop(AF_INET, &in4->sin_addr, text, sizeof text);
    return absl::StrCat("ipv4:", text, ":", ntohs(in4->sin_port));
  }
  if (info->client_addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(info->client_addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return absl::StrCat("ipv6:[", text, "]:", ntohs(in6->sin6_port));
  }
  return "unknown";
}

MHD_Result AddQueryValue(void* cls, MHD_ValueKind /*kind*/, const char* key, const char* value) {
  if (key != nullptr)
    (*static_cast<std::map<std::string, std::string>*>(cls))[key] = value ? value : "";
  return MHD_YES;
}

// /metrics, and the pages under /history when the server has them;
// anything else is 404, any method but GET/HEAD 405.
MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/,
                         std::size_t* /*upload_data_size*/, void** /*con_cls*/) {
  const auto* handlers = static_cast<const MetricsHttpServer::Handlers*>(cls);
  HttpAnswer answer;
  answer.content_type = std::string(kMetricsContentType);
  const absl::string_view m = method != nullptr ? method : "";
  const absl::string_view path = url != nullptr ? url : "";
  const bool history =
      handlers->pages != nullptr && (path == "/history" || absl::StartsWith(path, "/history/"));
  if (m != "GET" && m != "HEAD") {
    answer = {MHD_HTTP_METHOD_NOT_ALLOWED,
              "text/plain; charset=utf-8",
              "only GET and HEAD are served here\n",
              {{MHD_HTTP_HEADER_ALLOW, "GET, HEAD"}}};
  } else if (history) {
    HttpRequest request;
    request.path = std::string(path);
    MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, &AddQueryValue, &request.query);
    if (const char* auth = MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_AUTHORIZATION)) {
      request.authorization = auth;
    }
    request.peer = PeerOf(connection);
    answer = handlers->pages(request);
  } else if (path != "/metrics") {
    answer = {MHD_HTTP_NOT_FOUND,
              "text/plain; charset=utf-8",
              handlers->pages != nullptr
                  ? "not found: metrics are served at /metrics, the history's pages at /history\n"
                  : "not found: metrics are served at /metrics\n",
              {}};
  } else {
    answer.body = handlers->metrics->Expose();
  }
  MHD_Response* response = MHD_create_response_from_buffer(
      answer.body.size(), const_cast<char*>(answer.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, answer.content_type.c_str());
  for (const auto& [name, value] : answer.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned>(answer.status), response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

void MetricsHttpServer::Log(void* self, const char* format, va_list args) {
  char text[512];
  std::vsnprintf(text, sizeof(text), format, args);
  std::string message(text);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) {
    message.pop_back();
  }
  auto* server = static_cast<MetricsHttpServer*>(self);
  {
    absl::MutexLock lock(&server->log_mutex_);
    if (!server->started_) {
      // Said once, in the error Start returns.
      if (server->first_error_.empty()) server->first_error_ = message;
      return;
    }
  }
  LogWarning(absl::StrCat("metrics endpoint: ", message));
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    absl::string_view address, Metrics* metrics, PageSource pages) {
  if (absl::Status s = CheckMetricsAddress(address); !s.ok()) return s;
  const std::size_t colon = address.rfind(':');
  absl::string_view host = address.substr(0, colon);
  int port = 0;
  (void)absl::SimpleAtoi(address.substr(colon + 1), &port);  // checked above

  sockaddr_storage storage;
  std::memset(&storage, 0, sizeof(storage));
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<std::uint16_t>(port));
    const std::string h(host.substr(1, host.size() - 2));
    if (inet_pton(AF_INET6, h.c_str(), &in6->sin6_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_address: '", host, "' is not an IPv6 address (e.g. [::1]:9464)"));
    }
    flags |= MHD_USE_IPv6;
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&storage);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<std::uint16_t>(port));
    const std::string h(host);
    if (inet_pton(AF_INET, h.c_str(), &in4->sin_addr) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_address: '", host,
                       "' is not an IPv4 address (e.g. 127.0.0.1:9464, 0.0.0.0:9464, [::1]:9464)"));
    }
  }

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->handlers_.metrics = metrics;
  server->handlers_.pages = std::move(pages);
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<std::uint16_t>(port), nullptr, nullptr, &HandleRequest, &server->handlers_,
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&storage), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned>(10), MHD_OPTION_CONNECTION_LIMIT, static_cast<unsigned>(64),
      MHD_OPTION_EXTERNAL_LOGGER, &MetricsHttpServer::Log, server.get(), MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    absl::MutexLock lock(&server->log_mutex_);
    return absl::UnavailableError(absl::StrCat(
        "--metrics_address: cannot listen on ", address, ": ",
        server->first_error_.empty() ? "the HTTP server did not start" : server->first_error_,
        " (address in use, not local, or not permitted)"));
  }
  {
    absl::MutexLock lock(&server->log_mutex_);
    server->started_ = true;
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  if (info == nullptr || info->port == 0) {
    return absl::InternalError(
        absl::StrCat("--metrics_address: listening on ", address, " but the port is unknown"));
  }
  server->port_ = info->port;
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace logitd::service
