// Prometheus metrics of the server: per-RPC counters and latency histograms,
// recorded at the one place every logitd.v1.Logitd call ends
// (CallRunner::Run, call.h), gauges read when scraped, and an HTTP endpoint that
// serves them in the text exposition format (version 0.0.4).
//
// Metric types and the text format come from prometheus-cpp's core library;
// the HTTP endpoint is GNU libmicrohttpd. (Not civetweb: its worker threads
// get a fixed 100 KiB stack, less than the static TLS of a process that links
// cuBLASLt, so it cannot start in a cuda-enabled build.)
#pragma once

#include <cstdarg>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

struct MHD_Daemon;

namespace logitd::service {

// The content type of the text exposition format.
inline constexpr absl::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Upper bounds of the request duration histogram, seconds: 100 us to 60 s.
const std::vector<double>& RequestDurationBuckets();

// Values read at scrape time.
struct MetricsGauges {
  std::uint64_t weight_bytes = 0;         // registry: weights plus gradient buffers
  std::uint64_t weight_budget_bytes = 0;  // --weight_budget_bytes
  std::uint64_t weights = 0;              // distinct weights held
  // Device memory; exported only when device_total_bytes > 0 (a backend
  // with a device that says how large it is).
  std::uint64_t device_in_use_bytes = 0;
  std::uint64_t device_total_bytes = 0;
};

struct MetricsBuildInfo {
  std::string version;
  std::string backend;
  std::string device;
};

// Thread-safe: calls may be recorded from any thread while another scrapes.
class Metrics {
 public:
  // `rpcs` are the method names whose series exist from the start (with
  // code="OK"), so that rates are defined before the first call.
  Metrics(const MetricsBuildInfo& build, const std::vector<std::string>& rpcs);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Sets the function that supplies the gauges at each scrape.
  void SetGaugeSource(std::function<MetricsGauges()> source);

  // One finished call: its status code (e.g. "OK", "INVALID_ARGUMENT"),
  // duration and the tensor payload bytes it received and sent.
  void RecordCall(absl::string_view rpc, absl::string_view code, double seconds,
                  std::uint64_t tensor_bytes_in, std::uint64_t tensor_bytes_out);
  void CallStarted();
  void CallFinished();
  // The device was lost; `cause` is "fault" or "hang".
  void RecordDeviceLost(absl::string_view cause);
  // A Verify run recorded in the history, by its verdict, and each of its
  // candidates compared with a baseline run by how its bits compared
  // ("identical", "different_within_bounds", ...; none without a baseline),
  // and each alert it raised by its rule's check ("bits_unchanged", ...).
  void RecordRun(absl::string_view verdict, const std::vector<std::string>& compared_bits,
                 const std::vector<std::string>& alert_checks);

  // Every metric in the text exposition format.
  std::string Expose();

 private:
  struct PerRpc {
    prometheus::Histogram* duration = nullptr;
    prometheus::Counter* bytes_received = nullptr;
    prometheus::Counter* bytes_sent = nullptr;
  };
  PerRpc& ForRpc(absl::string_view rpc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_received_ = nullptr;
  prometheus::Family<prometheus::Counter>* bytes_sent_ = nullptr;
  prometheus::Gauge* weight_bytes_ = nullptr;
  prometheus::Gauge* weight_budget_bytes_ = nullptr;
  prometheus::Gauge* weights_ = nullptr;
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_lost_ = nullptr;
  // The history's counters (runs recorded, candidates compared, alerts).
  void RegisterHistoryFamilies();

  prometheus::Family<prometheus::Counter>* runs_recorded_ = nullptr;
  prometheus::Family<prometheus::Counter>* compared_ = nullptr;
  prometheus::Family<prometheus::Counter>* alerts_ = nullptr;
  prometheus::Gauge* device_healthy_ = nullptr;

  absl::Mutex mutex_;
  std::map<std::string, PerRpc, std::less<>> rpcs_ ABSL_GUARDED_BY(mutex_);
  std::function<MetricsGauges()> gauge_source_ ABSL_GUARDED_BY(mutex_);
  prometheus::Gauge* device_in_use_ ABSL_GUARDED_BY(mutex_) = nullptr;
  prometheus::Gauge* device_total_ ABSL_GUARDED_BY(mutex_) = nullptr;
};

// OK when `address` is HOST:PORT with PORT in 0..65535; InvalidArgument
// naming --metrics_address otherwise.
absl::Status CheckMetricsAddress(absl::string_view address);

// Serves GET (and HEAD) /metrics over plain HTTP from one polling thread.
// Stops (and joins its thread) when destroyed.
// A GET of a page under /history on the metrics port (the history's pages).
struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> query;  // decoded
  std::optional<std::string> authorization;  // the header, when sent
  std::string peer;                          // as gRPC names one: "ipv4:127.0.0.1:PORT"
};
struct HttpAnswer {
  int status = 200;
  std::string content_type;
  std::string body;
  // Extra headers (WWW-Authenticate on a 401).
  std::vector<std::pair<std::string, std::string>> headers;
};
using PageSource = std::function<HttpAnswer(const HttpRequest&)>;

class MetricsHttpServer {
 public:
  // Listens on HOST:PORT (HOST an IPv4 address, or an IPv6 one in brackets;
  // PORT 0 picks a free port). Fails when the address cannot be bound.
  // `pages`, when given, answers GETs under /history.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(absl::string_view address,
                                                                  Metrics* metrics,
                                                                  PageSource pages = nullptr);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The port bound (the one chosen when 0 was asked for).
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  static void Log(void* self, const char* format, va_list args);

 public:
  // What a request is answered from (the HTTP daemon's handler reads it).
  struct Handlers {
    Metrics* metrics = nullptr;
    PageSource pages;
  };

 private:
  Handlers handlers_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
  absl::Mutex log_mutex_;
  std::string first_error_ ABSL_GUARDED_BY(log_mutex_);  // the first message while starting
  bool started_ ABSL_GUARDED_BY(log_mutex_) = false;
};

}  // namespace logitd::service
