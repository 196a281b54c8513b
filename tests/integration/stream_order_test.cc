// The order of a Logits response on the wire, as a client other than the C++
// library sees it through the generated stub: by default the result (Y's spec
// with its digest) and then Y's chunks; with LogitsHeader.digest_last the
// result with xxh3 0, the chunks, and a TensorDigest last. Both must carry
// the bytes the C++ client gets. Also: a request message that is not a
// LogitsRequest is INVALID_ARGUMENT, not a hang or a crash.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/chunk_message.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

// Streams `t` as the chunks of a request stream of Request messages.
template <typename Request, typename Stream>
bool WriteChunks(Stream& stream, const char* name, const Tensor& t) {
  return wire::SendChunks(name, t.bytes(), t.nbytes(), wire::kDefaultChunkBytes,
                          [&](v1::TensorChunk&& c) {
                            Request r;
                            *r.mutable_chunk() = std::move(c);
                            return stream.Write(r);
                          })
      .ok();
}

// A deadline for the raw calls.
void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
}

class StreamOrderTest : public SharedServerTest {
 protected:
  // A plain channel, with the receive limit raised above a full chunk plus
  // framing (as docs/OPERATIONS.md tells clients in other languages).
  std::shared_ptr<grpc::Channel> Channel() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    return grpc::CreateCustomChannel(server_->process.address(), grpc::InsecureChannelCredentials(),
                                     args);
  }
};

TEST_F(StreamOrderTest, ResultFirstByDefaultDigestLastOnRequestSameBytes) {
  // Large enough for several chunks of the server's default 4 MiB.
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
    v1::LogitsRequest request;
    v1::LogitsHeader* h = request.mutable_header();
    h->set_weight_handle(handle);
    *h->mutable_x() = wire::MakeSpec("x", x);
    h->set_digest_last(digest_last);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(WriteChunks<v1::LogitsRequest>(*stream, "x", x));
    stream->WritesDone();

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
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->Backward(&context);
    v1::BackwardRequest request;
    v1::BackwardHeader* h = request.mutable_header();
    h->set_weight_handle(handle);
    *h->mutable_dy() = wire::MakeSpec("dy", dy);
    *h->mutable_x() = wire::MakeSpec("x", x);
    h->set_want_dx(true);
    h->set_want_dw(true);
    h->set_digest_last(digest_last);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(WriteChunks<v1::BackwardRequest>(*stream, "dy", dy));
    ASSERT_TRUE(WriteChunks<v1::BackwardRequest>(*stream, "x", x));
    stream->WritesDone();

    std::vector<std::string> order;  // "result", "chunk:NAME", "digest:NAME"
    v1::BackwardResult result;
    std::map<std::string, std::uint64_t> digests;
    v1::BackwardResponse response;
    while (stream->Read(&response)) {
      if (response.has_result()) {
        order.push_back("result");
        result = response.result();
      } else if (response.has_chunk()) {
        if (order.back() != "chunk:" + response.chunk().name()) {
          order.push_back("chunk:" + response.chunk().name());
        }
      } else if (response.has_digest()) {
        order.push_back("digest:" + response.digest().name());
        digests[response.digest().name()] = response.digest().xxh3();
      }
    }
    const grpc::Status status = stream->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    if (digest_last) {
      EXPECT_EQ(order, (std::vector<std::string>{"result", "chunk:dx", "chunk:dw", "digest:dx",
                                                 "digest:dw"}));
      EXPECT_EQ(result.dx().xxh3(), 0u);
      EXPECT_EQ(result.dw().xxh3(), 0u);
      EXPECT_EQ(digests["dx"], want->dx->Digest());
      EXPECT_EQ(digests["dw"], want->dw->Digest());
    } else {
      EXPECT_EQ(order, (std::vector<std::string>{"result", "chunk:dx", "chunk:dw"}));
      EXPECT_EQ(result.dx().xxh3(), want->dx->Digest());
      EXPECT_EQ(result.dw().xxh3(), want->dw->Digest());
    }
  }
}

TEST_F(StreamOrderTest, UnparseableRequestMessageIsInvalidArgument) {
  std::shared_ptr<grpc::Channel> channel = Channel();
  const grpc::internal::RpcMethod method("/logitd.v1.Logitd/Logits",
                                         grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  for (const bool after_header : {false, true}) {
    SCOPED_TRACE(after_header ? "after the header" : "first message");
    grpc::ClientContext context;
    SetDeadline(&context);
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel.get(), method, &context));
    if (after_header) {
      const Tensor w = IntBf16({8, 16}, 3);
      v1::LogitsRequest request;
      request.mutable_header()->set_weight_handle(Register(w, "garbage"));
      *request.mutable_header()->mutable_x() = wire::MakeSpec("x", IntBf16({2, 16}, 4));
      stream->Write(wire::SerializeMessage(request));
    }
    // Field 0 does not exist in protobuf: no message parses from these bytes.
    const char garbage[] = "\x07\xff\xff\xff";
    grpc::Slice slice(garbage, sizeof garbage - 1);
    stream->Write(grpc::ByteBuffer(&slice, 1));
    stream->WritesDone();
    grpc::ByteBuffer ignored;
    while (stream->Read(&ignored)) {
    }
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("could not be parsed as logitd.v1.LogitsRequest"),
              std::string::npos)
        << status.error_message();
  }
}

}  // namespace
}  // namespace logitd::testing
