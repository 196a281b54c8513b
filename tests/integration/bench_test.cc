// `logitctl bench` and the Probe RPC against a real cpu-backend server: the
// CI smoke test of the benchmark (a short --requests run of a tensor RPC and
// of the raw gRPC baseline, checked for complete, error-free, sane reports),
// the "logitd-timing" trailer through the client library, and the exact
// status codes of bad Probe requests.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// Small enough that a logits call of M=4096, K=64, V=1024 (16 MiB of fp32
// logits) is refused, and a Probe of more than this too.
constexpr std::uint64_t kMaxRequestBytes = 8u << 20;

class BenchTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer({absl::StrCat("--max_request_bytes=", kMaxRequestBytes)});
  }

  // Runs logitctl against the suite's server; stderr goes to the test log.
  static LogitctlRun Run(const std::vector<std::string>& args) {
    return RunAt(server_->process.address(), args);
  }
  // Runs logitctl against the server at `address`.
  static LogitctlRun RunAt(const std::string& address, const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--server=" + address};
    all.insert(all.end(), args.begin(), args.end());
    LogitctlRun r = RunLogitctl(all);
    std::cerr << r.err;
    return r;
  }
};

// One measured phase of a report: complete, error-free and ordered.
void ExpectSanePhase(const nlohmann::json& p, const std::string& rpc, std::int64_t requests) {
  SCOPED_TRACE(p.dump(2));
  EXPECT_EQ(p.at("rpc").get<std::string>(), rpc);
  EXPECT_EQ(p.at("requests").get<std::int64_t>(), requests);
  EXPECT_EQ(p.at("completed").get<std::int64_t>(), requests);
  EXPECT_EQ(p.at("error_count").get<std::int64_t>(), 0);
  EXPECT_TRUE(p.at("errors").empty());
  const nlohmann::json& lat = p.at("latency_ms");
  const double p50 = lat.at("p50").get<double>();
  const double p90 = lat.at("p90").get<double>();
  const double p99 = lat.at("p99").get<double>();
  const double max = lat.at("max").get<double>();
  EXPECT_GT(p50, 0);
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
  EXPECT_LE(p99, max);
  EXPECT_GT(p.at("requests_per_s").get<double>(), 0);
  EXPECT_GT(p.at("wall_s").get<double>(), 0);
  EXPECT_GT(p.at("up_gb_s").get<double>(), 0);
  EXPECT_GT(p.at("down_gb_s").get<double>(), 0);
  // Every call carried a trailer with the server's whole time and its send.
  const nlohmann::json& server = p.at("server_avg");
  EXPECT_GT(server.at("total_us").get<double>(), 0);
  EXPECT_FALSE(server.at("send_us").is_null());
  EXPECT_FALSE(server.at("receive_us").is_null());
  // The cpu backend has no device copies: reported absent, not as 0.
  EXPECT_TRUE(server.at("h2d_us").is_null());
  EXPECT_TRUE(server.at("d2h_us").is_null());
  // The slowest 1% (one request of fewer than 200): at least as slow as the
  // p99, its server split as the average's.
  const nlohmann::json& slowest = p.at("server_slowest");
  EXPECT_EQ(slowest.at("requests").get<std::int64_t>(),
            std::max<std::int64_t>(1, p.at("completed").get<std::int64_t>() / 100));
  EXPECT_GE(slowest.at("latency_ms").get<double>(), p99 * 0.999);
  EXPECT_LE(slowest.at("latency_ms").get<double>(), max * 1.001);
  EXPECT_GT(slowest.at("total_us").get<double>(), 0);
  EXPECT_TRUE(slowest.at("h2d_us").is_null());
}

