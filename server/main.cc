// logitd: the gRPC server for the language-model head's GEMMs. Parses and
// checks flags, creates the backend, serves logitd.v1.Logitd with the
// standard health and reflection services, and shuts down gracefully on
// SIGTERM/SIGINT so that in-flight calls finish.
#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "logitd/reference/blas_kernels.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "server/flags.h"
#include "server/history/dashboard.h"
#include "server/kernels/backend.h"
#include "server/service/oip/oip_service.h"
#include "server/service/shared/shared_state.h"
#include "server/service/state/build_info.h"
#include "server/service/state/logging.h"
#include "server/service/state/metrics.h"
#include "server/service/state/options.h"
#include "server/service/v1/service.h"

namespace logitd {
namespace {

using service::LogError;
using service::LogInfo;
using service::LogWarning;

constexpr int kExitRuntimeError = 1;
constexpr int kExitBadFlags = 2;
// The device was lost (a context-poisoning fault or a hung call): EX_TEMPFAIL,
// a temporary failure that a restart cures. Nothing else exits with it.
constexpr int kExitDeviceLost = 75;
// After the device is lost: the server says NOT_SERVING for at least this
// long, and waits at most this much longer for the calls in flight.
constexpr auto kDeviceLostNotice = std::chrono::seconds(1);
constexpr auto kDeviceLostDrain = std::chrono::seconds(10);
// What a stop pipe carries besides signal numbers: the device was lost.
constexpr unsigned char kDeviceLostMessage = 0xfe;
constexpr auto kShutdownGrace = std::chrono::seconds(30);

// Stop signals arrive through a pipe: the handler only writes the signal
// number. A signal mask cannot be relied on here, because libraries (the BLAS
// library's thread pool) start threads before main() that would not inherit
// it, and a signal delivered to one of them would kill the process.
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnStopSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char b = static_cast<unsigned char>(signal_number);
  if (write(g_signal_pipe[1], &b, 1) < 0) {
    // Nothing can be done inside a signal handler; the pipe is never full in practice.
  }
  errno = saved_errno;
}

absl::Status InstallStopSignalHandlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    if (sigaction(sig, &action, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// The device's loss, as the backend reported it, guarded by
// g_device_lost_mu; the waiter thread is told through the stop pipe.
ABSL_CONST_INIT absl::Mutex g_device_lost_mu(absl::kConstInit);
absl::Status g_device_lost ABSL_GUARDED_BY(g_device_lost_mu);

void OnDeviceLost(const absl::Status& cause) {
  {
    absl::MutexLock lock(&g_device_lost_mu);
    g_device_lost = cause;
  }
  const unsigned char b = kDeviceLostMessage;
  if (write(g_signal_pipe[1], &b, 1) < 0) {
    // The pipe is never full in practice; the failed calls still say why.
  }
}

// Blocks until SIGTERM, SIGINT, SIGHUP or a device loss; returns the signal
// number or kDeviceLostMessage.
int WaitForSignal() {
  unsigned char b = 0;
  while (read(g_signal_pipe[0], &b, 1) < 0 && errno == EINTR) {
  }
  return b;
}

int BadFlags(absl::string_view message) {
  std::fprintf(stderr, "logitd: %.*s\n(run logitd --help for the flags)\n",
               static_cast<int>(message.size()), message.data());
  return kExitBadFlags;
}

// Written whole under another name and renamed, so a reader never sees half.
absl::Status WritePortFile(absl::string_view flag, const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) {
      return absl::PermissionDeniedError(absl::StrCat("--", flag, ": cannot write '", tmp, "'"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("--", flag, ": cannot rename '", tmp, "' to '", path, "': ", ec.message()));
  }
  return absl::OkStatus();
}

// The methods of logitd.v1.Logitd, for the metrics' initial series.
std::vector<std::string> RpcNames() {
  std::vector<std::string> names;
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Logitd::service_full_name());
  if (service == nullptr) return names;
  for (int i = 0; i < service->method_count(); ++i) names.push_back(service->method(i)->name());
  return names;
}

// Creates the backend the flags ask for, its lines going to the log and its
// loss to the stop pipe, and says which it is. Null after an error, logged.
// What main() did about OpenBLAS's kernels (UseBestBlasKernels), for the log.
std::string& BlasNote() {
  static std::string* note = new std::string();
  return *note;
}

std::unique_ptr<kernels::Backend> StartBackend(const ServerConfig& config,
                                               kernels::BackendInfo* info) {
  kernels::BackendOptions backend_options = config.backend;
  backend_options.events.info = [](const std::string& line) { LogInfo(line); };
  backend_options.events.warning = [](const std::string& line) { LogWarning(line); };
  backend_options.events.device_lost = OnDeviceLost;
  std::string why;
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend =
      kernels::CreateBackend(backend_options, &why);
  if (!backend.ok()) {
    LogError(absl::StrCat("cannot start the ", config.backend_name,
                          " backend: ", backend.status().ToString()));
    return nullptr;
  }
  *info = (*backend)->Info();
  LogInfo(absl::StrCat("backend: ", why.empty() ? info->backend : why));
  if (!BlasNote().empty()) LogInfo(BlasNote());
  if (config.service.faults.any()) {
    LogError(absl::StrCat(
        "TEST FAULTS ON (--test_fault=", config.service.faults.ToString(),
        "): this server returns DELIBERATELY WRONG results. It exists to prove that the "
        "validation harness catches them; never use it for real work."));
  }
  if (config.service.weight_budget_bytes == 0) {
    LogWarning("--weight_budget_bytes=0: no weight can be registered");
  }
  return std::move(*backend);
}

// The history's pages on the metrics port (server/history/dashboard.h):
// the caller's tenant as a gRPC call's (a bearer token when the server has
// tokens, the loopback rule without), then its page.
service::PageSource HistoryPages(const service::SharedState& state) {
  return [&state](const service::HttpRequest& request) -> service::HttpAnswer {
    constexpr char kText[] = "text/plain; charset=utf-8";
    history::HistoryStore* store = state.options().history.get();
    if (store == nullptr) {
      return {404, kText, "this server keeps no history (--history=none)\n", {}};
    }
    absl::StatusOr<service::Tenant> tenant =
        state.authenticator().AuthenticateBearer(request.authorization, request.peer);
    if (!tenant.ok()) {
      const std::string message = absl::StrCat(tenant.status().message(), "\n");
      if (tenant.status().code() == absl::StatusCode::kUnauthenticated) {
        return {401, kText, message, {{"WWW-Authenticate", "Bearer realm=\"logitd history\""}}};
      }
      return {403, kText, message, {}};
    }
    history::DashboardPage page =
        history::RenderDashboard(*store, tenant->id, request.path, request.query);
    return {page.status, page.content_type, std::move(page.body), {}};
  };
}

// Serves `metrics` at --metrics_address, the gauges read from `state`, the
// history's pages, and writes --metrics_port_file. Null after an error,
// logged.
std::unique_ptr<service::MetricsHttpServer> StartMetricsEndpoint(
    const ServerConfig& config, service::Metrics* metrics, const service::SharedState& state) {
  metrics->SetGaugeSource([&state] {
    service::MetricsGauges g;
    g.weight_bytes = state.registry().bytes_in_use();
    g.weight_budget_bytes = state.registry().budget_bytes();
    g.weights = state.registry().weight_count();
    g.device_in_use_bytes = state.backend().DeviceBytesInUse();
    g.device_total_bytes = state.backend().DeviceBytesTotal();
    return g;
  });
  absl::StatusOr<std::unique_ptr<service::MetricsHttpServer>> started =
      service::MetricsHttpServer::Start(config.metrics_address, metrics, HistoryPages(state));
  if (!started.ok()) {
    LogError(started.status().message());
    return nullptr;
  }
  std::unique_ptr<service::MetricsHttpServer> metrics_http = std::move(*started);
  if (!config.metrics_port_file.empty()) {
    if (absl::Status s =
            WritePortFile("metrics_port_file", config.metrics_port_file, metrics_http->port());
        !s.ok()) {
      LogError(s.message());
      return nullptr;
    }
  }
  const std::size_t colon = config.metrics_address.rfind(':');
  LogInfo(absl::StrCat(
      "metrics: serving http://", config.metrics_address.substr(0, colon), ":",
      metrics_http->port(), "/metrics",
      state.options().history != nullptr ? " and the history's pages at /history" : ""));
  return metrics_http;
}

// The gRPC server, started: `service` and the standard health and reflection
// services on --address, within the service's limits; `selected_port` gets
// the port bound. Null after an error, logged.
std::unique_ptr<grpc::Server> BuildServer(const ServerConfig& config,
                                          service::LogitdService* service, service::OipService* oip,
                                          int* selected_port) {
  const service::ServiceOptions& options = config.service;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.address, config.credentials, selected_port);
  service->RegisterWith(&builder);
  // The Open Inference Protocol front door (--oip), a peer over the same state.
  if (oip != nullptr) builder.RegisterService(oip);
  // gRPC sets SO_REUSEPORT by default: a second server on a busy port would
  // start and quietly share it instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The limits are the service's (ServerInfo reports them); gRPC's own
  // receive limit is twice as high, so that a message over the service's
  // limit reaches the service, which names the limit, instead of being
  // refused by the transport with a bare RESOURCE_EXHAUSTED.
  builder.SetMaxReceiveMessageSize(static_cast<int>(2 * options.max_receive_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_send_message_bytes));
  // The other calls run on the sync server's threads, bounded the same way.
  grpc::ResourceQuota quota("logitd");
  quota.SetMaxThreads(options.max_call_threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *selected_port == 0) {
    LogError(absl::StrCat(
        "cannot listen on ", config.address, " (address in use, not local, or not permitted",
        config.tls_mode == "off" ? "" : "; or --tls_cert and --tls_key do not match", ")"));
    return nullptr;
  }
  return server;
}

// The line that says the server is up, and how it is configured.
void LogListening(const ServerConfig& config, const kernels::BackendInfo& info,
                  const std::string& bound) {
  const service::ServiceOptions& options = config.service;
  LogInfo(absl::StrCat(
      "logitd ", service::Version(), " (", service::BuildId(), ") listening on ", bound,
      " backend=", info.backend, " device=\"", info.device_name, "\" weight_budget_bytes=",
      options.weight_budget_bytes, " max_request_bytes=", options.max_request_bytes,
      " request_memory_bytes=", options.admission.memory_bytes,
      " max_concurrent_requests=", options.admission.max_concurrent_requests, " admission_wait=",
      absl::FormatDuration(options.admission.max_wait), " chunk_bytes=", options.chunk_bytes,
      " weights_dir=", options.weights_dir.empty() ? "(none)" : options.weights_dir.string(),
      " shm=", options.shm.allowed ? "on" : "off", " tls=", config.tls_mode,
      " auth=", config.auth_mode, " algo_choices=", info.algo_choices,
      info.algo_cache_path.empty() ? "" : absl::StrCat(" (", info.algo_cache_path, ")")));
}

// SIGHUP reloads the tokens file; a file that does not parse leaves the
// tokens in force as they were.
void ReloadTokens(service::Authenticator& auth) {
  if (!auth.tokens_enabled()) {
    LogInfo("received SIGHUP: no --auth_tokens file to reload");
    return;
  }
  absl::StatusOr<std::string> reloaded = auth.Reload();
  if (reloaded.ok()) {
    LogInfo(absl::StrCat("received SIGHUP: reloaded ", *reloaded));
  } else {
    LogError(absl::StrCat("received SIGHUP: reload failed, keeping the tokens loaded before: ",
                          reloaded.status().message()));
  }
}

// After the device is lost: NOT_SERVING, the calls in flight drained (for
// kDeviceLostDrain at most), then exit with kExitDeviceLost.
[[noreturn]] void ExitAfterDeviceLost(service::Metrics* metrics,
                                      grpc::HealthCheckServiceInterface* health,
                                      const service::SharedState& state) {
  // Said once, here: the calls that fail say it again only to their callers.
  absl::Status cause;
  {
    absl::MutexLock lock(&g_device_lost_mu);
    cause = g_device_lost;
  }
  LogError(absl::StrCat(cause.message(), ". Not serving; in-flight calls have ",
                        kDeviceLostDrain.count(), " s, then logitd exits with status ",
                        kExitDeviceLost, " to be restarted"));
  if (metrics != nullptr) {
    metrics->RecordDeviceLost(absl::StrContains(cause.message(), "presumed hung") ? "hang"
                                                                                  : "fault");
  }
  if (health != nullptr) health->SetServingStatus(false);
  // The server keeps answering (NOT_SERVING to probes, UNAVAILABLE with
  // the cause to every call that needs the device) until the calls in
  // flight are done, then the process ends without gRPC's orderly
  // shutdown, which would cancel calls arriving meanwhile (CANCELLED is
  // not retried; the connection refused after the exit is, as
  // UNAVAILABLE). A call stuck on a hung device never finishes: the
  // drain has a limit.
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(kDeviceLostNotice);
  while (state.admission().Stats().requests_in_flight > 0 &&
         std::chrono::steady_clock::now() - start < kDeviceLostNotice + kDeviceLostDrain) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::uint32_t stuck = state.admission().Stats().requests_in_flight;
  // A moment for the last responses' bytes to leave the sockets.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  LogError(absl::StrCat("exiting with status ", kExitDeviceLost, " (device lost",
                        stuck > 0 ? absl::StrCat("; ", stuck, " calls still stuck on it") : "",
                        ")"));
  std::fflush(nullptr);
  std::_Exit(kExitDeviceLost);
}

