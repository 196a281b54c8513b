// Tests of the backend factory: name parsing (backends and split-K) and the
// choice --backend makes, with and without the cuda backend built in.
#include "server/kernels/backend.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace logitd::kernels {
namespace {

TEST(Backend, ParseBackendKindAcceptsTheThreeNames) {
  absl::StatusOr<BackendKind> k = ParseBackendKind("auto");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, BackendKind::kAuto);
  k = ParseBackendKind("cuda");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, BackendKind::kCuda);
  k = ParseBackendKind("CPU");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, BackendKind::kCpu);
}

TEST(Backend, ParseBackendKindUnknownIsInvalidArgument) {
  for (const char* name : {"gpu", "", "cpu ", "rocm"}) {
    absl::Status s = ParseBackendKind(name).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("auto, cuda or cpu"), absl::string_view::npos) << s;
  }
}

TEST(Backend, ParseSplitKAcceptsTheThreeNamesInAnyCase) {
  for (SplitK split_k : {SplitK::kOff, SplitK::kFp32, SplitK::kAny}) {
    const std::string name = SplitKName(split_k);
    absl::StatusOr<SplitK> parsed = ParseSplitK(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, split_k) << name;
  }
  EXPECT_STREQ(SplitKName(SplitK::kFp32), "fp32");
  absl::StatusOr<SplitK> upper = ParseSplitK("FP32");
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_EQ(*upper, SplitK::kFp32);
  EXPECT_EQ(BackendOptions{}.split_k, SplitK::kFp32);
}

TEST(Backend, ParseSplitKUnknownIsInvalidArgumentNamingTheChoices) {
  for (const char* name : {"sometimes", "", "fp16", "on"}) {
    absl::Status s = ParseSplitK(name).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("split_k: expected off, fp32 or any, got '"),
              absl::string_view::npos)
        << s;
  }
}

TEST(Backend, CreateCpuGivesTheCpuBackend) {
  BackendOptions options;
  options.kind = BackendKind::kCpu;
  std::string why;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Info().backend, "cpu");
  EXPECT_NE(why.find("cpu"), std::string::npos) << why;
  // `why` is optional.
  EXPECT_TRUE(CreateBackend(options).ok());
}

#ifndef LOGITD_HAVE_CUDA
TEST(Backend, CreateCudaWithoutCudaBuildIsFailedPrecondition) {
  BackendOptions options;
  options.kind = BackendKind::kCuda;
  absl::Status s = CreateBackend(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("LOGITD_WITH_CUDA=OFF"), absl::string_view::npos) << s;
}

TEST(Backend, AutoWithoutCudaBuildFallsBackToCpuAndSaysWhy) {
  BackendOptions options;
  options.kind = BackendKind::kAuto;
  std::string why;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Info().backend, "cpu");
  EXPECT_NE(why.find("without the cuda backend"), std::string::npos) << why;
  EXPECT_NE(why.find("using cpu"), std::string::npos) << why;
}
#else
TEST(Backend, AutoPicksCudaOrExplainsTheFallback) {
  BackendOptions options;
  options.kind = BackendKind::kAuto;
  std::string why;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string backend = (*b)->Info().backend;
  if (backend == "cuda") {
    EXPECT_NE(why.find("using cuda"), std::string::npos) << why;
  } else {
    EXPECT_EQ(backend, "cpu");
    EXPECT_NE(why.find("no CUDA device visible"), std::string::npos) << why;
    EXPECT_NE(why.find("using cpu"), std::string::npos) << why;
  }
}
#endif

}  // namespace
}  // namespace logitd::kernels