TEST_F(BenchTest, LogitsReportsAndComparesWithTheBaseline) {
  const LogitctlRun r = Run({"bench", "--rpc=logits", "--m=4", "--k=64", "--v=256", "--requests",
                             "20", "--concurrency", "4", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << r.out;
  EXPECT_EQ(report.at("config").at("request_bytes").get<std::uint64_t>(), 4u * 64 * 2);
  EXPECT_EQ(report.at("config").at("response_bytes").get<std::uint64_t>(), 4u * 256 * 4);
  EXPECT_EQ(report.at("server_info").at("backend").get<std::string>(), "cpu");
  const nlohmann::json& phases = report.at("phases");
  ASSERT_EQ(phases.size(), 2u);
  ExpectSanePhase(phases[0], "logits", 20);
  ExpectSanePhase(phases[1], "baseline", 20);
  EXPECT_FALSE(phases[0].at("server_avg").at("compute_us").is_null());
  // The Probe does no tensor work.
  EXPECT_TRUE(phases[1].at("server_avg").at("compute_us").is_null());
  EXPECT_GT(report.at("efficiency").get<double>(), 0);
}

TEST_F(BenchTest, BaselineAloneOverSeveralConnections) {
  const LogitctlRun r = Run({"bench", "--rpc=baseline", "--m=4", "--k=64", "--v=256", "--requests",
                             "20", "--concurrency", "4", "--channels", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << r.out;
  ASSERT_EQ(report.at("phases").size(), 1u);
  ExpectSanePhase(report.at("phases")[0], "baseline", 20);
  EXPECT_TRUE(report.at("efficiency").is_null());
}

TEST_F(BenchTest, BackwardAndCrossEntropyRun) {
  for (const char* rpc : {"--rpc=backward", "--rpc=cross-entropy"}) {
    const LogitctlRun r = Run({"bench", rpc, "--m=4", "--k=64", "--v=256", "--requests=4",
                               "--concurrency=2", "--nobaseline", "--json"});
    ASSERT_EQ(r.exit_code, 0) << rpc << "\n" << r.out;
    const nlohmann::json report = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << r.out;
    ASSERT_EQ(report.at("phases").size(), 1u);
    EXPECT_EQ(report.at("phases")[0].at("completed").get<std::int64_t>(), 4) << rpc;
  }
}

TEST_F(BenchTest, FetchGradientMovesDwAgainstAProbeOfTheSameBytes) {
  const LogitctlRun r = Run({"bench", "--rpc=fetch-gradient", "--m=4", "--k=64", "--v=256",
                             "--requests=6", "--concurrency=2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << r.out;
  SCOPED_TRACE(report.dump(2));
  EXPECT_EQ(report.at("config").at("request_bytes").get<std::uint64_t>(), 0u);
  EXPECT_EQ(report.at("config").at("response_bytes").get<std::uint64_t>(), 256u * 64 * 4);
  const nlohmann::json& phases = report.at("phases");
  ASSERT_EQ(phases.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(phases[i].at("completed").get<std::int64_t>(), 6);
    EXPECT_EQ(phases[i].at("error_count").get<std::int64_t>(), 0);
    EXPECT_GT(phases[i].at("down_gb_s").get<double>(), 0);
  }
  EXPECT_EQ(phases[0].at("rpc").get<std::string>(), "fetch-gradient");
  EXPECT_EQ(phases[1].at("rpc").get<std::string>(), "baseline");
  // The trailer: the copy out of the gradient buffer, then the send.
  const nlohmann::json& server = phases[0].at("server_avg");
  EXPECT_FALSE(server.at("d2h_us").is_null());
  EXPECT_FALSE(server.at("send_us").is_null());
  EXPECT_GT(server.at("total_us").get<double>(), 0);
  EXPECT_GT(report.at("efficiency").get<double>(), 0);
}

TEST_F(BenchTest, VerifyIsMeasuredAgainstItsOperation) {
  // logitd's own outputs verified (every call must pass), against the
  // operation itself in the same run: every row, 2 of them, and the
  // cross-entropy's mean loss and lse.
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--rpc=verify-logits"},
        std::vector<std::string>{"--rpc=verify-logits", "--sample_rows=2"},
        std::vector<std::string>{"--rpc=verify-cross-entropy"},
        std::vector<std::string>{"--rpc=verify-cross-entropy", "--reduction=none",
                                 "--sample_rows=2"},
        std::vector<std::string>{"--rpc=verify-logprobs", "--temperature=0.75"},
        std::vector<std::string>{"--rpc=verify-logprobs", "--sample_rows=2"}}) {
    std::vector<std::string> args = {"bench",   "--m=6",        "--k=64",
                                     "--v=256", "--requests=3", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const LogitctlRun r = Run(args);
    ASSERT_EQ(r.exit_code, 0) << extra[0] << "\n" << r.out;
    const nlohmann::json report = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << r.out;
    SCOPED_TRACE(report.dump(2));
    const nlohmann::json& phases = report.at("phases");
    ASSERT_EQ(phases.size(), 2u);
    const bool logits = extra[0] == "--rpc=verify-logits";
    const std::string op = extra[0].substr(std::string("--rpc=verify-").size());
    EXPECT_EQ(phases[0].at("rpc").get<std::string>(), "verify-" + op);
    EXPECT_EQ(phases[1].at("rpc").get<std::string>(), op);
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(phases[i].at("completed").get<std::int64_t>(), 3);
      EXPECT_EQ(phases[i].at("error_count").get<std::int64_t>(), 0);
    }
    // Each phase counts its own bytes: X and Y up for the verify, Y down
    // for the logits.
    if (logits) {
      EXPECT_EQ(phases[0].at("request_bytes").get<std::uint64_t>(), 6u * 64 * 2 + 6u * 256 * 4);
      EXPECT_EQ(phases[1].at("response_bytes").get<std::uint64_t>(), 6u * 256 * 4);
    }
    if (op == "cross-entropy") {
      // X, the targets, the loss (one per token without a reduction) and
      // lse up; the same loss and lse down.
      const std::uint64_t loss = extra.size() > 1 ? 6u * 4 : 4u;
      EXPECT_EQ(phases[0].at("request_bytes").get<std::uint64_t>(),
                6u * 64 * 2 + 6u * 8 + loss + 6u * 4);
      EXPECT_EQ(phases[1].at("response_bytes").get<std::uint64_t>(), loss + 6u * 4);
    }
    if (op == "logprobs") {
      // X, the targets and three candidates up; the log-prob, lse and
      // entropy down.
      EXPECT_EQ(phases[0].at("request_bytes").get<std::uint64_t>(),
                6u * 64 * 2 + 6u * 8 + 3u * 6 * 4);
      EXPECT_EQ(phases[1].at("response_bytes").get<std::uint64_t>(), 3u * 6 * 4);
    }
    EXPECT_GT(report.at("verify_cost").get<double>(), 0);
    EXPECT_TRUE(report.at("efficiency").is_null());
  }
  // Rows sampled for the cross-entropy's mean loss are refused by the
  // server, each call counted; --sample_rows without a verify and an
  // unknown reduction are usage errors.
  const LogitctlRun sampled = Run({"bench", "--rpc=verify-cross-entropy", "--m=6", "--k=64",
                                   "--v=256", "--requests=2", "--warmup=0", "--sample_rows=2"});
  EXPECT_EQ(sampled.exit_code, 1) << sampled.out;
  EXPECT_NE(sampled.out.find("INVALID_ARGUMENT: sample_rows"), std::string::npos) << sampled.out;
  EXPECT_EQ(Run({"bench", "--rpc=logits", "--sample_rows=2"}).exit_code, 2);
  const LogitctlRun bad = Run({"bench", "--rpc=verify-cross-entropy", "--reduction=median"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--reduction: expected mean, sum or none"), std::string::npos) << bad.err;
}

TEST_F(BenchTest, FailedRequestsAreCountedByCodeAndExitOne) {
  // 16 MiB of logits per call, over the server's 8 MiB per call.
  const LogitctlRun r = Run({"bench", "--m=4096", "--k=64", "--v=1024", "--requests=3",
                             "--warmup=0", "--nobaseline", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << r.out;
  const nlohmann::json& p = report.at("phases")[0];
  EXPECT_EQ(p.at("completed").get<std::int64_t>(), 0);
  EXPECT_EQ(p.at("error_count").get<std::int64_t>(), 3);
  EXPECT_EQ(p.at("errors").at("RESOURCE_EXHAUSTED").at("count").get<std::int64_t>(), 3);
  // Said on stderr too, whatever the report's form: the exit 1 has its cause.
  EXPECT_NE(r.err.find("logitctl: bench: logits: 3 requests failed with RESOURCE_EXHAUSTED: "),
            std::string::npos)
      << r.err;
}

TEST_F(BenchTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run({"bench", "--rpc=gemm"}).exit_code, 2);
  EXPECT_EQ(Run({"bench", "--requests=5", "--duration=1"}).exit_code, 2);
  EXPECT_EQ(Run({"bench", "--concurrency=0"}).exit_code, 2);
  EXPECT_EQ(Run({"bench", "--out_dtype=fp16"}).exit_code, 2);
}

TEST_F(BenchTest, TimingTrailerThroughTheClientLibrary) {
  const Tensor w = IntBf16({256, 64}, 1);
  absl::StatusOr<client::WeightInfo> reg = client().RegisterWeight(w, "trailer");
  ASSERT_TRUE(reg.ok()) << reg.status();
  client::Timing timing;
  absl::StatusOr<Tensor> y = client().Logits(IntBf16({4, 64}, 2), reg->handle, {}, &timing);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(timing.trailer.has_value());
  EXPECT_TRUE(timing.trailer->compute_us.has_value());
  EXPECT_TRUE(timing.trailer->receive_us.has_value());
  EXPECT_TRUE(timing.trailer->send_us.has_value());
  ASSERT_TRUE(timing.trailer->total_us.has_value());
  EXPECT_GE(*timing.trailer->total_us, *timing.trailer->compute_us);
  EXPECT_FALSE(timing.trailer->h2d_us.has_value());
  EXPECT_FALSE(timing.trailer->d2h_us.has_value());
  // Existing callers without a Timing still work.
  EXPECT_TRUE(client().Logits(IntBf16({4, 64}, 2), reg->handle).ok());
  EXPECT_TRUE(client().ReleaseWeight(reg->handle).ok());
}

TEST(TimingTrailerParse, KnownKeysUnknownKeysAndMalformedText) {
  absl::StatusOr<client::TimingTrailer> t =
      client::ParseTimingTrailer("receive_us=5,compute_us=17,future_us=3,total_us=40");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->receive_us, 5);
  EXPECT_EQ(t->compute_us, 17);
  EXPECT_EQ(t->total_us, 40);
  EXPECT_FALSE(t->send_us.has_value());
  EXPECT_EQ(client::ParseTimingTrailer("compute_us").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client::ParseTimingTrailer("compute_us=x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BenchTest, ProbeMovesTheAskedBytes) {
  client::ProbeOptions options;
  options.request_bytes = 3u << 20;
  options.response_bytes = (4u << 20) + 7;  // not a multiple of the chunk size
  options.chunk_bytes = 1u << 20;
  absl::StatusOr<client::ProbeResult> r = client().Probe(options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->response_bytes, options.response_bytes);
  ASSERT_TRUE(r->trailer.has_value());
  EXPECT_TRUE(r->trailer->send_us.has_value());
  EXPECT_FALSE(r->trailer->compute_us.has_value());
  // Nothing either way is a valid probe too (the call's own latency).
  EXPECT_TRUE(client().Probe({}).ok());
}

TEST_F(BenchTest, ProbeOverTheRequestLimitIsResourceExhausted) {
  client::ProbeOptions options;
  options.request_bytes = 1u << 20;
  options.response_bytes = kMaxRequestBytes;  // together one MiB over
  absl::StatusOr<client::ProbeResult> r = client().Probe(options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--max_request_bytes"));
  // Sums that overflow 64 bits are refused the same way, not wrapped.
  options.request_bytes = ~std::uint64_t{0};
  options.response_bytes = 2;
  r = client().Probe(options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // Exactly at the limit is fine.
  options.request_bytes = 0;
  options.response_bytes = kMaxRequestBytes;
  EXPECT_TRUE(client().Probe(options).ok());
}

TEST_F(BenchTest, ProbeChunkLargerThanTheServersIsInvalidArgument) {
  client::ProbeOptions options;
  options.response_bytes = 1;
  options.chunk_bytes = (4u << 20) + 1;  // the server streams 4 MiB chunks
  absl::StatusOr<client::ProbeResult> r = client().Probe(options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("chunk_bytes"));
}

TEST_F(BenchTest, ProbeWithOtherBytesThanAnnouncedIsInvalidArgument) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(server_->process.address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Logitd::Stub> stub = v1::Logitd::NewStub(channel);
  for (const std::string& data : {std::string(5, 'x'), std::string(11, 'x')}) {
    grpc::ClientContext context;
    auto stream = stub->Probe(&context);
    v1::ProbeRequest header;
    header.mutable_header()->set_request_bytes(10);
    v1::ProbeRequest body;
    body.set_data(data);
    stream->Write(header);
    stream->Write(body);
    stream->WritesDone();
    v1::ProbeChunk chunk;
    while (stream->Read(&chunk)) {
    }
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << data.size();
    EXPECT_THAT(s.error_message(), HasSubstr("probe")) << s.error_message();
  }
}

}  // namespace
}  // namespace logitd::testing

namespace logitd::testing {
namespace {

// `logitctl stress` against the suite's server: every RPC, results checked.
class StressTest : public BenchTest {
 protected:
  // The JSON report that follows the table.
  static nlohmann::json Report(const LogitctlRun& r) {
    const std::size_t at = r.out.find("\n{");
    if (at == std::string::npos) return nlohmann::json();
    return nlohmann::json::parse(r.out.substr(at + 1), nullptr, false);
  }
  static std::vector<std::string> SmallStress(const std::string& seconds) {
    return {"stress",
            "--clients=3",
            "--duration=" + seconds,
            "--stress_max_m=16",
            "--stress_max_v=1000",
            "--stress_max_k=257",
            "--stress_max_output_bytes=2097152",
            "--json"};
  }
};

TEST_F(StressTest, EveryRpcRightAndExitZero) {
  const LogitctlRun r = RunAt(server_->process.address(), SmallStress("4"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json report = Report(r);
  ASSERT_TRUE(report.is_object()) << r.out;
  EXPECT_GT(report.at("calls").get<std::int64_t>(), 20);
  EXPECT_EQ(report.at("errors").get<std::int64_t>(), 0);
  EXPECT_EQ(report.at("wrong").get<std::int64_t>(), 0);
  EXPECT_EQ(report.at("hung").get<std::int64_t>(), 0);
  for (const char* rpc : {"Logits(fp32)", "Backward", "CrossEntropy", "LogProbs"}) {
    EXPECT_GT(report.at("rpcs").at(rpc).at("calls").get<std::int64_t>(), 0) << rpc;
  }
  // Verify of the server's own outputs, each operation's row by its name.
  std::int64_t verifies = 0;
  for (const auto& [rpc, row] : report.at("rpcs").items()) {
    if (rpc.rfind("Verify(", 0) == 0) verifies += row.at("calls").get<std::int64_t>();
  }
  EXPECT_GT(verifies, 0) << r.out;
  // Its weights are released again.
  absl::StatusOr<std::vector<client::WeightInfo>> left = client().ListWeights();
  ASSERT_TRUE(left.ok()) << left.status();
  for (const client::WeightInfo& w : *left) {
    EXPECT_EQ(w.name.rfind("stress-", 0), std::string::npos) << w.name;
  }
}

TEST_F(StressTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run({"stress", "--clients=0"}).exit_code, 2);
  EXPECT_EQ(Run({"stress", "--stress_max_v=3"}).exit_code, 2);
  EXPECT_EQ(Run({"stress", "extra"}).exit_code, 2);
}

// Every connection makes one call before the load; a server nobody can reach
// is reported after that call's attempts, with exit 2, and no load is run.
TEST_F(StressTest, UnreachableServerExitsTwoAfterConnecting) {
  const LogitctlRun r =
      RunAt(absl::StrCat("127.0.0.1:", UnusedPort()), {"stress", "--clients=2", "--duration=1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, ::testing::HasSubstr("connecting (attempt 1 of 3): UNAVAILABLE")) << r.err;
  EXPECT_THAT(r.err, ::testing::HasSubstr("client 0 cannot reach the server: UNAVAILABLE"))
      << r.err;
  EXPECT_THAT(r.err, ::testing::Not(::testing::HasSubstr("calls in"))) << r.err;
}

#ifdef LOGITD_TEST_FAULTS_ENABLED
// Against a server whose Logits outputs are wrong in one bit, the stress
// run must say so and fail.
TEST_F(StressTest, WrongResultsAreCountedAndExitOne) {
  absl::StatusOr<ServerProcess> faulty =
      ServerProcess::Start(ServerBinary(), {"--backend=cpu", "--test_fault=logits_bit"});
  ASSERT_TRUE(faulty.ok()) << faulty.status();
  const LogitctlRun r = RunAt(faulty->address(), SmallStress("3"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const nlohmann::json report = Report(r);
  ASSERT_TRUE(report.is_object()) << r.out;
  EXPECT_GT(report.at("wrong").get<std::int64_t>(), 0);
  EXPECT_GT(report.at("rpcs").at("Logits(fp32)").at("wrong").get<std::int64_t>(), 0);
  EXPECT_TRUE(report.at("rpcs").at("Logits(fp32)").contains("first_problem"));
}
#endif

}  // namespace
}  // namespace logitd::testing
