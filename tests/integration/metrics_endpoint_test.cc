// The real logitd with --metrics_address: /metrics scraped over a plain
// socket before and after calls of the real client, counters compared
// exactly; and client-side round_robin over three servers, each server's
// metrics showing that it served calls, calls still succeeding after one of
// them is killed.
#include <signal.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "tests/common/loopback_exchange.h"
#include "tests/integration/integration_util.h"
#include "tests/support/run_logitctl.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// GET /metrics; the body, or an error.
absl::StatusOr<std::string> Scrape(int port) {
  absl::StatusOr<std::string> got = LoopbackExchange(
      port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (!got.ok()) return got.status();
  const std::string& response = *got;
  const std::size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.1 200 ") || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("unexpected response: ", response.substr(0, 200)));
  }
  if (!absl::StrContains(response.substr(0, body),
                         "Content-Type: text/plain; version=0.0.4; charset=utf-8")) {
    return absl::InternalError(absl::StrCat("unexpected content type: ", response.substr(0, body)));
  }
  return response.substr(body + 4);
}

// The value of the sample written exactly as `series`; 0 when the series is
// not there (a counter that has not been incremented yet).
double Value(const std::string& text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series) && line.size() > series.size() &&
        line[series.size()] == ' ') {
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(series.size() + 1), &v)) << line;
      return v;
    }
  }
  return 0;
}

std::string Requests(absl::string_view rpc, absl::string_view code) {
  return absl::StrCat("logitd_requests_total{code=\"", code, "\",rpc=\"", rpc, "\"}");
}
std::string Received(absl::string_view rpc) {
  return absl::StrCat("logitd_bytes_received_total{rpc=\"", rpc, "\"}");
}
std::string Sent(absl::string_view rpc) {
  return absl::StrCat("logitd_bytes_sent_total{rpc=\"", rpc, "\"}");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// logitd (cpu backend) with its metrics endpoint on a free port.
struct MetricsServer {
  TempDir dir;
  std::unique_ptr<ServerProcess> process;
  int metrics_port = 0;

  // `history`: the --history file under the server's directory ("": none).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& history = "") {
    auto s = std::make_unique<MetricsServer>();
    const std::string port_file = s->dir.path() + "/metrics_port";
    absl::StatusOr<ServerProcess> p = ServerProcess::Start(
        ServerBinary(),
        {"--backend=cpu", "--cpu_threads=1", "--metrics_address=127.0.0.1:0",
         absl::StrCat("--metrics_port_file=", port_file),
         "--history=" + (history.empty() ? std::string("none") : s->dir / history)});
    if (!p.ok()) return p.status();
    s->process = std::make_unique<ServerProcess>(*std::move(p));
    // Written before the gRPC port file that Start waited for.
    const std::string port = ReadFile(port_file);
    if (port.empty() || port.back() != '\n' ||
        !absl::SimpleAtoi(port.substr(0, port.size() - 1), &s->metrics_port)) {
      return absl::InternalError(absl::StrCat("bad --metrics_port_file contents '", port, "'"));
    }
    return s;
  }
};

// Recorded Verify runs count by verdict, and their candidates compared with a
// baseline by how their bits compared.
TEST(MetricsIntegrationTest, RecordedRunsAndComparisonsAreCounted) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("h.sqlite3");
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Create((*server)->process->address());
  ASSERT_TRUE(c.ok()) << c.status();
  Tensor w(DType::kBf16, {16, 8}), x(DType::kBf16, {3, 8});
  for (std::int64_t i = 0; i < w.numel(); ++i) w.data<Bf16Bits>()[i] = FloatToBf16((i % 5) - 2.0f);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<Bf16Bits>()[i] = FloatToBf16((i % 3) - 1.0f);
  absl::StatusOr<client::WeightInfo> info = (*c)->RegisterWeight(w, "m");
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<Tensor> y = (*c)->Logits(x, info->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  client::VerifyArgs args;
  args.operation = client::VerifyOperation::kLogits;
  args.weight_handle = info->handle;
  args.x = x;
  args.candidates["y"] = *y;
  args.record = client::RunLabels{"p", "c", "main", ""};
  ASSERT_TRUE((*c)->Verify(args).ok());
  args.compare = client::BaselineSelector{"main", "", 0, "", false};
  ASSERT_TRUE((*c)->Verify(args).ok());
  ASSERT_TRUE((*c)->Verify(args).ok());
  // A rule that the next run breaks: one element's last bit flipped.
  client::HistoryRule rule;
  rule.check = client::HistoryRule::Check::kBitsUnchanged;
  ASSERT_TRUE((*c)->SetRules("p", {rule}).ok());
  std::uint32_t bits;
  std::memcpy(&bits, &y->data<float>()[4], sizeof bits);
  bits ^= 1u;
  std::memcpy(&y->data<float>()[4], &bits, sizeof bits);
  absl::StatusOr<client::VerifyResult> broke = (*c)->Verify(args);
  ASSERT_TRUE(broke.ok()) << broke.status();
  EXPECT_EQ(broke->alerts.size(), 1u);
  absl::StatusOr<std::string> text = Scrape((*server)->metrics_port);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Value(*text, "logitd_history_runs_recorded_total{verdict=\"bitwise_equal_to_logitd\"}"),
            3);
  EXPECT_EQ(Value(*text, "logitd_history_candidates_compared_total{bits=\"identical\"}"), 2);
  EXPECT_EQ(Value(*text, "logitd_history_alerts_total{check=\"bits_unchanged\"}"), 1);
}

