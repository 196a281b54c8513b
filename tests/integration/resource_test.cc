// Resource safety against the real server: request memory is accounted in
// ServerInfo and comes back however a call ends (cancelled mid-stream, past
// its deadline), calls that cannot fit the request-memory budget or the
// concurrency cap get RESOURCE_EXHAUSTED (or DEADLINE_EXCEEDED) instead of
// an allocation, and releasing a weight while calls on it run is safe.
// Streams that stop half-way go through the generated stub: the client
// library always sends whole tensors.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kV = 64;
constexpr std::int64_t kK = 128;
// Chunks the partial streams send their tensors in.
constexpr std::size_t kChunk = 4096;

struct Server {
  std::unique_ptr<SharedServer> shared;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Logitd::Stub> stub;
  Tensor weight;
  std::string handle;
};

std::unique_ptr<Server> StartServer(const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<SharedServer>> s = SharedServer::Start(args);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  auto server = std::make_unique<Server>();
  server->shared = std::move(*s);
  server->channel =
      grpc::CreateChannel(server->shared->process.address(), grpc::InsecureChannelCredentials());
  server->stub = v1::Logitd::NewStub(server->channel);
  server->weight = IntBf16({kV, kK}, 21);
  absl::StatusOr<client::WeightInfo> info =
      server->shared->client->RegisterWeight(server->weight, "w");
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return nullptr;
  server->handle = info->handle;
  return server;
}

v1::ServerInfo Info(Server& s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerInfo info;
  const grpc::Status st = s.stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return info;
}

// Polls until the server reports `bytes` and `requests` in flight (or 10 s).
::testing::AssertionResult InFlightBecomes(Server& s, std::uint64_t bytes, std::uint32_t requests) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  v1::ServerInfo info;
  do {
    info = Info(s);
    if (info.request_bytes_in_flight() == bytes && info.requests_in_flight() == requests) {
      return ::testing::AssertionSuccess();
    }
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() < until);
  return ::testing::AssertionFailure()
         << "in flight: " << info.request_bytes_in_flight() << " bytes, "
         << info.requests_in_flight() << " requests; expected " << bytes << " bytes, " << requests
         << " requests";
}

