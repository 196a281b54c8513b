// Sizes: a 128 MiB fp32 response reassembled from chunks, a server streaming
// with an odd chunk size, and the server's request and weight limits
// (RESOURCE_EXHAUSTED with the limit in the message, the server still up).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

// M = 1024, V = 32768: Y is 2^25 fp32 values = 128 MiB, 32 server chunks of
// 4 MiB. K = 64 keeps the server's and the reference's arithmetic cheap.
TEST(SizesTest, Logits128MiBResponseIsIntact) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  const std::int64_t m = 1024, v = 32768, k = 64;
  const Tensor w = IntBf16({v, k}, 801);
  const Tensor x = IntBf16({m, k}, 802);
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "wide");
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<Tensor> y = c.Logits(x, info->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_EQ(y->nbytes(), std::size_t{128} << 20);
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {m, v}));
  EXPECT_TRUE(ServerAnswers(c));
}

TEST(SizesTest, OddServerChunkSizeReassembles) {
  const std::uint64_t chunk = 100003;  // not a multiple of any element size
  absl::StatusOr<std::unique_ptr<SharedServer>> server =
      SharedServer::Start({absl::StrCat("--chunk_bytes=", chunk)});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  absl::StatusOr<client::ServerInfo> info = c.Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->chunk_bytes, chunk);

  const std::int64_t m = 64, v = 8192, k = 96;  // 2 MiB of fp32 logits, 21 chunks
  const Tensor w = IntBf16({v, k}, 811);
  const Tensor x = IntBf16({m, k}, 812);
  absl::StatusOr<client::WeightInfo> reg = c.RegisterWeight(w, "w");
  ASSERT_TRUE(reg.ok()) << reg.status();
  absl::StatusOr<Tensor> y = c.Logits(x, reg->handle);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {m, v}));
  client::LogitsOptions bf16;
  bf16.out_dtype = DType::kBf16;
  y = c.Logits(x, reg->handle, bf16);
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