TEST(MetricsIntegrationTest, CountersMoveExactlyWithCalls) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port;
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Create((*server)->process->address());
  ASSERT_TRUE(c.ok()) << c.status();
  client::Client& client = **c;

  absl::StatusOr<std::string> before = Scrape(port);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_THAT(*before, HasSubstr("logitd_build_info{backend=\"cpu\","));
  EXPECT_EQ(Value(*before, "logitd_weight_bytes"), 0);
  EXPECT_EQ(Value(*before, "logitd_weights"), 0);
  EXPECT_EQ(Value(*before, "logitd_inflight_requests"), 0);

  ASSERT_TRUE(client.Info().ok());
  // Cast: 4x8 fp32 in (128 bytes), 4x8 bf16 out (64 bytes).
  const Tensor in = IntFp32({4, 8}, 7);
  absl::StatusOr<Tensor> cast = client.CastToBf16(in);
  ASSERT_TRUE(cast.ok()) << cast.status();
  // RegisterWeight: 16x8 bf16 in (256 bytes).
  absl::StatusOr<client::WeightInfo> w = client.RegisterWeight(IntBf16({16, 8}, 8), "w");
  ASSERT_TRUE(w.ok()) << w.status();

  absl::StatusOr<std::string> registered = Scrape(port);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(Value(*registered, "logitd_weight_bytes"), 256);
  EXPECT_EQ(Value(*registered, "logitd_weights"), 1);

  // Logits: 2x8 bf16 in (32 bytes), 2x16 fp32 out (128 bytes).
  absl::StatusOr<Tensor> y = client.Logits(IntBf16({2, 8}, 9), w->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  // K = 4 against a weight with K = 8: refused after the header, before any
  // tensor byte is read.
  absl::StatusOr<Tensor> bad = client.Logits(IntBf16({2, 4}, 9), w->handle);
  ASSERT_FALSE(bad.ok());
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  ASSERT_TRUE(client.ReleaseWeight(w->handle).ok());

  absl::StatusOr<std::string> after = Scrape(port);
  ASSERT_TRUE(after.ok()) << after.status();
  const auto delta = [&](const std::string& series) {
    return Value(*after, series) - Value(*before, series);
  };
  EXPECT_EQ(delta(Requests("GetServerInfo", "OK")), 1);
  EXPECT_EQ(delta(Requests("Cast", "OK")), 1);
  EXPECT_EQ(delta(Requests("RegisterWeight", "OK")), 1);
  EXPECT_EQ(delta(Requests("Logits", "OK")), 1);
  EXPECT_EQ(delta(Requests("Logits", "INVALID_ARGUMENT")), 1);
  EXPECT_EQ(delta(Requests("ReleaseWeight", "OK")), 1);
  EXPECT_EQ(delta(Requests("ListWeights", "OK")), 0);
  EXPECT_EQ(delta(Received("Cast")), 128);
  EXPECT_EQ(delta(Sent("Cast")), 64);
  EXPECT_EQ(delta(Received("RegisterWeight")), 256);
  EXPECT_EQ(delta(Sent("RegisterWeight")), 0);
  EXPECT_EQ(delta(Received("Logits")), 32);
  EXPECT_EQ(delta(Sent("Logits")), 128);
  EXPECT_EQ(delta("logitd_request_duration_seconds_count{rpc=\"Logits\"}"), 2);
  EXPECT_EQ(delta("logitd_request_duration_seconds_bucket{rpc=\"Logits\",le=\"+Inf\"}"), 2);
  EXPECT_GT(delta("logitd_request_duration_seconds_sum{rpc=\"Logits\"}"), 0);
  EXPECT_EQ(Value(*after, "logitd_weight_bytes"), 0);
  EXPECT_EQ(Value(*after, "logitd_weights"), 0);
  EXPECT_EQ(Value(*after, "logitd_inflight_requests"), 0);
  // Nothing was counted under another code or for another method.
  double total_before = 0, total_after = 0;
  for (absl::string_view line : absl::StrSplit(*before, '\n')) {
    if (absl::StartsWith(line, "logitd_requests_total{")) {
      total_before += Value(*before, line.substr(0, line.rfind(' ')));
    }
  }
  for (absl::string_view line : absl::StrSplit(*after, '\n')) {
    if (absl::StartsWith(line, "logitd_requests_total{")) {
      total_after += Value(*after, line.substr(0, line.rfind(' ')));
    }
  }
  EXPECT_EQ(total_after - total_before, 6);

  EXPECT_THAT((*server)->process->Log(),
              HasSubstr(absl::StrCat("metrics: serving http://127.0.0.1:", port, "/metrics")));
}

