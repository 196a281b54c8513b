// LoadWeight through the real server (cpu backend) and the client library:
// weights read from safetensors files under --weights_dir get the handle of
// uploading the same bf16 bytes, give exact integer logits, fp32 is rounded
// to bf16 with round-to-nearest-even, and paths that leave the directory,
// missing files and tensors, unusable tensors and a server without
// --weights_dir are refused with exact status codes.
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::int64_t kV = 64;
constexpr std::int64_t kK = 128;

// Values whose fp32 -> bf16 rounding tells round-to-nearest-even from
// truncation and from rounding ties away: 1 + 2^-8 is a tie that goes down
// to 1, 1 + 3 * 2^-8 a tie that goes up to 1 + 2^-6, 1 + 2^-8 + 2^-20 is just
// above the tie and goes up.
Tensor TieFp32(std::vector<std::int64_t> shape) {
  Tensor t(DType::kFp32, std::move(shape));
  const float pattern[] = {1.0f + 0x1p-8f,
                           1.0f + 3 * 0x1p-8f,
                           1.0f + 0x1p-8f + 0x1p-20f,
                           -(1.0f + 0x1p-8f),
                           0.1f,
                           -3.3f,
                           65504.5f,
                           0.0f};
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = pattern[i % 8];
  return t;
}

Tensor RoundedRne(const Tensor& f) {
  Tensor b(DType::kBf16, f.shape());
  for (std::int64_t i = 0; i < f.numel(); ++i)
    b.data<Bf16Bits>()[i] = FloatToBf16(f.data<float>()[i]);
  return b;
}

void WriteFile(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class LoadWeightTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/logitd-load-weight-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      start_error_ = new absl::Status(absl::InternalError("mkdtemp failed"));
      return;
    }
    base_ = new std::filesystem::path(tmpl);
    const std::filesystem::path dir = *base_ / "weights";
    std::filesystem::create_directories(dir / "sub");

    bf16_w_ = new Tensor(IntBf16({kV, kK}, 701));
    int_fp32_w_ = new Tensor(IntFp32({kV, kK}, 702));
    tie_fp32_w_ = new Tensor(TieFp32({kV, kK}));
    const Tensor bias = IntFp32({kV}, 703);
    Tensor ids(DType::kInt64, {2, 2});
    const Tensor secret = IntBf16({kV, kK}, 704);
    absl::Status s = WriteSafetensors((dir / "sub" / "bf16.safetensors").string(),
                                      {{"lm_head.weight", bf16_w_}, {"bias", &bias}});
    if (s.ok()) {
      s = WriteSafetensors((dir / "fp32.safetensors").string(),
                           {{"int", int_fp32_w_}, {"ties", tie_fp32_w_}, {"ids", &ids}});
    }
    if (s.ok()) s = WriteSafetensors((*base_ / "secret.safetensors").string(), {{"w", &secret}});
    if (!s.ok()) {
      start_error_ = new absl::Status(s);
      return;
    }
    WriteFile(dir / "garbage.safetensors", "this is not a safetensors file");
    std::filesystem::create_symlink(*base_ / "secret.safetensors", dir / "escape.safetensors");
    std::filesystem::create_symlink(*base_, dir / "up");

    absl::StatusOr<std::unique_ptr<SharedServer>> started =
        SharedServer::Start({absl::StrCat("--weights_dir=", dir.string())});
    if (started.ok()) {
      server_ = std::move(*started).release();
    } else {
      start_error_ = new absl::Status(started.status());
    }
  }
  static void TearDownTestSuite() {
    SharedServerTest::TearDownTestSuite();
    if (base_ != nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(*base_, ec);
    }
    delete base_;
    delete bf16_w_;
    delete int_fp32_w_;
    delete tie_fp32_w_;
    base_ = nullptr;
  }

  static void ExpectRefused(const std::string& path, const std::string& tensor,
                            absl::StatusCode code, const std::string& in_message) {
    absl::StatusOr<client::WeightInfo> info = client().LoadWeight(path, tensor);
    EXPECT_EQ(info.status().code(), code) << path << " " << tensor << ": " << info.status();
    EXPECT_THAT(info.status().message(), HasSubstr(in_message)) << path;
  }

  static inline std::filesystem::path* base_ = nullptr;
  static inline Tensor* bf16_w_ = nullptr;
  static inline Tensor* int_fp32_w_ = nullptr;
  static inline Tensor* tie_fp32_w_ = nullptr;
};

TEST_F(LoadWeightTest, Bf16FileMatchesUploadAndGivesExactLogits) {
  absl::StatusOr<client::WeightInfo> loaded =
      client().LoadWeight("sub/bf16.safetensors", "lm_head.weight");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->name, "lm_head.weight");
  EXPECT_EQ(loaded->shape, (std::vector<std::int64_t>{kV, kK}));
  EXPECT_EQ(loaded->xxh3, bf16_w_->Digest());
  EXPECT_EQ(loaded->converted_from, "");
  EXPECT_FALSE(loaded->already_registered);
  EXPECT_EQ(loaded->registrations, 1u);

  // Uploading the same bytes finds the loaded weight.
  absl::StatusOr<client::WeightInfo> uploaded = client().RegisterWeight(*bf16_w_, "upload");
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->handle, loaded->handle);
  EXPECT_TRUE(uploaded->already_registered);
  EXPECT_EQ(uploaded->registrations, 2u);

  const Tensor x = IntBf16({8, kK}, 705);
  absl::StatusOr<Tensor> y = client().Logits(x, loaded->handle, {});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, *bf16_w_), {8, kV}));

  // Loading again adds a registration, as a second upload would.
  absl::StatusOr<client::WeightInfo> again =
      client().LoadWeight("./sub/bf16.safetensors", "lm_head.weight", "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->handle, loaded->handle);
  EXPECT_TRUE(again->already_registered);
  EXPECT_EQ(again->registrations, 3u);
  EXPECT_TRUE(client().ReleaseWeight(loaded->handle, /*force=*/true).ok());
}

