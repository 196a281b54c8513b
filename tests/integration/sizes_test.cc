// Sizes: a 128 MiB fp32 response reassembled from chunks, a server streaming
// with an odd chunk size, and the server's request and weight limits
// (RESOURCE_EXHAUSTED with the limit in the message, the server still up).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/stub_calls.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// The fp32 logits of integer-valued X [m, k] (seed + 1) against W [v, k]
// (seed), registered on `c`; an error when the call fails or when they are
// not the exact sums (with the first difference).
absl::StatusOr<Tensor> ExactLogitsOfIntegers(client::Client& c, std::int64_t m, std::int64_t v,
                                             std::int64_t k, std::uint32_t seed) {
  const Tensor w = IntBf16({v, k}, seed);
  const Tensor x = IntBf16({m, k}, seed + 1);
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "w");
  if (!info.ok()) return info.status();
  absl::StatusOr<Tensor> y = c.Logits(x, info->handle);
  if (!y.ok()) return y.status();
  if (::testing::AssertionResult exact = Fp32EqualsExact(*y, ExactNT(x, w), {m, v}); !exact) {
    return absl::DataLossError(absl::StrCat("logits are not the exact sums: ", exact.message()));
  }
  return y;
}

// A server that streams its responses in chunks of `chunk` bytes.
absl::StatusOr<std::unique_ptr<SharedServer>> StartWithChunks(std::uint64_t chunk) {
  return SharedServer::Start({absl::StrCat("--chunk_bytes=", chunk)});
}

// M = 1024, V = 32768: Y is 2^25 fp32 values = 128 MiB, 32 server chunks of
// 4 MiB. K = 64 keeps the server's and the reference's arithmetic cheap.
TEST(SizesTest, Logits128MiBResponseIsIntact) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  const std::int64_t m = 1024, v = 32768, k = 64;
  absl::StatusOr<Tensor> y = ExactLogitsOfIntegers(c, m, v, k, 801);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_EQ(y->nbytes(), std::size_t{128} << 20);
  EXPECT_TRUE(ServerAnswers(c));
}

// Chunks past the default make messages over the 4 MiB that stock clients
// accept: the server says so at start and in ServerInfo, a default-options
// client is refused with gRPC's RESOURCE_EXHAUSTED, and a client that raised
// its limit (the C++ library does) gets its answer.
TEST(SizesTest, ChunksPastTheDefaultNeedARaisedClientLimitAndSaySo) {
  const std::uint64_t chunk = std::uint64_t{8} << 20;
  absl::StatusOr<std::unique_ptr<SharedServer>> server = StartWithChunks(chunk);
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  absl::StatusOr<client::ServerInfo> info = c.Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_send_message_bytes, chunk + kChunkFramingBytes);
  EXPECT_EQ(info->max_request_chunk_bytes, chunk);
  EXPECT_EQ(info->max_receive_message_bytes, chunk + kChunkFramingBytes);
  EXPECT_THAT((*server)->process.Log(), HasSubstr("clients must raise their receive limit"));

  const Tensor w = IntBf16({16384, 64}, 821);
  const Tensor x = IntBf16({256, 64}, 822);  // Y: 16 MiB, two 8 MiB chunks
  absl::StatusOr<client::WeightInfo> reg = c.RegisterWeight(w, "w");
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(c.Logits(x, reg->handle).ok());

  auto stub = v1::Logitd::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = stub->Logits(&context);
  v1::LogitsRequest request;
  request.mutable_header()->set_weight_handle(reg->handle);
  *request.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(WriteChunks<v1::LogitsRequest>(*stream, "x", x));
  stream->WritesDone();
  ReadAll<v1::LogitsResponse>(*stream);
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("larger than max"));
  EXPECT_TRUE(ServerAnswers(c));
}