// The chunk messages of `t` as request type R.
template <typename R>
std::vector<R> ChunksOf(const std::string& name, const Tensor& t) {
  std::vector<R> out;
  absl::Status s = wire::SendChunks(name, t.bytes(), t.nbytes(), kChunk, [&](v1::TensorChunk&& c) {
    R r;
    *r.mutable_chunk() = std::move(c);
    out.push_back(std::move(r));
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// A call whose messages are written by hand: the header and then as many of
// the chunks as the test wants.
struct Call {
  enum Kind { kLogits, kBackward, kCast, kCrossEntropy };
  Kind kind = kLogits;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::LogitsRequest, v1::LogitsResponse>> logits;
  std::unique_ptr<grpc::ClientReaderWriter<v1::BackwardRequest, v1::BackwardResponse>> backward;
  std::unique_ptr<grpc::ClientReaderWriter<v1::CastRequest, v1::CastResponse>> cast;
  std::unique_ptr<grpc::ClientReaderWriter<v1::CrossEntropyRequest, v1::CrossEntropyResponse>> ce;
  std::vector<v1::LogitsRequest> logits_msgs;
  std::vector<v1::BackwardRequest> backward_msgs;
  std::vector<v1::CastRequest> cast_msgs;
  std::vector<v1::CrossEntropyRequest> ce_msgs;
  // Request memory the server reserves for the call.
  std::uint64_t bytes = 0;
  bool closed = false;

  std::size_t messages() const {
    switch (kind) {
      case kLogits:
        return logits_msgs.size();
      case kBackward:
        return backward_msgs.size();
      case kCast:
        return cast_msgs.size();
      case kCrossEntropy:
        return ce_msgs.size();
    }
    return 0;
  }
  // Writes messages [from, to); false when the call is gone.
  bool Send(std::size_t from, std::size_t to) {
    bool ok = true;
    for (std::size_t i = from; i < to && ok; ++i) {
      switch (kind) {
        case kLogits:
          ok = logits->Write(logits_msgs[i]);
          break;
        case kBackward:
          ok = backward->Write(backward_msgs[i]);
          break;
        case kCast:
          ok = cast->Write(cast_msgs[i]);
          break;
        case kCrossEntropy:
          ok = ce->Write(ce_msgs[i]);
          break;
      }
    }
    return ok;
  }
  // Ends the request stream (once).
  void Close() {
    if (closed) return;
    closed = true;
    switch (kind) {
      case kLogits:
        logits->WritesDone();
        break;
      case kBackward:
        backward->WritesDone();
        break;
      case kCast:
        cast->WritesDone();
        break;
      case kCrossEntropy:
        ce->WritesDone();
        break;
    }
  }
  // Waits for the call's status; `half_close` ends the request stream first
  // (without it, a call that stopped half-way stays open until its deadline).
  grpc::Status Finish(bool half_close = true) {
    if (half_close) Close();
    switch (kind) {
      case kLogits:
        return logits->Finish();
      case kBackward:
        return backward->Finish();
      case kCast:
        return cast->Finish();
      case kCrossEntropy:
        return ce->Finish();
    }
    return grpc::Status::OK;
  }
  // Reads the response of a call that completed (logits only): y.
  absl::StatusOr<Tensor> ReadLogits() {
    Close();
    v1::LogitsResponse r;
    if (!logits->Read(&r) || !r.has_result()) return absl::InternalError("no logits result");
    wire::Assembler a(~std::uint64_t{0});
    absl::Status s = a.Expect(r.result().y());
    while (s.ok() && logits->Read(&r)) s = a.Add(r.chunk());
    if (s.ok()) s = a.Finish();
    if (!s.ok()) return s;
    return a.Take("y");
  }
};

// Opens a call of `kind` with M rows against the weight [kV, kK] and prepares
// its messages (nothing is sent yet).
std::unique_ptr<Call> OpenCall(Server& s, Call::Kind kind, std::int64_t m, std::uint32_t seed,
                               absl::Duration timeout = absl::Seconds(60)) {
  auto c = std::make_unique<Call>();
  c->kind = kind;
  c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const Tensor x = IntBf16({m, kK}, seed);
  const std::uint64_t um = static_cast<std::uint64_t>(m);
  switch (kind) {
    case Call::kLogits: {
      v1::LogitsRequest h;
      h.mutable_header()->set_weight_handle(s.handle);
      *h.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
      c->logits_msgs.push_back(h);
      for (auto& r : ChunksOf<v1::LogitsRequest>("x", x)) c->logits_msgs.push_back(r);
      c->logits = s.stub->Logits(&c->ctx);
      c->bytes = um * kK * 2 + um * kV * 4;
      break;
    }
    case Call::kBackward: {
      const Tensor dy = IntFp32({m, kV}, seed + 1);
      v1::BackwardRequest h;
      h.mutable_header()->set_weight_handle(s.handle);
      *h.mutable_header()->mutable_dy() = wire::MakeSpec("dy", dy);
      *h.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
      h.mutable_header()->set_want_dx(true);
      h.mutable_header()->set_want_dw(true);
      c->backward_msgs.push_back(h);
      for (auto& r : ChunksOf<v1::BackwardRequest>("dy", dy)) c->backward_msgs.push_back(r);
      for (auto& r : ChunksOf<v1::BackwardRequest>("x", x)) c->backward_msgs.push_back(r);
      c->backward = s.stub->Backward(&c->ctx);
      // dy fp32, x bf16, dx bf16 [M, K], dw fp32 [V, K].
      c->bytes = um * kV * 4 + um * kK * 2 + um * kK * 2 + kV * kK * 4;
      break;
    }
    case Call::kCast: {
      const Tensor in = IntFp32({m, kK}, seed);
      v1::CastRequest h;
      *h.mutable_header()->mutable_input() = wire::MakeSpec("input", in);
      c->cast_msgs.push_back(h);
      for (auto& r : ChunksOf<v1::CastRequest>("input", in)) c->cast_msgs.push_back(r);
      c->cast = s.stub->Cast(&c->ctx);
      c->bytes = um * kK * 4 + um * kK * 2;
      break;
    }
    case Call::kCrossEntropy: {
      Tensor targets(DType::kInt64, {m});
      for (std::int64_t i = 0; i < m; ++i) targets.data<std::int64_t>()[i] = (i * 7 + seed) % kV;
      v1::CrossEntropyRequest h;
      h.mutable_header()->set_weight_handle(s.handle);
      *h.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
      *h.mutable_header()->mutable_targets() = wire::MakeSpec("targets", targets);
      h.mutable_header()->set_want_dx(true);
      c->ce_msgs.push_back(h);
      for (auto& r : ChunksOf<v1::CrossEntropyRequest>("x", x)) c->ce_msgs.push_back(r);
      for (auto& r : ChunksOf<v1::CrossEntropyRequest>("targets", targets)) {
        c->ce_msgs.push_back(r);
      }
      c->ce = s.stub->CrossEntropy(&c->ctx);
      // x, targets, mean loss [1], dx bf16, widened targets, per-token loss.
      c->bytes = um * kK * 2 + um * 8 + 4 + um * kK * 2 + um * 8 + um * 4;
      break;
    }
  }
  return c;
}

class ResourceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_ == nullptr) return;
    // Whatever the test did, the server still computes right.
    client::Client& client = *server_->shared->client;
    ASSERT_TRUE(ServerAnswers(client)) << server_->shared->process.Log();
    const Tensor x = IntBf16({3, kK}, 5);
    absl::StatusOr<Tensor> y = client.Logits(x, server_->handle);
    if (y.ok()) {
      EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, server_->weight), {3, kV}));
    } else {
      EXPECT_EQ(y.status().code(), absl::StatusCode::kNotFound) << y.status();
    }
  }
  std::unique_ptr<Server> server_;
};

