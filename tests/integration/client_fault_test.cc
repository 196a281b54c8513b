// The client's own checks on what the server sends back: a server started
// with --test_fault=digest announces a wrong xxh3 for every Logits output,
// and the client must report DATA_LOSS instead of returning the tensor.
#include <memory>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

TEST(ClientFaultTest, WrongResponseDigestIsDataLoss) {
#ifndef LOGITD_TEST_FAULTS_ENABLED
  GTEST_SKIP() << "logitd built without LOGITD_ENABLE_TEST_FAULTS: --test_fault is refused";
#endif
  absl::StatusOr<std::unique_ptr<SharedServer>> server =
      SharedServer::Start({"--test_fault=digest"});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  const Tensor w = IntBf16({32, 64}, 1);
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "w");
  ASSERT_TRUE(info.ok()) << info.status();

  absl::StatusOr<Tensor> y = c.Logits(IntBf16({4, 64}, 2), info->handle);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kDataLoss) << y.status();
  // The fault touches Logits only: the other calls and the server are fine.
  absl::StatusOr<client::BackwardResult> r =
      c.Backward(IntBf16({4, 32}, 3), IntBf16({4, 64}, 4), info->handle);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ServerAnswers(c));
}

}  // namespace
}  // namespace logitd::testing
