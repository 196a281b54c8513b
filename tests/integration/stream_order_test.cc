// The order of a Logits response on the wire, as a client other than the C++
// library sees it through the generated stub: by default the result (Y's spec
// with its digest) and then Y's chunks; with LogitsHeader.digest_last the
// result with xxh3 0, the chunks, and a TensorDigest last. Both must carry
// the bytes the C++ client gets. The same for Backward, FetchGradient (a
// server-streaming call the server serves as a raw stream) and Cast. Also: a
// request message that cannot be parsed is INVALID_ARGUMENT, not a hang or a
// crash.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/chunk_message.h"
#include "logitd/wire/raw_call.h"
#include "logitd/wire/wire.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/stub_calls.h"

namespace logitd::testing {
namespace {

class StreamOrderTest : public SharedServerTest {
 protected:
  // A channel with gRPC's default options, as a client generated from the
  // proto has: its 4 MiB receive limit takes every message the server sends
  // (the outputs below are 4 to 10 MiB, several chunks each).
  std::shared_ptr<grpc::Channel> Channel() {
    return grpc::CreateChannel(server_->process.address(), grpc::InsecureChannelCredentials());
  }
};

TEST_F(StreamOrderTest, ResultFirstByDefaultDigestLastOnRequestSameBytes) {
  // Large enough for several chunks of the server's default size.
  const Tensor w = NormalBf16({16384, 64}, 1);
  const std::string handle = Register(w, "order");
  const Tensor x = NormalBf16({160, 64}, 2);  // Y: fp32 [160, 16384], 10 MiB
  absl::StatusOr<Tensor> want = client().Logits(x, handle);
  ASSERT_TRUE(want.ok()) << want.status();
  const std::uint64_t want_digest = want->Digest();

  for (const bool digest_last : {false, true}) {
    SCOPED_TRACE(digest_last ? "digest_last" : "default");
    auto stub = v1::Logitd::NewStub(Channel());
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->Logits(&context);
    ASSERT_NO_FATAL_FAILURE(
        WriteRequest(*stream, MakeLogitsRequest(handle, x, digest_last), {{"x", &x}}));

    std::vector<v1::LogitsResponse::PartCase> order;
    v1::LogitsResult result;
    std::string y;
    std::uint64_t trailing_digest = 0;
    v1::LogitsResponse response;
    while (stream->Read(&response)) {
      order.push_back(response.part_case());
      if (response.has_result()) result = response.result();
      if (response.has_chunk()) {
        EXPECT_EQ(response.chunk().name(), "y");
        EXPECT_EQ(response.chunk().offset(), y.size());
        y += response.chunk().data();
      }
      if (response.has_digest()) {
        EXPECT_EQ(response.digest().name(), "y");
        trailing_digest = response.digest().xxh3();
      }
    }
    const grpc::Status status = stream->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();

    ASSERT_GE(order.size(), 4u);  // result, three chunks at least, ...
    EXPECT_EQ(order.front(), v1::LogitsResponse::kResult);
    const std::size_t chunks_end = digest_last ? order.size() - 1 : order.size();
    for (std::size_t i = 1; i < chunks_end; ++i) {
      EXPECT_EQ(order[i], v1::LogitsResponse::kChunk) << i;
    }
    if (digest_last) {
      EXPECT_EQ(order.back(), v1::LogitsResponse::kDigest);
      EXPECT_EQ(result.y().xxh3(), 0u);
      EXPECT_EQ(trailing_digest, want_digest);
    } else {
      EXPECT_EQ(result.y().xxh3(), want_digest);
    }
    ASSERT_EQ(y.size(), want->nbytes());
    EXPECT_EQ(std::memcmp(y.data(), want->bytes(), y.size()), 0);
    EXPECT_EQ(result.y().shape(0), 160);
    EXPECT_EQ(result.y().shape(1), 16384);
  }
}

// The expected parts of a stream with one output, `name`.
std::vector<std::string> OneOutputOrder(const std::string& name, bool digest_last) {
  std::vector<std::string> order = {"result", "chunk:" + name};
  if (digest_last) order.push_back("digest:" + name);
  return order;
}

// Backward's two streamed outputs: with digest_last both specs carry 0 and
// both digests follow the last chunk of all, in the outputs' order.
TEST_F(StreamOrderTest, BackwardDigestsFollowAllChunks) {
  const Tensor w = IntBf16({4096, 256}, 5);
  const std::string handle = Register(w, "order-backward");
  const Tensor dy = IntFp32({64, 4096}, 6);
  const Tensor x = IntBf16({64, 256}, 7);
  absl::StatusOr<client::BackwardResult> want = client().Backward(dy, x, handle);
  ASSERT_TRUE(want.ok()) << want.status();

  for (const bool digest_last : {false, true}) {
    SCOPED_TRACE(digest_last ? "digest_last" : "default");
    auto stub = v1::Logitd::NewStub(Channel());
    Received<v1::BackwardResponse> got;
    ASSERT_NO_FATAL_FAILURE(
        BackwardThroughStub(stub.get(), handle, dy, x, /*want_dx=*/true, digest_last, &got));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const std::vector<std::string>& order = got.order;
    const v1::BackwardResult& result = got.result.result();
    const std::map<std::string, std::uint64_t>& digests = got.digests;
    EXPECT_TRUE(got.bytes.at("dx") == BytesOf(*want->dx));
    EXPECT_TRUE(got.bytes.at("dw") == BytesOf(*want->dw));
    if (digest_last) {
      EXPECT_EQ(order, (std::vector<std::string>{"result", "chunk:dx", "chunk:dw", "digest:dx",
                                                 "digest:dw"}));
      EXPECT_EQ(result.dx().xxh3(), 0u);
      EXPECT_EQ(result.dw().xxh3(), 0u);
      EXPECT_EQ(digests.at("dx"), want->dx->Digest());
      EXPECT_EQ(digests.at("dw"), want->dw->Digest());
    } else {
      EXPECT_EQ(order, (std::vector<std::string>{"result", "chunk:dx", "chunk:dw"}));
      EXPECT_EQ(result.dx().xxh3(), want->dx->Digest());
      EXPECT_EQ(result.dw().xxh3(), want->dw->Digest());
    }
  }
}

TEST_F(StreamOrderTest, FetchGradientThroughTheGeneratedStubBothOrders) {
  const Tensor w = IntBf16({8192, 256}, 11);
  const std::string handle = Register(w, "order-fetch");
  client::BackwardOptions accumulate;
  accumulate.want_dx = false;
  accumulate.accumulate_dw = true;
  ASSERT_TRUE(
      client().Backward(IntFp32({32, 8192}, 12), IntBf16({32, 256}, 13), handle, accumulate).ok());
  // Through the C++ client (a raw stream, digest last).
  absl::StatusOr<client::GradientResult> want = client().FetchGradient(handle, false);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->accumulated_calls, 1u);

