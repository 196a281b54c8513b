// logitctl end to end: the real binary against the real server, on
// safetensors files in a temporary folder. Checks outputs bit for bit and the
// exit-code contract (0 ok, 1 server status, 2 usage/input/unreachable).
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/common/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/integration/integration_util.h"
#include "tests/integration/logitctl_fixture.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

class LogitctlTest : public LogitctlFixture {
 protected:
  // Registers a bf16 weight file through logitctl; returns the handle.
  std::string RegisterFile(const std::string& file, const std::string& tensor) {
    LogitctlRun r = Run({"weights", "register", Path(file), "--tensor=" + tensor});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Field(r.out, "handle");
  }
};

TEST_F(LogitctlTest, HelpListsTheCommands) {
  LogitctlRun r = Run({"help"}, false);
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"info", "weights register", "weights list", "weights release", "logits",
                          "backward", "grad fetch", "grad zero", "cast", "validate"}) {
    EXPECT_THAT(r.out, HasSubstr(cmd));
  }
  r = Run({}, false);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage"));
}

TEST_F(LogitctlTest, InfoAsTableAndJson) {
  LogitctlRun r = Run({"info"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "backend"), "cpu");
  EXPECT_EQ(Field(r.out, "server"), server_->process.address());

  r = Run({"info", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_TRUE(j["max_request_bytes"].is_number_unsigned());
  EXPECT_EQ(j["chunk_bytes"].get<std::uint64_t>(), kDefaultChunkBytes);
  EXPECT_EQ(j["max_send_message_bytes"].get<std::uint64_t>(), kGrpcDefaultMaxMessageBytes);
}

TEST_F(LogitctlTest, LoadBalancingPolicy) {
  // A one-address list is still a list: round_robin over it works.
  LogitctlRun r =
      Run({"--server=ipv4:" + server_->process.address(), "--lb=round_robin", "info"}, false);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "backend"), "cpu");
  EXPECT_EQ(Run({"--lb=pick_first", "info"}).exit_code, 0);
  r = Run({"--lb=least_request", "info"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--lb: expected pick_first or round_robin"));
}

TEST_F(LogitctlTest, RegisterListLogitsRelease) {
  const std::int64_t m = 8, v = 96, k = 4096;
  const Tensor w = IntBf16({v, k}, 1001);
  const Tensor x = IntBf16({m, k}, 1002);
  const Tensor other = IntBf16({2, 2}, 1003);
  Write("w.safetensors", {{"lm_head.weight", &w}});
  Write("x.safetensors", {{"x", &x}, {"other", &other}});

  const std::string handle = RegisterFile("w.safetensors", "lm_head.weight");
  ASSERT_FALSE(handle.empty());
  LogitctlRun again =
      Run({"weights", "register", Path("w.safetensors"), "--tensor=lm_head.weight"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(Field(again.out, "handle"), handle);
  EXPECT_EQ(Field(again.out, "already_registered"), "true");
  EXPECT_THAT(again.out, HasSubstr("[96, 4096]"));

  LogitctlRun list = Run({"weights", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr(handle));
  EXPECT_THAT(list.out, HasSubstr("lm_head.weight"));

  const std::vector<std::int64_t> exact = ExactNT(x, w);
  LogitctlRun r = Run({"logits", "--x=" + Path("x.safetensors") + ":x", "--weight=" + handle,
                       "--out=" + Path("y.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[8, 96]"));
  EXPECT_EQ(Field(r.out, "dtype"), "fp32");
  EXPECT_FALSE(Field(r.out, "compute_us").empty());
  EXPECT_TRUE(Fp32EqualsExact(Read(Path("y.safetensors"), "logits"), exact, {m, v}));

  r = Run({"logits", "--x=" + Path("x.safetensors") + ":x", "--weight=" + handle,
           "--out=" + Path("y16.safetensors"), "--out_dtype=bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "dtype"), "bf16");
  EXPECT_TRUE(Bf16EqualsRoundedExact(Read(Path("y16.safetensors"), "logits"), exact, {m, v}));

  // Run whole instead of in row blocks: the same bits.
  r = Run({"logits", "--x=" + Path("x.safetensors") + ":x", "--weight=" + handle,
           "--out=" + Path("y_whole.safetensors"), "--nopipeline"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Read(Path("y_whole.safetensors"), "logits").Digest(),
            Read(Path("y.safetensors"), "logits").Digest());

  // A file with two tensors needs the :TENSOR suffix.
  r = Run({"logits", "--x=" + Path("x.safetensors"), "--weight=" + handle,
           "--out=" + Path("y.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("other"));

  // Registered twice: the first release leaves one registration, the
  // second frees the weight, a third finds nothing.
  r = Run({"weights", "release", handle});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "bytes_freed"), "0");
  r = Run({"weights", "release", handle});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run({"weights", "release", handle});
  EXPECT_EQ(r.exit_code, 2);  // an input the server refuses
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(LogitctlTest, Fp32WeightIsRoundedToBf16AndSaysSo) {
  const Tensor w16 = IntBf16({24, 32}, 1011);
  Tensor w32(DType::kFp32, {24, 32});
  for (std::int64_t i = 0; i < w16.numel(); ++i) {
    w32.data<float>()[i] = static_cast<float>(w16.At(i));
  }
  Write("w32.safetensors", {{"w", &w32}});
  LogitctlRun r = Run({"weights", "register", Path("w32.safetensors")});  // the only tensor
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("converted to bf16"));
  // Integer values round to themselves: the server holds exactly w16.
  absl::StatusOr<client::WeightInfo> info = server_->client->RegisterWeight(w16, "w16");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->handle, Field(r.out, "handle"));
  EXPECT_TRUE(info->already_registered);
}

TEST_F(LogitctlTest, BackwardAndAccumulatedGradient) {
  const std::int64_t m = 6, v = 80, k = 48;
  const Tensor w = IntBf16({v, k}, 1021);
  const Tensor x = IntBf16({m, k}, 1022);
  const Tensor dy = IntBf16({m, v}, 1023);
  Write("w.safetensors", {{"w", &w}});
  Write("x.safetensors", {{"x", &x}});
  Write("dy.safetensors", {{"dy", &dy}});
  const std::string handle = RegisterFile("w.safetensors", "w");
  ASSERT_FALSE(handle.empty());

  LogitctlRun r =
      Run({"backward", "--dy=" + Path("dy.safetensors"), "--x=" + Path("x.safetensors"),
           "--weight=" + handle, "--out=" + Path("grads.safetensors"), "--dx_dtype=fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Fp32EqualsExact(Read(Path("grads.safetensors"), "dx"), ExactNN(dy, w), {m, k}));
  EXPECT_TRUE(Fp32EqualsExact(Read(Path("grads.safetensors"), "dw"), ExactTN(dy, x), {v, k}));

  r = Run({"backward", "--dy=" + Path("dy.safetensors"), "--x=" + Path("x.safetensors"),
           "--weight=" + handle, "--out=" + Path("dx.safetensors"), "--no_dw"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Bf16EqualsRoundedExact(Read(Path("dx.safetensors"), "dx"), ExactNN(dy, w), {m, k}));
  absl::StatusOr<std::vector<std::string>> names = ListSafetensors(Path("dx.safetensors"));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, std::vector<std::string>{"dx"});

  // Two accumulated calls, then fetch (and zero) the sum.
  for (int i = 0; i < 2; ++i) {
    r = Run({"backward", "--dy=" + Path("dy.safetensors"), "--x=" + Path("x.safetensors"),
             "--weight=" + handle, "--no_dx", "--accumulate"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  r = Run({"grad", "fetch", handle, "--out=" + Path("acc.safetensors"), "--zero"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "accumulated_calls"), "2");
  std::vector<std::int64_t> twice = ExactTN(dy, x);
  for (std::int64_t& e : twice) e *= 2;
  EXPECT_TRUE(Fp32EqualsExact(Read(Path("acc.safetensors"), "dw"), twice, {v, k}));

  r = Run({"grad", "fetch", handle, "--out=" + Path("acc0.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Field(r.out, "accumulated_calls"), "0");
  r = Run({"grad", "zero", handle});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(LogitctlTest, CastWritesTheServersRounding) {
  Tensor in = NormalFp32({7, 33}, 1031, 100.0f);
  in.data<std::uint32_t>()[0] = 0x3f808000u;  // a tie
  in.data<std::uint32_t>()[1] = 0x7fc00000u;  // NaN
  Write("in.safetensors", {{"values", &in}});
  LogitctlRun r =
      Run({"cast", "--in=" + Path("in.safetensors"), "--out=" + Path("out.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor out = Read(Path("out.safetensors"), "values");
  ASSERT_EQ(out.dtype(), DType::kBf16);
  ASSERT_EQ(out.shape(), in.shape());
  for (std::int64_t i = 0; i < in.numel(); ++i) {
    ASSERT_EQ(out.data<Bf16Bits>()[i], FloatToBf16(in.data<float>()[i])) << "element " << i;
  }
}

TEST_F(LogitctlTest, UsageAndInputErrorsExit2) {
  const Tensor x = IntBf16({2, 16}, 1041);
  Write("x.safetensors", {{"x", &x}});
  EXPECT_EQ(Run({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(Run({"--bogus_flag", "info"}).exit_code, 2);
  EXPECT_EQ(Run({"info", "extra"}).exit_code, 2);
  EXPECT_EQ(Run({"weights"}).exit_code, 2);
  EXPECT_EQ(Run({"logits", "--weight=h", "--out=" + Path("y.safetensors")}).exit_code, 2)
      << "--x missing";
  EXPECT_EQ(Run({"logits", "--x=" + Path("x.safetensors"), "--weight=h",
                 "--out=" + Path("y.safetensors"), "--out_dtype=int8"})
                .exit_code,
            2);
  LogitctlRun r = Run({"logits", "--x=" + Path("missing.safetensors"), "--weight=h",
                       "--out=" + Path("y.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing.safetensors"));
  EXPECT_EQ(Run({"--timeout=abc", "info"}).exit_code, 2);

  r = Run({"--server=127.0.0.1:" + std::to_string(UnusedPort()), "info"}, false);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
}

// How many times `what` occurs in `text`.
int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// One rule for every command (client/common/exit_codes.h): what the server
// refuses of what was sent is an input error, 2, printed once with its
// status; a failure of the server itself is 1.
TEST_F(LogitctlTest, InputsTheServerRefusesExit2WithTheStatus) {
  const Tensor x = IntBf16({2, 16}, 1051);
  const Tensor w = IntBf16({8, 32}, 1052);  // K = 32, X has K = 16
  Write("x.safetensors", {{"x", &x}});
  Write("w.safetensors", {{"w", &w}});
  LogitctlRun r = Run({"logits", "--x=" + Path("x.safetensors"), "--weight=no-such-handle",
                       "--out=" + Path("y.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("logitctl: NOT_FOUND: "));
  EXPECT_EQ(CountOf(r.err, "NOT_FOUND"), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_FALSE(std::filesystem::exists(Path("y.safetensors")));

  EXPECT_EQ(Run({"grad", "zero", "no-such-handle"}).exit_code, 2);

  const std::string handle = RegisterFile("w.safetensors", "w");
  ASSERT_FALSE(handle.empty());
  r = Run({"logits", "--x=" + Path("x.safetensors"), "--weight=" + handle,
           "--out=" + Path("y.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("logitctl: INVALID_ARGUMENT: "));
  EXPECT_EQ(CountOf(r.err, "INVALID_ARGUMENT"), 1) << r.err;
}

TEST(ExitCodesTest, OneRuleForEveryStatus) {
  EXPECT_EQ(exit_codes::ForStatus(absl::OkStatus()), 0);
  for (const absl::Status& s :
       {absl::InvalidArgumentError("shape"), absl::NotFoundError("handle"),
        absl::OutOfRangeError("id"), absl::FailedPreconditionError("state"),
        absl::ResourceExhaustedError("limit"), absl::UnavailableError("down"),
        absl::UnauthenticatedError("token"), absl::PermissionDeniedError("tenant")}) {
    EXPECT_EQ(exit_codes::ForStatus(s), 2) << s;
  }
  for (const absl::Status& s : {absl::InternalError("bug"), absl::DataLossError("digest"),
                                absl::DeadlineExceededError("slow"), absl::UnknownError("?"),
                                absl::AbortedError("race"), absl::CancelledError("gone")}) {
    EXPECT_EQ(exit_codes::ForStatus(s), 1) << s;
  }
}

}  // namespace
}  // namespace logitd::testing