TEST_F(LoadWeightTest, Fp32FileIsRoundedToNearestEven) {
  absl::StatusOr<client::WeightInfo> loaded =
      client().LoadWeight("fp32.safetensors", "ties", "tie_w");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->name, "tie_w");
  EXPECT_EQ(loaded->converted_from, "F32");
  const Tensor want = RoundedRne(*tie_fp32_w_);
  // The pattern's ties do round to even.
  EXPECT_EQ(want.data<Bf16Bits>()[0], FloatToBf16(1.0f));
  EXPECT_EQ(want.data<Bf16Bits>()[1], FloatToBf16(1.0f + 0x1p-6f));
  EXPECT_EQ(want.data<Bf16Bits>()[2], FloatToBf16(1.0f + 0x1p-7f));
  EXPECT_EQ(loaded->xxh3, want.Digest());
  absl::StatusOr<client::WeightInfo> uploaded = client().RegisterWeight(want, "rounded");
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->handle, loaded->handle);
  EXPECT_TRUE(uploaded->already_registered);
  EXPECT_TRUE(client().ReleaseWeight(loaded->handle, /*force=*/true).ok());

  // Integer fp32 values are exact in bf16: the logits are exact.
  absl::StatusOr<client::WeightInfo> ints = client().LoadWeight("fp32.safetensors", "int");
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_EQ(ints->converted_from, "F32");
  const Tensor w = RoundedRne(*int_fp32_w_);
  EXPECT_EQ(ints->xxh3, w.Digest());
  const Tensor x = IntBf16({4, kK}, 706);
  absl::StatusOr<Tensor> y = client().Logits(x, ints->handle, {});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {4, kV}));
  EXPECT_TRUE(client().ReleaseWeight(ints->handle, /*force=*/true).ok());
}

TEST_F(LoadWeightTest, PathsLeavingTheDirectoryArePermissionDenied) {
  const auto denied = absl::StatusCode::kPermissionDenied;
  ExpectRefused("../secret.safetensors", "w", denied, "../secret.safetensors");
  ExpectRefused("sub/../../secret.safetensors", "w", denied, "..");
  ExpectRefused((*base_ / "secret.safetensors").string(), "w", denied, "absolute");
  ExpectRefused("/etc/passwd", "w", denied, "/etc/passwd");
  ExpectRefused("escape.safetensors", "w", denied, "outside");
  ExpectRefused("up/secret.safetensors", "w", denied, "outside");
  absl::StatusOr<std::vector<client::WeightInfo>> list = client().ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
}

TEST_F(LoadWeightTest, MissingAndUnusableAreRefused) {
  ExpectRefused("sub/none.safetensors", "w", absl::StatusCode::kNotFound, "sub/none.safetensors");
  ExpectRefused("sub/bf16.safetensors", "lm_head", absl::StatusCode::kNotFound, "lm_head.weight");
  ExpectRefused("sub/bf16.safetensors", "", absl::StatusCode::kInvalidArgument, "tensor");
  ExpectRefused("", "w", absl::StatusCode::kInvalidArgument, "empty path");
  ExpectRefused("sub", "w", absl::StatusCode::kInvalidArgument, "sub");
  ExpectRefused(".", "w", absl::StatusCode::kInvalidArgument, "names the --weights_dir itself");
  // What is wrong with a file on the server is fixed there, not by retrying:
  // FAILED_PRECONDITION, never DATA_LOSS (a transfer to retry).
  ExpectRefused("sub/bf16.safetensors", "bias", absl::StatusCode::kFailedPrecondition, "rank");
  ExpectRefused("fp32.safetensors", "ids", absl::StatusCode::kFailedPrecondition, "I64");
  ExpectRefused("garbage.safetensors", "w", absl::StatusCode::kFailedPrecondition,
                "garbage.safetensors: not a valid safetensors file");
}

// Every tenant may call LoadWeight: its messages name what the caller sent,
// never where the server keeps its files.
TEST_F(LoadWeightTest, MessagesDoNotShowTheServersPaths) {
  const std::string server_path = std::filesystem::canonical(*base_).string();
  const std::vector<std::pair<std::string, std::string>> calls = {
      {"garbage.safetensors", "w"},
      {"sub/bf16.safetensors", "no_such_tensor"},
      {"escape.safetensors", "w"},
      {"up/secret.safetensors", "w"},
      {".", "w"},
      {"sub/none.safetensors", "w"}};
  for (const auto& [path, tensor] : calls) {
    absl::StatusOr<client::WeightInfo> info = client().LoadWeight(path, tensor);
    ASSERT_FALSE(info.ok()) << path;
    EXPECT_THAT(info.status().message(), Not(HasSubstr(server_path))) << path;
    EXPECT_THAT(info.status().message(), HasSubstr(path)) << path;
  }
}

TEST(LoadWeightWithoutDirTest, IsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<client::WeightInfo> info =
      (*server)->client->LoadWeight("model.safetensors", "lm_head.weight");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition) << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr("--weights_dir"));
  EXPECT_TRUE(ServerAnswers(*(*server)->client));
}

}  // namespace
}  // namespace logitd::testing