TEST_F(ResourceTest, ServerInfoReportsTheRequestMemoryBudgetAndCap) {
  server_ = StartServer({"--request_memory_bytes=123456789", "--max_concurrent_requests=7"});
  ASSERT_NE(server_, nullptr);
  const v1::ServerInfo info = Info(*server_);
  EXPECT_EQ(info.request_memory_bytes(), 123456789u);
  EXPECT_EQ(info.max_concurrent_requests(), 7u);
  EXPECT_EQ(info.request_bytes_in_flight(), 0u);
  EXPECT_EQ(info.requests_in_flight(), 0u);
  // The upload of the weight was accounted while it ran.
  EXPECT_EQ(info.request_bytes_high_water(), static_cast<std::uint64_t>(kV * kK * 2));
}

// 200 streams that stop half-way, cancelled by the client or by their
// deadline, across the four tensor calls: every byte they held comes back.
TEST_F(ResourceTest, CancelledAndExpiredStreamsReturnEveryByte) {
  server_ = StartServer({});
  ASSERT_NE(server_, nullptr);
  const v1::ServerInfo start = Info(*server_);
  const std::uint64_t bytes0 = start.request_bytes_in_flight();
  const std::uint32_t requests0 = start.requests_in_flight();

  // Eight at a time (under the server's thread pool on a small machine).
  constexpr int kStreams = 200;
  constexpr int kBatch = 8;
  int cancelled = 0;
  int expired = 0;
  for (int first = 0; first < kStreams; first += kBatch) {
    std::vector<std::unique_ptr<Call>> calls;
    std::uint64_t held = 0;
    for (int i = first; i < first + kBatch; ++i) {
      const auto kind = static_cast<Call::Kind>(i % 4);
      const bool by_deadline = (i / 4) % 2 == 1;
      auto c = OpenCall(*server_, kind, 16 + (i % 5) * 16, static_cast<std::uint32_t>(i),
                        !by_deadline ? absl::Seconds(60)
                        : first == 0 ? absl::Seconds(2)  // observed in flight first
                                     : absl::Milliseconds(300));
      // The header and about half of the chunks.
      c->Send(0, 1 + (c->messages() - 1) / 2);
      held += c->bytes;
      calls.push_back(std::move(c));
    }
    // Every call of the first batch is seen holding its memory first, so
    // the accounting is known to have counted what must come back.
    if (first == 0) {
      ASSERT_TRUE(InFlightBecomes(*server_, bytes0 + held, requests0 + kBatch));
    }
    for (int j = 0; j < kBatch; ++j) {
      const bool by_deadline = ((first + j) / 4) % 2 == 1;
      if (!by_deadline) calls[j]->ctx.TryCancel();
    }
    for (int j = 0; j < kBatch; ++j) {
      const bool by_deadline = ((first + j) / 4) % 2 == 1;
      // The stalled stream stays open: the server must see the deadline
      // pass (or the cancellation), not a truncated stream.
      const grpc::Status st = calls[j]->Finish(/*half_close=*/false);
      if (by_deadline) {
        EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
            << "stream " << first + j << ": " << st.error_message();
        ++expired;
      } else {
        EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED)
            << "stream " << first + j << ": " << st.error_message();
        ++cancelled;
      }
    }
  }
  EXPECT_EQ(cancelled + expired, kStreams);
  EXPECT_EQ(cancelled, kStreams / 2);
  EXPECT_TRUE(InFlightBecomes(*server_, bytes0, requests0)) << server_->shared->process.Log();
  const v1::ServerInfo end = Info(*server_);
  EXPECT_GT(end.request_bytes_high_water(), bytes0);
}

