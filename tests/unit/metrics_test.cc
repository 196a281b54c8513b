// The metrics registry's text exposition (Prometheus format 0.0.4) and its
// HTTP endpoint.
#include "server/service/state/metrics.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/loopback_exchange.h"

namespace logitd::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

MetricsBuildInfo Build() { return {"0.1.0", "cpu", "Test CPU"}; }

// Lines of the exposition, without the trailing empty one.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// The value of the sample written exactly as `series` (name and labels).
double Sample(const std::string& text, absl::string_view series) {
  for (const std::string& line : Lines(text)) {
    if (absl::StartsWith(line, absl::StrCat(series, " "))) {
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(series.size() + 1), &v)) << line;
      return v;
    }
  }
  ADD_FAILURE() << "no sample " << series << " in:\n" << text;
  return -1;
}

// Checks the structure every scraper relies on: each family has one HELP and
// one TYPE line before its samples, and every sample belongs to the family
// whose TYPE came last (histograms: _bucket, _sum and _count).
void ExpectWellFormed(const std::string& text) {
  ASSERT_FALSE(text.empty());
  ASSERT_EQ(text.back(), '\n');
  std::set<std::string> typed;
  std::string family, type;
  for (const std::string& line : Lines(text)) {
    ASSERT_FALSE(line.empty()) << "empty line in:\n" << text;
    if (absl::StartsWith(line, "# HELP ")) continue;
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      ASSERT_EQ(parts.size(), 4u) << line;
      family = parts[2];
      type = parts[3];
      EXPECT_TRUE(typed.insert(family).second) << "family typed twice: " << family;
      continue;
    }
    ASSERT_FALSE(absl::StartsWith(line, "#")) << line;
    const std::size_t end = line.find_first_of("{ ");
    ASSERT_NE(end, std::string::npos) << line;
    const std::string name = line.substr(0, end);
    if (type == "histogram") {
      EXPECT_TRUE(name == family + "_bucket" || name == family + "_sum" ||
                  name == family + "_count")
          << line;
    } else {
      EXPECT_EQ(name, family) << line;
    }
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) << line;
  }
}

TEST(MetricsTest, InitialSeriesAreZeroAndWellFormed) {
  Metrics metrics(Build(), {"GetServerInfo", "Cast"});
  const std::string text = metrics.Expose();
  ExpectWellFormed(text);
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_request_duration_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_bytes_received_total counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_bytes_sent_total counter\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_weight_bytes gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_weights gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_inflight_requests gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_build_info gauge\n"));
  EXPECT_THAT(text, HasSubstr("# HELP logitd_requests_total "));
  EXPECT_EQ(Sample(text, R"(logitd_requests_total{code="OK",rpc="Cast"})"), 0);
  EXPECT_EQ(Sample(text, R"(logitd_requests_total{code="OK",rpc="GetServerInfo"})"), 0);
  EXPECT_EQ(Sample(text, R"(logitd_request_duration_seconds_count{rpc="Cast"})"), 0);
  EXPECT_EQ(Sample(text, R"(logitd_bytes_received_total{rpc="Cast"})"), 0);
  EXPECT_EQ(Sample(text, "logitd_inflight_requests"), 0);
  EXPECT_EQ(Sample(text, R"(logitd_build_info{backend="cpu",device="Test CPU",version="0.1.0"})"),
            1);
  // No device, no device memory series.
  EXPECT_THAT(text, Not(HasSubstr("logitd_device_memory_bytes")));
}

TEST(MetricsTest, RecordsCallsByMethodAndCode) {
  Metrics metrics(Build(), {"Cast"});
  metrics.RecordCall("Cast", "OK", 0.003, 4096, 2048);
  metrics.RecordCall("Cast", "OK", 0.0001, 16, 8);
  metrics.RecordCall("Cast", "INVALID_ARGUMENT", 0.00002, 0, 0);
  // A method not named at construction gets its series on first use.
  metrics.RecordCall("Logits", "NOT_FOUND", 70, 10, 0);
  const std::string text = metrics.Expose();
  ExpectWellFormed(text);
  EXPECT_EQ(Sample(text, R"(logitd_requests_total{code="OK",rpc="Cast"})"), 2);
  EXPECT_EQ(Sample(text, R"(logitd_requests_total{code="INVALID_ARGUMENT",rpc="Cast"})"), 1);
  EXPECT_EQ(Sample(text, R"(logitd_requests_total{code="NOT_FOUND",rpc="Logits"})"), 1);
  EXPECT_EQ(Sample(text, R"(logitd_bytes_received_total{rpc="Cast"})"), 4112);
  EXPECT_EQ(Sample(text, R"(logitd_bytes_sent_total{rpc="Cast"})"), 2056);
  EXPECT_EQ(Sample(text, R"(logitd_bytes_received_total{rpc="Logits"})"), 10);

  // Buckets are cumulative, the upper bound inclusive, +Inf equals _count.
  const auto bucket = [&](absl::string_view rpc, absl::string_view le) {
    return Sample(text, absl::StrCat("logitd_request_duration_seconds_bucket{rpc=\"", rpc,
                                     "\",le=\"", le, "\"}"));
  };
  EXPECT_EQ(bucket("Cast", "0.0001"), 2);
  EXPECT_EQ(bucket("Cast", "0.0025"), 2);
  EXPECT_EQ(bucket("Cast", "0.005"), 3);
  EXPECT_EQ(bucket("Cast", "60"), 3);
  EXPECT_EQ(bucket("Cast", "+Inf"), 3);
  EXPECT_EQ(Sample(text, R"(logitd_request_duration_seconds_count{rpc="Cast"})"), 3);
  EXPECT_NEAR(Sample(text, R"(logitd_request_duration_seconds_sum{rpc="Cast"})"), 0.00312, 1e-12);
  EXPECT_EQ(bucket("Logits", "60"), 0);
  EXPECT_EQ(bucket("Logits", "+Inf"), 1);

  // Every bound of RequestDurationBuckets, in order, then +Inf.
  std::vector<std::string> les;
  for (const std::string& line : Lines(text)) {
    const std::string prefix = R"(logitd_request_duration_seconds_bucket{rpc="Cast",le=")";
    if (absl::StartsWith(line, prefix)) {
      les.push_back(line.substr(prefix.size(), line.find('"', prefix.size()) - prefix.size()));
    }
  }
  ASSERT_EQ(les.size(), RequestDurationBuckets().size() + 1);
  for (std::size_t i = 0; i < RequestDurationBuckets().size(); ++i) {
    double le = 0;
    ASSERT_TRUE(absl::SimpleAtod(les[i], &le)) << les[i];
    EXPECT_EQ(le, RequestDurationBuckets()[i]);
  }
  EXPECT_EQ(les.back(), "+Inf");
  EXPECT_EQ(RequestDurationBuckets().front(), 0.0001);
  EXPECT_EQ(RequestDurationBuckets().back(), 60);
}