// logitctl bench's warm-up runs --warmup calls on every client, not in all:
// the server counts them, with the measured ones.
TEST(MetricsIntegrationTest, BenchWarmsUpEveryClient) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const LogitctlRun r = RunLogitctl({"--server=" + (*server)->process->address(), "bench", "--m=4",
                                     "--k=16", "--v=64", "--concurrency=3", "--channels=3",
                                     "--warmup=2", "--requests=5", "--nobaseline"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.err, HasSubstr("warm-up, 2 requests per client"));
  absl::StatusOr<std::string> text = Scrape((*server)->metrics_port);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Value(*text, Requests("Logits", "OK")), 3 * 2 + 5) << *text;
}

TEST(MetricsIntegrationTest, BusyMetricsPortStopsTheStart) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> first = MetricsServer::Start();
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->metrics_port);
  absl::StatusOr<ServerProcess> second =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--metrics_address=" + taken});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("exited before listening (status 256)"));
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("--metrics_address: cannot listen on ", taken)));
}

TEST(MetricsIntegrationTest, MalformedMetricsAddressIsAFlagError) {
  absl::StatusOr<ServerProcess> p =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--metrics_address=9464"});
  ASSERT_FALSE(p.ok());
  // Exit status 2: a flag error.
  EXPECT_THAT(p.status().message(), HasSubstr("(status 512)"));
  EXPECT_THAT(p.status().message(), HasSubstr("--metrics_address: expected HOST:PORT"));
}

// Casts an integer-valued tensor (exact in bf16) and checks the result.
::testing::AssertionResult CastIsExact(client::Client& client, std::uint32_t seed) {
  const Tensor in = IntFp32({3, 5}, seed);
  absl::StatusOr<Tensor> out = client.CastToBf16(in);
  if (!out.ok()) return ::testing::AssertionFailure() << out.status();
  Tensor want(DType::kBf16, {3, 5});
  for (std::int64_t i = 0; i < in.numel(); ++i) {
    want.data<Bf16Bits>()[i] = FloatToBf16(in.data<float>()[i]);
  }
  return BitwiseEqual(*out, want);
}

TEST(RoundRobinTest, SpreadsCallsOverEveryServerAndSurvivesOneGoing) {
  std::vector<std::unique_ptr<MetricsServer>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start();
    ASSERT_TRUE(s.ok()) << s.status();
    addresses.push_back((*s)->process->address());
    servers.push_back(*std::move(s));
  }
  const std::string target = absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  client::ClientOptions options;
  options.lb_policy = "round_robin";
  options.timeout = absl::Seconds(30);
  // A call picked for a server in the instant between its death and the
  // channel seeing the connection go fails with UNAVAILABLE (the request may
  // have been written to the dead socket); a round-robin user retries it, and
  // the retry goes to a live server.
  options.retry = client::RetryPolicy::Enabled();
  options.retry.initial_backoff = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(target, options);
  ASSERT_TRUE(c.ok()) << c.status();

  for (std::uint32_t i = 0; i < 30; ++i) ASSERT_TRUE(CastIsExact(**c, i)) << "call " << i;
  ASSERT_EQ(c->get()->call_stats().retries, 0u) << "retries while all three served";

  double total = 0;
  std::vector<double> casts(servers.size());
  for (std::size_t i = 0; i < servers.size(); ++i) {
    absl::StatusOr<std::string> text = Scrape(servers[i]->metrics_port);
    ASSERT_TRUE(text.ok()) << text.status();
    casts[i] = Value(*text, Requests("Cast", "OK"));
    EXPECT_GT(casts[i], 0) << servers[i]->process->address() << " got no call";
    EXPECT_EQ(Value(*text, Received("Cast")), casts[i] * 3 * 5 * 4);
    total += casts[i];
  }
  EXPECT_EQ(total, 30);

  // One server dies without a goodbye; the channel drops it and the calls
  // go to the other two.
  ASSERT_EQ(kill(servers[1]->process->pid(), SIGKILL), 0);
  servers[1]->process->Stop();  // reaps it
  for (std::uint32_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(CastIsExact(**c, 100 + i)) << "call " << i << " after the kill";
  }
  // Only the calls caught in that instant were retried, not one call in three.
  EXPECT_LE(c->get()->call_stats().retries, 2u);
  // All 20 went to the two left, and both of them served some.
  double survivors = 0;
  for (int i : {0, 2}) {
    absl::StatusOr<std::string> text = Scrape(servers[i]->metrics_port);
    ASSERT_TRUE(text.ok()) << text.status();
    const double now = Value(*text, Requests("Cast", "OK"));
    EXPECT_GT(now, casts[i]) << servers[i]->process->address() << " got no call after the kill";
    survivors += now - casts[i];
  }
  EXPECT_EQ(survivors, 20);
}

TEST(RoundRobinTest, UnknownPolicyIsRefused) {
  client::ClientOptions options;
  options.lb_policy = "least_request";
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Create("127.0.0.1:1", options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("pick_first or round_robin"));
}

}  // namespace
}  // namespace logitd::testing