// Serves until SIGTERM or SIGINT, then shuts down gracefully: health says
// NOT_SERVING first, and the calls in flight get kShutdownGrace. SIGHUP
// reloads the tokens; a lost device ends the process (ExitAfterDeviceLost).
void ServeUntilSignal(grpc::Server* server, grpc::HealthCheckServiceInterface* health,
                      const service::SharedState& state, const service::ServiceOptions& options) {
  std::thread waiter([&] {
    int signal_number = WaitForSignal();
    for (; signal_number == SIGHUP; signal_number = WaitForSignal()) {
      ReloadTokens(*options.auth);
    }
    if (signal_number == kDeviceLostMessage) {
      ExitAfterDeviceLost(options.metrics, health, state);
    }
    LogInfo(absl::StrCat("received ", signal_number == SIGINT ? "SIGINT" : "SIGTERM",
                         ": not serving; in-flight calls have ", kShutdownGrace.count(),
                         " s to finish"));
    if (health != nullptr) {
      // Load balancers and probes stop sending new calls first.
      health->SetServingStatus(false);
      health->Shutdown();
    }
    server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  });
  server->Wait();
  waiter.join();
}

// Runs the server `config` describes until it is told to stop; returns the
// exit status.
int Serve(const ServerConfig& config) {
  kernels::BackendInfo info;
  std::unique_ptr<kernels::Backend> backend = StartBackend(config, &info);
  if (backend == nullptr) return kExitRuntimeError;

  service::ServiceOptions options = config.service;
  // Declared before the state, which records into it, so that it outlives it.
  std::unique_ptr<service::Metrics> metrics;
  if (!config.metrics_address.empty()) {
    metrics = std::make_unique<service::Metrics>(
        service::MetricsBuildInfo{std::string(service::Version()), info.backend, info.device_name},
        RpcNames());
    options.metrics = metrics.get();
  }

  // What both front doors serve over; built first, so that it outlives them.
  service::SharedState state(std::move(backend), options);
  service::LogitdService service(&state);

  // Declared after the state: it stops serving scrapes before the state goes.
  std::unique_ptr<service::MetricsHttpServer> metrics_http;
  if (metrics != nullptr) {
    metrics_http = StartMetricsEndpoint(config, metrics.get(), state);
    if (metrics_http == nullptr) return kExitRuntimeError;
  }

  int selected_port = 0;
  std::unique_ptr<service::OipService> oip;
  if (config.oip) oip = std::make_unique<service::OipService>(&state);
  std::unique_ptr<grpc::Server> server = BuildServer(config, &service, oip.get(), &selected_port);
  if (server == nullptr) return kExitRuntimeError;
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus(v1::Logitd::service_full_name(), true);
    if (oip != nullptr) {
      health->SetServingStatus(inference::GRPCInferenceService::service_full_name(), true);
    }
  }

  const std::string bound = config.listen.unix_socket
                                ? config.listen.host
                                : absl::StrCat(config.listen.host, ":", selected_port);
  if (!config.port_file.empty()) {
    if (absl::Status s = WritePortFile("port_file", config.port_file, selected_port); !s.ok()) {
      LogError(s.message());
      server->Shutdown();
      return kExitRuntimeError;
    }
  }
  LogListening(config, info, bound);

  ServeUntilSignal(server.get(), health, state, options);
  LogInfo("logitd stopped");
  return 0;
}

