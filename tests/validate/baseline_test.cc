// Golden baselines: a recorded output survives the JSON round trip, and a
// mismatch is reported with the element count and ULP distance (exactly for
// small outputs, by blocks and samples for large ones).
#include "client/validate/baseline.h"

#include <string>

#include "gtest/gtest.h"
#include "logitd/bf16.h"

namespace logitd::validate {
namespace {

Tensor Ramp(DType dtype, std::vector<std::int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = static_cast<float>(i % 977) * 0.25f - 100.0f;
    if (dtype == DType::kBf16) {
      t.data<Bf16Bits>()[i] = FloatToBf16(v);
    } else {
      t.data<float>()[i] = v;
    }
  }
  return t;
}

Baseline OneCase(const Tensor& t) {
  Baseline b;
  b.platform.backend = "cpu";
  b.platform.device_name = "test cpu";
  CaseRecord c;
  c.name = "case";
  c.inputs_xxh3 = 0x1234;
  c.outputs.push_back(RecordOutput("y", t));
  c.gemms = "logits(M=16,N=2048,K=1024,fp32 out): algo=66 tile=10";
  b.cases.push_back(std::move(c));
  return b;
}

absl::StatusOr<Baseline> RoundTrip(const Baseline& b) {
  return BaselineFromJson(nlohmann::json::parse(BaselineToJson(b).dump()));
}

TEST(BaselineTest, RoundTripsAndMatches) {
  const Tensor small = Ramp(DType::kFp32, {16, 64});
  const Tensor large = Ramp(DType::kBf16, {64, 1024});
  for (const Tensor* t : {&small, &large}) {
    absl::StatusOr<Baseline> b = RoundTrip(OneCase(*t));
    ASSERT_TRUE(b.ok()) << b.status();
    const OutputRecord& o = b->cases[0].outputs[0];
    EXPECT_EQ(o.xxh3, t->Digest());
    EXPECT_EQ(o.values.has_value(), t->numel() <= kFullValuesMaxElements);
    EXPECT_EQ(b->cases[0].inputs_xxh3, 0x1234u);
    const OutputComparison c = CompareOutput(o, *t);
    EXPECT_TRUE(c.equal) << c.message;
    EXPECT_EQ(c.differing_blocks, 0);
  }
}

TEST(BaselineTest, SmallOutputsCountEveryDifferingElement) {
  Tensor t = Ramp(DType::kFp32, {16, 64});
  const Baseline b = OneCase(t);
  t.data<std::uint32_t>()[5] += 3;    // 3 ulp
  t.data<std::uint32_t>()[700] ^= 1;  // 1 ulp
  const OutputComparison c = CompareOutput(b.cases[0].outputs[0], t);
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.differing_elements, 2);
  EXPECT_EQ(c.max_ulp, 3);
  EXPECT_NE(c.message.find("2 of 1024 elements differ"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("[0, 5]"), std::string::npos) << c.message;
}

TEST(BaselineTest, LargeOutputsReportBlocksAndSamples) {
  Tensor t = Ramp(DType::kBf16, {64, 1024});
  const Baseline b = OneCase(t);
  t.data<Bf16Bits>()[0] ^= 1;  // element 0 is always sampled
  const OutputComparison c = CompareOutput(b.cases[0].outputs[0], t);
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.differing_elements, -1);
  EXPECT_EQ(c.differing_blocks, 1);
  EXPECT_EQ(c.total_blocks, 64);
  EXPECT_EQ(c.sampled_differing, 1);
  EXPECT_EQ(c.max_ulp, 1);
  EXPECT_NE(c.message.find("1 of 64 blocks"), std::string::npos) << c.message;
}

TEST(BaselineTest, AlteredDigestIsCalledOut) {
  const Tensor t = Ramp(DType::kFp32, {16, 64});
  Baseline b = OneCase(t);
  b.cases[0].outputs[0].xxh3 ^= 1;
  const OutputComparison c = CompareOutput(b.cases[0].outputs[0], t);
  EXPECT_FALSE(c.equal);
  EXPECT_EQ(c.differing_elements, 0);
  EXPECT_NE(c.message.find("altered or corrupted"), std::string::npos) << c.message;
}

TEST(BaselineTest, ShapeMismatchIsReported) {
  const Baseline b = OneCase(Ramp(DType::kFp32, {16, 64}));
  const OutputComparison c = CompareOutput(b.cases[0].outputs[0], Ramp(DType::kFp32, {16, 32}));
  EXPECT_FALSE(c.equal);
  EXPECT_NE(c.message.find("[16, 32]"), std::string::npos);
}

TEST(BaselineTest, RejectsMalformedFiles) {
  EXPECT_EQ(BaselineFromJson(nlohmann::json::object()).status().code(),
            absl::StatusCode::kInvalidArgument);
  nlohmann::json j = nlohmann::json::parse(BaselineToJson(OneCase(Ramp(DType::kFp32, {4}))).dump());
  j["cases"][0]["outputs"][0]["xxh3"] = "not hex";
  EXPECT_EQ(BaselineFromJson(j).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadBaseline("/nonexistent/baseline.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(PlatformTest, DifferencesAreNamed) {
  Platform a;
  a.backend = "cuda";
  a.device_name = "NVIDIA H100";
  a.compute_capability = "9.0";
  a.multiprocessors = "132";
  a.driver_version = "580.159.04 (CUDA 13.0)";
  a.cuda_runtime_version = "12.4";
  a.cublaslt_version = "12.4.5";
  Platform b = a;
  EXPECT_EQ(PlatformDifference(a, b), "");
  b.cublaslt_version = "12.6.1";
  EXPECT_EQ(PlatformDifference(a, b), "cuBLASLt: '12.4.5' vs '12.6.1'");
  b = a;
  b.multiprocessors = "114";
  b.driver_version = "575.57.08 (CUDA 12.9)";
  EXPECT_EQ(PlatformDifference(a, b),
            "SMs: '132' vs '114'; driver: '580.159.04 (CUDA 13.0)' vs '575.57.08 (CUDA 12.9)'");
  // A baseline of format 1 recorded neither: they are not compared.
  Platform old = a;
  old.multiprocessors.clear();
  old.driver_version.clear();
  EXPECT_EQ(PlatformDifference(old, b), "");
}

TEST(BaselineTest, GemmsAndPlatformSurviveTheFileAndFormatOneStillReads) {
  Baseline b = OneCase(Ramp(DType::kFp32, {4}));
  b.platform.backend = "cuda";
  b.platform.multiprocessors = "132";
  b.platform.driver_version = "580.159.04";
  nlohmann::json j = nlohmann::json::parse(BaselineToJson(b).dump());
  EXPECT_EQ(j["format_version"], 2);
  absl::StatusOr<Baseline> back = BaselineFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->cases[0].gemms, b.cases[0].gemms);
  EXPECT_EQ(back->platform.multiprocessors, "132");
  EXPECT_EQ(back->platform.driver_version, "580.159.04");
  j["format_version"] = 1;
  j["platform"].erase("multiprocessors");
  j["platform"].erase("driver_version");
  j["cases"][0].erase("gemms");
  back = BaselineFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->platform.multiprocessors.empty());
  EXPECT_TRUE(back->cases[0].gemms.empty());
  j["format_version"] = 3;
  EXPECT_EQ(BaselineFromJson(j).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace logitd::validate