// 200 Logits calls whose clients cancel half-way through the download (one
// message read of sixteen): the server records every one as
// CANCELLED, its log line and its metric, never UNAVAILABLE, whichever of the
// failed write and gRPC's cancellation flag it sees first.
TEST_F(ResourceTest, CancelsMidDownloadAreRecordedAsCancelled) {
  server_ = StartServer({"--chunk_bytes=65536"});
  ASSERT_NE(server_, nullptr);
  constexpr int kCalls = 200;
  for (int i = 0; i < kCalls; ++i) {
    // Y is 4096 × 64 fp32, 1 MiB: sixteen chunks.
    auto c = OpenCall(*server_, Call::kLogits, 4096, 1000 + static_cast<std::uint32_t>(i));
    ASSERT_TRUE(c->Send(0, c->messages())) << i;
    c->Close();
    v1::LogitsResponse r;
    ASSERT_TRUE(c->logits->Read(&r)) << i;
    c->ctx.TryCancel();
    const grpc::Status st = c->logits->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << i << ": " << st.error_message();
  }
  // Every call's line, as the server wrote it once the call ended.
  const auto count = [&](const std::string& what) {
    const std::string log = server_->shared->process.Log();
    int n = 0;
    for (std::size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) {
      ++n;
    }
    return n;
  };
  // (A call whose last chunk was written before the cancel arrived ends OK.)
  const auto ended = [&] {
    return count("rpc=Logits code=CANCELLED") + count("rpc=Logits code=OK") +
           count("rpc=Logits code=UNAVAILABLE");
  };
  const absl::Time until = absl::Now() + absl::Seconds(90);
  while (ended() < kCalls && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(ended(), kCalls) << server_->shared->process.Log();
  EXPECT_EQ(count("rpc=Logits code=UNAVAILABLE"), 0) << server_->shared->process.Log();
  // Most are cancelled mid-download (a loaded machine lets some finish first).
  EXPECT_GT(count("rpc=Logits code=CANCELLED"), 0) << server_->shared->process.Log();
}

TEST_F(ResourceTest, CallLargerThanTheWholeBudgetIsResourceExhaustedAtOnce) {
  // 1 MiB of request memory; the call needs 2 MiB (x 1 MiB + y 1 MiB), well
  // under --max_request_bytes.
  server_ = StartServer({"--request_memory_bytes=1048576"});
  ASSERT_NE(server_, nullptr);
  const Tensor x = IntBf16({4096, kK}, 3);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<Tensor> y = server_->shared->client->Logits(x, server_->handle);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kResourceExhausted) << y.status();
  EXPECT_THAT(std::string(y.status().message()), HasSubstr("--request_memory_bytes"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "refused without waiting";
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
}

TEST_F(ResourceTest, CallThatDoesNotFitWaitsThenGetsResourceExhaustedOrDeadlineExceeded) {
  // 64 KiB of memory, at most two calls, a second of waiting.
  server_ = StartServer(
      {"--request_memory_bytes=65536", "--max_concurrent_requests=2", "--admission_wait=1s"});
  ASSERT_NE(server_, nullptr);
  // Holds 40 KiB (x 20 KiB + y 20 KiB): admitted, then stalls mid-stream.
  auto holder = OpenCall(*server_, Call::kLogits, 80, 1);
  ASSERT_EQ(holder->bytes, 40960u);
  holder->Send(0, 2);
  ASSERT_TRUE(InFlightBecomes(*server_, 40960, 1));

  // The same again does not fit next to it: waits --admission_wait, refused.
  {
    auto c = OpenCall(*server_, Call::kLogits, 80, 2);
    c->Send(0, c->messages());
    const absl::Time t0 = absl::Now();
    const grpc::Status st = c->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("request memory"));
    EXPECT_GE(absl::Now() - t0, absl::Milliseconds(800));
  }
  // With a deadline shorter than the wait: DEADLINE_EXCEEDED.
  {
    auto c = OpenCall(*server_, Call::kLogits, 80, 3, absl::Milliseconds(200));
    c->Send(0, c->messages());
    const grpc::Status st = c->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  }
  // A small call still fits in memory, and takes the second slot.
  auto second = OpenCall(*server_, Call::kLogits, 8, 4);
  second->Send(0, 1);
  ASSERT_TRUE(InFlightBecomes(*server_, 40960 + second->bytes, 2));
  // A third call waits for a slot, and is refused when none comes free.
  {
    auto c = OpenCall(*server_, Call::kLogits, 1, 5);
    c->Send(0, c->messages());
    const grpc::Status st = c->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("--max_concurrent_requests"));
  }
  // A waiting call is admitted as soon as the holder finishes.
  auto waiting = OpenCall(*server_, Call::kLogits, 80, 6);
  waiting->Send(0, waiting->messages());
  absl::SleepFor(absl::Milliseconds(100));
  holder->ctx.TryCancel();
  EXPECT_EQ(holder->Finish().error_code(), grpc::StatusCode::CANCELLED);
  absl::StatusOr<Tensor> y = waiting->ReadLogits();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(IntBf16({80, kK}, 6), server_->weight), {80, kV}));
  EXPECT_TRUE(waiting->Finish().ok());
  second->Send(1, second->messages());
  EXPECT_TRUE(second->ReadLogits().ok());
  EXPECT_TRUE(second->Finish().ok());
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
}

