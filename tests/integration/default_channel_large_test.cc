// 1 GiB outputs of every tensor call, received by a client generated from the
// proto on a channel with gRPC's default options (its 4 MiB receive limit):
// 256 messages each, every one of them within the limit.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/stub_calls.h"

namespace logitd::testing {
namespace {

TEST(DefaultChannelLargeTest, OneGiBOutputsOfEveryTensorCall) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  client::Client& c = *(*server)->client;
  auto stub = v1::Logitd::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  ExpectEveryTensorCallStreams(stub.get(), c, 16, [&c](const Tensor& w, const std::string& name) {
    absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, name);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->handle : std::string();
  });
}

}  // namespace
}  // namespace logitd::testing