  for (const bool digest_last : {false, true}) {
    SCOPED_TRACE(digest_last ? "digest_last" : "default");
    auto stub = v1::Logitd::NewStub(Channel());
    Received<v1::FetchGradientResponse> got;
    FetchGradientThroughStub(stub.get(), handle, digest_last, &got);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();

    EXPECT_EQ(got.order, OneOutputOrder("dw", digest_last));
    const v1::FetchGradientResult& result = got.result.result();
    EXPECT_EQ(result.accumulated_calls(), 1u);
    EXPECT_EQ(result.dw().shape(0), 8192);
    EXPECT_EQ(result.dw().shape(1), 256);
    EXPECT_EQ(result.dw().xxh3(), digest_last ? 0u : want->dw.Digest());
    if (digest_last) {
      EXPECT_EQ(got.digests.at("dw"), want->dw.Digest());
    }
    ASSERT_EQ(got.bytes.at("dw").size(), 8192u * 256 * 4);  // two chunks of 4 MiB
    EXPECT_TRUE(got.bytes.at("dw") == BytesOf(want->dw));
  }
}

TEST_F(StreamOrderTest, CastThroughTheGeneratedStubBothOrders) {
  const Tensor in = IntFp32({3000, 1000}, 21);  // bf16 out: 6 MB, two chunks
  absl::StatusOr<Tensor> want = client().CastToBf16(in);
  ASSERT_TRUE(want.ok()) << want.status();

  for (const bool digest_last : {false, true}) {
    SCOPED_TRACE(digest_last ? "digest_last" : "default");
    auto stub = v1::Logitd::NewStub(Channel());
    Received<v1::CastResponse> got;
    ASSERT_NO_FATAL_FAILURE(CastThroughStub(stub.get(), in, digest_last, &got));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();

    EXPECT_EQ(got.order, OneOutputOrder("output", digest_last));
    const v1::CastResult& result = got.result.result();
    EXPECT_EQ(result.output().xxh3(), digest_last ? 0u : want->Digest());
    if (digest_last) {
      EXPECT_EQ(got.digests.at("output"), want->Digest());
    }
    ASSERT_EQ(got.bytes.at("output").size(), want->nbytes());
    EXPECT_TRUE(got.bytes.at("output") == BytesOf(*want));
    // Integer values: bf16 holds them exactly.
    for (std::int64_t i = 0; i < in.numel(); ++i) {
      ASSERT_EQ(Bf16ToFloat(want->data<Bf16Bits>()[i]), in.data<float>()[i]) << i;
    }
  }
}

// A client generated from the proto, on a channel with gRPC's defaults,
// receives 64 MiB outputs of every tensor call: 16 messages each, all within
// the stock 4 MiB receive limit. (1 GiB: default_channel_large_test.)
TEST_F(StreamOrderTest, SixtyFourMiBOutputsOfEveryTensorCallThroughADefaultChannel) {
  auto stub = v1::Logitd::NewStub(Channel());
  ExpectEveryTensorCallStreams(stub.get(), client(), 1, Register);
}

using RawStream = wire::RawClientCall;

// A call of `method` ("Logits", ...) as a raw bidirectional stream.
std::unique_ptr<RawStream> StartRaw(grpc::GenericStub& stub, const char* method,
                                    grpc::ClientContext* context) {
  return std::make_unique<RawStream>(stub, method, context);
}

// Bytes no protobuf message parses from: field 0 does not exist.
grpc::ByteBuffer Garbage() {
  const char bytes[] = "\x07\xff\xff\xff";
  grpc::Slice slice(bytes, sizeof bytes - 1);
  return grpc::ByteBuffer(&slice, 1);
}

// Ends the requests, reads whatever comes back, and expects INVALID_ARGUMENT
// saying `why`.
void ExpectInvalidArgument(RawStream& stream, const std::string& why) {
  stream.WritesDone();
  grpc::ByteBuffer ignored;
  while (stream.Read(&ignored)) {
  }
  const grpc::Status status = stream.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find(why), std::string::npos) << status.error_message();
}