// Each tensor call runs on a thread of its own, up to a bound; one more call
// is refused at once with RESOURCE_EXHAUSTED saying to retry, and the server
// goes on serving when the others end.
TEST(SizesTest, CallsPastTheThreadBoundAreResourceExhausted) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server =
      SharedServer::Start({"--max_concurrent_requests=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  const Tensor x = IntBf16({4, 64}, 832);
  absl::StatusOr<client::WeightInfo> reg = c.RegisterWeight(IntBf16({128, 64}, 831), "w");
  ASSERT_TRUE(reg.ok()) << reg.status();
  // The server's bound: max(16, 4 per hardware thread, 2 per admitted call).
  const int bound =
      std::max(16, 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  auto stub = v1::Logitd::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  v1::LogitsRequest header;
  header.mutable_header()->set_weight_handle(reg->handle);
  *header.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
  // Calls that send their header and then nothing: each holds its thread.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::LogitsRequest, v1::LogitsResponse>>>
      held;
  for (int i = 0; i < bound; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadline(contexts.back().get());
    held.push_back(stub->Logits(contexts.back().get()));
    ASSERT_TRUE(held.back()->Write(header)) << i;
  }
  // The held calls take their threads as the server gets to them, later on a
  // loaded machine: until then one more call may still find a thread (and
  // waits for admission until its short deadline, or is admitted ahead of
  // them and ends for want of X). Once all are taken, the next is refused at
  // once.
  grpc::Status status;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  do {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    auto extra = stub->Logits(&context);
    extra->Write(header);
    extra->WritesDone();
    v1::LogitsResponse ignored;
    while (extra->Read(&ignored)) {
    }
    status = extra->Finish();
  } while ((status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
            status.error_code() == grpc::StatusCode::DATA_LOSS) &&
           absl::Now() < give_up);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("as many calls as it has threads for"));
  for (auto& ctx : contexts) ctx->TryCancel();
  for (auto& stream : held) stream->Finish();
  EXPECT_TRUE(ServerAnswers(c));
  // The server lets go of a cancelled call's thread once that call notices:
  // a call right after may still be refused for want of one, never for long.
  absl::Status after;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  do {
    after = c.Logits(x, reg->handle).status();
  } while (after.code() == absl::StatusCode::kResourceExhausted && absl::Now() < until);
  EXPECT_TRUE(after.ok()) << after;
}

TEST(SizesTest, OddServerChunkSizeReassembles) {
  const std::uint64_t chunk = 100003;  // not a multiple of any element size
  absl::StatusOr<std::unique_ptr<SharedServer>> server = StartWithChunks(chunk);
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  EXPECT_EQ(c.Info()->chunk_bytes, chunk);

  const std::int64_t m = 64, v = 8192, k = 96;  // 2 MiB of fp32 logits, 21 chunks
  ASSERT_TRUE(ExactLogitsOfIntegers(c, m, v, k, 811).ok());
  const Tensor w = IntBf16({v, k}, 811);
  const Tensor x = IntBf16({m, k}, 812);
  absl::StatusOr<client::WeightInfo> reg = c.RegisterWeight(w, "w");
  ASSERT_TRUE(reg.ok()) << reg.status();
  client::LogitsOptions bf16;
  bf16.out_dtype = DType::kBf16;
  absl::StatusOr<Tensor> y = c.Logits(x, reg->handle, bf16);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Bf16EqualsRoundedExact(*y, ExactNT(x, w), {m, v}));
  absl::StatusOr<client::BackwardResult> r = c.Backward(IntBf16({m, v}, 813), x, reg->handle);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Fp32EqualsExact(*r->dw, ExactTN(IntBf16({m, v}, 813), x), {v, k}));
}

constexpr std::uint64_t kMaxRequest = 4u << 20;    // 4194304
constexpr std::uint64_t kWeightBudget = 2u << 20;  // 2097152

class LimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SharedServer>> s =
        SharedServer::Start({absl::StrCat("--max_request_bytes=", kMaxRequest),
                             absl::StrCat("--weight_budget_bytes=", kWeightBudget)});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_TRUE(ServerAnswers(client())) << server_->process.Log();
    }
  }
  client::Client& client() { return *server_->client; }

  std::unique_ptr<SharedServer> server_;
};

TEST_F(LimitsTest, InfoReportsTheLimits) {
  absl::StatusOr<client::ServerInfo> info = client().Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_request_bytes, kMaxRequest);
  EXPECT_EQ(info->weight_budget_bytes, kWeightBudget);
  EXPECT_EQ(info->weight_bytes_in_use, 0u);
}

TEST_F(LimitsTest, RequestOverTheLimitIsResourceExhausted) {
  const Tensor w = IntBf16({512, 1024}, 821);  // 1 MiB
  absl::StatusOr<client::WeightInfo> reg = client().RegisterWeight(w, "w");
  ASSERT_TRUE(reg.ok()) << reg.status();

  // X alone: 2560 x 1024 bf16 = 5 MiB.
  absl::Status s = client().Logits(IntBf16({2560, 1024}, 822), reg->handle).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(kMaxRequest)));

  // X (2.1 MiB) is under the limit, X plus the logits it asks for are not.
  s = client().Logits(IntBf16({1100, 1024}, 823), reg->handle).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(kMaxRequest)));

  // Cast input alone: 1100 x 1024 fp32 = 4.4 MiB.
  s = client().CastToBf16(NormalFp32({1100, 1024}, 824)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  // Below the limit the same weight still serves.
  const Tensor x = IntBf16({16, 1024}, 825);
  absl::StatusOr<Tensor> y = client().Logits(x, reg->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {16, 512}));
}

TEST_F(LimitsTest, WeightOverTheBudgetIsResourceExhausted) {
  // Alone too large: 1536 x 1024 bf16 = 3 MiB > 2 MiB.
  absl::Status s = client().RegisterWeight(IntBf16({1536, 1024}, 831), "big").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(kWeightBudget)));

  // Fits alone, not next to another: 1 MiB in use + 1.875 MiB.
  absl::StatusOr<client::WeightInfo> first =
      client().RegisterWeight(IntBf16({512, 1024}, 832), "a");
  ASSERT_TRUE(first.ok()) << first.status();
  const Tensor second = IntBf16({960, 1024}, 833);
  s = client().RegisterWeight(second, "b").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(kWeightBudget)));

  // Releasing the first makes room.
  ASSERT_TRUE(client().ReleaseWeight(first->handle).ok());
  absl::StatusOr<client::WeightInfo> again = client().RegisterWeight(second, "b");
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<client::ServerInfo> info = client().Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->weight_bytes_in_use, second.nbytes());
  EXPECT_LE(info->weight_bytes_in_use, kWeightBudget);
}

}  // namespace
}  // namespace logitd::testing