// A call that looked its weight up keeps it until it ends: releasing the
// weight meanwhile neither breaks the call nor the server.
TEST_F(ResourceTest, ReleasingAWeightUnderARunningCallIsSafe) {
  server_ = StartServer({});
  ASSERT_NE(server_, nullptr);
  auto c = OpenCall(*server_, Call::kLogits, 32, 7);
  c->Send(0, 2);
  ASSERT_TRUE(InFlightBecomes(*server_, c->bytes, 1));
  absl::StatusOr<std::uint64_t> freed =
      server_->shared->client->ReleaseWeight(server_->handle, /*force=*/true);
  ASSERT_TRUE(freed.ok()) << freed.status();
  c->Send(2, c->messages());
  absl::StatusOr<Tensor> y = c->ReadLogits();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(IntBf16({32, kK}, 7), server_->weight), {32, kV}));
  EXPECT_TRUE(c->Finish().ok());
  // A new call on the released handle: NOT_FOUND.
  absl::StatusOr<Tensor> after =
      server_->shared->client->Logits(IntBf16({2, kK}, 8), server_->handle);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound) << after.status();
}

TEST_F(ResourceTest, ReleaseAndRegisterRacingWithCallsGiveRightResultsOrNotFound) {
  server_ = StartServer({});
  ASSERT_NE(server_, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> not_found{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<std::unique_ptr<client::Client>> cl = server_->shared->NewClient();
      ASSERT_TRUE(cl.ok()) << cl.status();
      int i = 0;
      while (!stop.load()) {
        const Tensor x = IntBf16({4, kK}, static_cast<std::uint32_t>(100 * t + i++));
        absl::StatusOr<Tensor> y = (*cl)->Logits(x, server_->handle);
        if (y.ok()) {
          EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, server_->weight), {4, kV}));
          ++ok;
        } else {
          EXPECT_EQ(y.status().code(), absl::StatusCode::kNotFound) << y.status();
          ++not_found;
        }
      }
    });
  }
  client::Client& client = *server_->shared->client;
  for (int round = 0; round < 20; ++round) {
    absl::SleepFor(absl::Milliseconds(20));
    absl::StatusOr<std::uint64_t> freed = client.ReleaseWeight(server_->handle, /*force=*/true);
    EXPECT_TRUE(freed.ok()) << freed.status();
    absl::SleepFor(absl::Milliseconds(10));
    absl::StatusOr<client::WeightInfo> info = client.RegisterWeight(server_->weight, "w");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->handle, server_->handle);
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
}

