// Graceful shutdown: SIGTERM makes logitd exit 0, and a call already in
// flight when the signal arrives still completes.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

void ExpectCleanExit(int status, const std::string& log) {
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
}

TEST(ShutdownTest, SigtermExitsZero) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(ServerAnswers(*(*server)->client));
  const int status = (*server)->process.Stop();
  ExpectCleanExit(status, (*server)->process.Log());
  EXPECT_EQ((*server)->client->Info().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ShutdownTest, InFlightCallFinishesAfterSigterm) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const Tensor w = IntBf16({64, 128}, 1);
  const Tensor x = IntBf16({4, 128}, 2);
  absl::StatusOr<client::WeightInfo> info = (*server)->client->RegisterWeight(w, "w");
  ASSERT_TRUE(info.ok()) << info.status();

  // Open a Logits call and send only its header: the server now holds a call
  // that waits for X.
  auto stub = v1::Logitd::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Logits(&context);
  v1::LogitsRequest header;
  header.mutable_header()->set_weight_handle(info->handle);
  *header.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
  ASSERT_TRUE(stream->Write(header));
  // The header written is not yet the call started: wait until the server has
  // admitted it (it then waits for X), or SIGTERM may come first and the
  // call never start.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    absl::StatusOr<client::ServerInfo> info = (*server)->client->Info();
    ASSERT_TRUE(info.ok()) << info.status();
    if (info->requests_in_flight == 1) break;
    ASSERT_LT(absl::Now(), deadline) << "the Logits call was not admitted within 30 s";
    absl::SleepFor(absl::Milliseconds(5));
  }

  // Stop() sends SIGTERM and waits; it cannot return before the call ends.
  int status = -1;
  std::thread stopper([&] { status = (*server)->process.Stop(); });
  absl::SleepFor(absl::Milliseconds(500));

  v1::LogitsRequest chunk;
  chunk.mutable_chunk()->set_name("x");
  chunk.mutable_chunk()->set_offset(0);
  chunk.mutable_chunk()->set_data(reinterpret_cast<const char*>(x.bytes()), x.nbytes());
  EXPECT_TRUE(stream->Write(chunk));
  stream->WritesDone();
  wire::Assembler assembler(std::uint64_t{1} << 20);
  v1::LogitsResponse response;
  std::string y_name;
  while (stream->Read(&response)) {
    if (response.has_result()) {
      y_name = response.result().y().name();
      EXPECT_TRUE(assembler.Expect(response.result().y()).ok());
    } else {
      EXPECT_TRUE(assembler.Add(response.chunk()).ok());
    }
  }
  grpc::Status s = stream->Finish();
  stopper.join();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message() << "\nserver log:\n"
                      << (*server)->process.Log();
  ExpectCleanExit(status, (*server)->process.Log());
  if (s.ok()) {
    ASSERT_TRUE(assembler.Finish().ok());
    absl::StatusOr<Tensor> y = assembler.Take(y_name);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, w), {4, 64}));
  }
}

}  // namespace
}  // namespace logitd::testing