int Main(int argc, char** argv) {
  // Before gRPC starts its threads: a signal during start-up is then kept in
  // the pipe and handled as soon as the server runs.
  if (absl::Status s = InstallStopSignalHandlers(); !s.ok()) {
    std::fprintf(stderr, "logitd: %s\n", std::string(s.message()).c_str());
    return kExitRuntimeError;
  }
  if (absl::Status s = ParseFlags(argc, argv); !s.ok()) return BadFlags(s.message());
  if (absl::Status s = SetLogLevelFromFlag(); !s.ok()) return BadFlags(s.message());
  absl::StatusOr<ServerConfig> config = ServerConfigFromFlags();
  if (!config.ok()) return BadFlags(config.status().message());
  return Serve(*config);
}

}  // namespace
}  // namespace logitd

int main(int argc, char** argv) {
  // gRPC's shutdown joins its executor threads, and one of them can sit in
  // the TCP backup poller's 10 s poll (started when a large response filled
  // a socket buffer): the process would linger up to 10 s after "logitd
  // stopped". This reference keeps gRPC up while Main's objects go, and the
  // shutdown below gets a few seconds (connections closed in order, the
  // last responses on their way) before the process ends without waiting for
  // the rest of it. Exiting at once would close sockets that still hold a
  // response's last bytes.
  // First: it may execute logitd again with OpenBLAS told which kernels
  // this CPU runs.
  logitd::BlasNote() = logitd::UseBestBlasKernels(argv);
  grpc_init();
  const int code = logitd::Main(argc, argv);
  std::fflush(nullptr);
  auto shut_down = std::make_shared<std::atomic<bool>>(false);
  std::thread([code, shut_down] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    if (shut_down->load()) return;  // exit() is under way
    std::fflush(nullptr);
    std::_Exit(code);
  }).detach();
  grpc_shutdown();
  shut_down->store(true);
  return code;
}