// A Verify call that stops half-way and is cancelled, or that holds more
// than --max_request_bytes allows, returns everything it held; the server
// keeps judging the next one.
TEST_F(ResourceTest, VerifyCancelledOrTooLargeReturnsEveryByte) {
  server_ = StartServer({"--max_request_bytes=4000000"});
  ASSERT_NE(server_, nullptr);
  const std::int64_t m = 512;
  const Tensor x = IntBf16({m, kK}, 31);
  const Tensor y = IntFp32({m, kV}, 32);
  const auto header = [&](const Tensor& xt, const Tensor& yt) {
    v1::VerifyRequest h;
    h.mutable_header()->set_operation(v1::VERIFY_LOGITS);
    h.mutable_header()->set_weight_handle(server_->handle);
    *h.mutable_header()->mutable_x() = wire::MakeSpec("x", xt);
    *h.mutable_header()->add_candidates() = wire::MakeSpec("y", yt);
    return h;
  };
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto stream = server_->stub->Verify(&ctx);
    ASSERT_TRUE(stream->Write(header(x, y)));
    std::vector<v1::VerifyRequest> chunks = ChunksOf<v1::VerifyRequest>("x", x);
    for (std::size_t i = 0; i < chunks.size() / 2; ++i) ASSERT_TRUE(stream->Write(chunks[i]));
    // Seen holding its memory, then cancelled.
    const absl::Time until = absl::Now() + absl::Seconds(10);
    v1::ServerInfo info;
    do {
      info = Info(*server_);
    } while (info.requests_in_flight() == 0 && absl::Now() < until);
    EXPECT_EQ(info.requests_in_flight(), 1u);
    EXPECT_GT(info.request_bytes_in_flight(), static_cast<std::uint64_t>(m * kK * 2));
    ctx.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));

  // x [8192, 128] bf16 + y [8192, 64] fp32 twice (the candidate and logitd's
  // own) is over 4 MB: refused from the header alone.
  const Tensor big_x = IntBf16({8192, kK}, 33);
  const Tensor big_y = IntFp32({8192, kV}, 34);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto stream = server_->stub->Verify(&ctx);
  ASSERT_TRUE(stream->Write(header(big_x, big_y)));
  stream->WritesDone();
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("verify"));
  EXPECT_THAT(st.error_message(), HasSubstr("max_request_bytes"));
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));

  client::VerifyArgs ok;
  ok.operation = client::VerifyOperation::kLogits;
  ok.weight_handle = server_->handle;
  ok.x = x;
  absl::StatusOr<Tensor> own = server_->shared->client->Logits(x, server_->handle);
  ASSERT_TRUE(own.ok()) << own.status();
  ok.candidates["y"] = *own;
  absl::StatusOr<client::VerifyResult> r = server_->shared->client->Verify(ok);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->verdict, "bitwise_equal_to_logitd");
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
}

