// Tests of the backend factory: name parsing and the choice --backend makes,
// with and without the cuda backend built in.
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