TEST(MetricsTest, GaugesComeFromTheSourceAtScrapeTime) {
  Metrics metrics(Build(), {});
  MetricsGauges g;
  g.weight_bytes = 4194304;
  g.weight_budget_bytes = 17179869184ull;
  g.weights = 1;
  metrics.SetGaugeSource([&g] { return g; });
  std::string text = metrics.Expose();
  EXPECT_EQ(Sample(text, "logitd_weight_bytes"), 4194304);
  EXPECT_EQ(Sample(text, "logitd_weight_budget_bytes"), 17179869184.0);
  EXPECT_EQ(Sample(text, "logitd_weights"), 1);
  g.weight_bytes = 0;
  g.weights = 0;
  text = metrics.Expose();
  EXPECT_EQ(Sample(text, "logitd_weight_bytes"), 0);
  EXPECT_EQ(Sample(text, "logitd_weights"), 0);
  EXPECT_THAT(text, Not(HasSubstr("logitd_device_memory_bytes")));

  metrics.CallStarted();
  metrics.CallStarted();
  metrics.CallFinished();
  EXPECT_EQ(Sample(metrics.Expose(), "logitd_inflight_requests"), 1);
}

TEST(MetricsTest, DeviceMemoryWhenTheBackendHasADevice) {
  Metrics metrics(Build(), {});
  MetricsGauges g;
  g.device_in_use_bytes = 123456789;
  g.device_total_bytes = 150011707392ull;
  metrics.SetGaugeSource([&g] { return g; });
  const std::string text = metrics.Expose();
  ExpectWellFormed(text);
  EXPECT_THAT(text, HasSubstr("# TYPE logitd_device_memory_bytes gauge\n"));
  EXPECT_EQ(Sample(text, R"(logitd_device_memory_bytes{kind="in_use"})"), 123456789);
  EXPECT_EQ(Sample(text, R"(logitd_device_memory_bytes{kind="total"})"), 150011707392.0);
}

TEST(MetricsTest, EscapesLabelValues) {
  Metrics metrics({"0.1.0", "cuda", "GPU \"x\" \\ 1\nrev"}, {});
  const std::string text = metrics.Expose();
  ExpectWellFormed(text);
  EXPECT_THAT(text, HasSubstr(R"(logitd_build_info{backend="cuda",device="GPU \"x\" \\ 1\nrev",)"));
}

// --- HTTP endpoint ---------------------------------------------------------

// Sends `method path` to 127.0.0.1:port and returns everything the server sent.
std::string Get(int port, absl::string_view path, absl::string_view method = "GET") {
  absl::StatusOr<std::string> response = testing::LoopbackExchange(
      port,
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"));
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? *response : "";
}

TEST(MetricsHttpServerTest, ServesMetricsOnAFreePort) {
  Metrics metrics(Build(), {"Cast"});
  metrics.RecordCall("Cast", "OK", 0.001, 40, 20);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  const std::string response = Get(port, "/metrics");
  ASSERT_THAT(response, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  const std::size_t body_at = response.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos);
  const std::string body = response.substr(body_at + 4);
  EXPECT_THAT(response, HasSubstr(absl::StrCat("Content-Length: ", body.size(), "\r\n")));
  ExpectWellFormed(body);
  EXPECT_EQ(Sample(body, R"(logitd_requests_total{code="OK",rpc="Cast"})"), 1);

  EXPECT_THAT(Get(port, "/metrics", "HEAD"), HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(Get(port, "/other"), HasSubstr("HTTP/1.1 404"));
  EXPECT_THAT(Get(port, "/metrics/x"), HasSubstr("HTTP/1.1 404"));
  EXPECT_THAT(Get(port, "/metrics", "POST"), HasSubstr("HTTP/1.1 405"));
}

TEST(MetricsHttpServerTest, BusyPortIsAnError) {
  Metrics metrics(Build(), {});
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(taken, &metrics);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics_address"));
  EXPECT_THAT(second.status().message(), HasSubstr(taken));
}

TEST(MetricsHttpServerTest, MalformedAddressesAreRefused) {
  for (const char* bad :
       {"", "9464", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000", ":9464", "unix:/tmp/x"}) {
    EXPECT_FALSE(CheckMetricsAddress(bad).ok()) << bad;
  }
  for (const char* good : {"127.0.0.1:0", "0.0.0.0:9464", "[::1]:9464"}) {
    EXPECT_TRUE(CheckMetricsAddress(good).ok()) << good;
  }
}

}  // namespace
}  // namespace logitd::service