// logitd's own outputs are formed while a Verify's candidates still
// arrive: bytes that then miss their digest end the call with DATA_LOSS
// (naming the tensor), a call cancelled then returns what it held, and
// the server judges the next call as before.
TEST_F(ResourceTest, VerifyBytesThatMissTheirDigestOrACancelLateInTheStreamKeepNothing) {
  server_ = StartServer({});
  ASSERT_NE(server_, nullptr);
  const std::int64_t m = 256;
  const Tensor x = IntBf16({m, kK}, 41);
  absl::StatusOr<Tensor> own = server_->shared->client->Logits(x, server_->handle);
  ASSERT_TRUE(own.ok()) << own.status();
  const Tensor other = IntBf16({m, kK}, 42);
  const Tensor other_y = IntFp32({m, kV}, 43);
  // The header announces `x_spec_of` and `y_spec_of`; x and the logits
  // follow as they are.
  const auto send = [&](const Tensor& x_spec_of, const Tensor& y_spec_of, bool cancel) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto stream = server_->stub->Verify(&ctx);
    v1::VerifyRequest h;
    h.mutable_header()->set_operation(v1::VERIFY_LOGITS);
    h.mutable_header()->set_weight_handle(server_->handle);
    *h.mutable_header()->mutable_x() = wire::MakeSpec("x", x_spec_of);
    *h.mutable_header()->add_candidates() = wire::MakeSpec("y", y_spec_of);
    EXPECT_TRUE(stream->Write(h));
    for (const v1::VerifyRequest& c : ChunksOf<v1::VerifyRequest>("x", x)) {
      EXPECT_TRUE(stream->Write(c));
    }
    std::vector<v1::VerifyRequest> y = ChunksOf<v1::VerifyRequest>("y", *own);
    if (cancel) {
      // x whole, half of y: logitd's own outputs may be under way.
      for (std::size_t i = 0; i < y.size() / 2; ++i) EXPECT_TRUE(stream->Write(y[i]));
      absl::SleepFor(absl::Milliseconds(200));
      ctx.TryCancel();
    } else {
      for (const v1::VerifyRequest& c : y) EXPECT_TRUE(stream->Write(c));
      stream->WritesDone();
    }
    v1::VerifyResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  };
  grpc::Status st = send(other, *own, false);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DATA_LOSS) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("x: xxh3 digest"));
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
  st = send(x, other_y, false);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DATA_LOSS) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("y: xxh3 digest"));
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
  st = send(x, *own, true);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));

  client::VerifyArgs ok;
  ok.operation = client::VerifyOperation::kLogits;
  ok.weight_handle = server_->handle;
  ok.x = x;
  ok.candidates["y"] = *own;
  absl::StatusOr<client::VerifyResult> r = server_->shared->client->Verify(ok);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->verdict, "bitwise_equal_to_logitd");
  EXPECT_TRUE(InFlightBecomes(*server_, 0, 0));
}

}  // namespace
}  // namespace logitd::testing