// FetchGradient is served as a raw stream that reads one request: none, or
// bytes that are not a FetchGradientRequest, is INVALID_ARGUMENT.
TEST_F(StreamOrderTest, FetchGradientWithoutAReadableRequestIsInvalidArgument) {
  grpc::GenericStub stub(Channel());
  for (const bool garbage : {false, true}) {
    SCOPED_TRACE(garbage ? "garbage" : "no request");
    grpc::ClientContext context;
    SetDeadline(&context);
    std::unique_ptr<RawStream> stream = StartRaw(stub, "FetchGradient", &context);
    if (garbage) stream->Write(Garbage());
    ExpectInvalidArgument(*stream, garbage ? "could not be parsed as logitd.v1.FetchGradientRequest"
                                           : "expected a FetchGradientRequest");
  }
}

TEST_F(StreamOrderTest, UnparseableRequestMessageIsInvalidArgument) {
  grpc::GenericStub stub(Channel());
  for (const bool after_header : {false, true}) {
    SCOPED_TRACE(after_header ? "after the header" : "first message");
    grpc::ClientContext context;
    SetDeadline(&context);
    std::unique_ptr<RawStream> stream = StartRaw(stub, "Logits", &context);
    if (after_header) {
      const Tensor w = IntBf16({8, 16}, 3);
      v1::LogitsRequest request;
      request.mutable_header()->set_weight_handle(Register(w, "garbage"));
      *request.mutable_header()->mutable_x() = wire::MakeSpec("x", IntBf16({2, 16}, 4));
      stream->Write(wire::SerializeMessage(request));
    }
    stream->Write(Garbage());
    ExpectInvalidArgument(*stream, "could not be parsed as logitd.v1.LogitsRequest");
  }
}

}  // namespace
}  // namespace logitd::testing
