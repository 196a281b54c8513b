// Calls made through the stubs generated from the proto, as a client in any
// language makes them: request chunks written as TensorChunk messages,
// responses read and reassembled message by message.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/wire.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {

// Streams `t` as the chunks of a request stream of Request messages.
template <typename Request, typename Stream>
inline bool WriteChunks(Stream& stream, const char* name, const Tensor& t) {
  return wire::SendChunks(name, t.bytes(), t.nbytes(), wire::kDefaultChunkBytes,
                          [&](v1::TensorChunk&& c) {
                            Request r;
                            *r.mutable_chunk() = std::move(c);
                            return stream.Write(r);
                          })
      .ok();
}

// A deadline for a call.
inline void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
}

// What a response stream carried: its parts in order ("result",
// "chunk:NAME" once per run of a tensor's chunks, "digest:NAME"), the result
// message, each tensor's bytes and each trailing digest.
template <typename Response>
struct Received {
  std::vector<std::string> order;
  Response result;
  std::map<std::string, std::string> bytes;
  std::map<std::string, std::uint64_t> digests;
};

template <typename Response, typename Stream>
Received<Response> ReadAll(Stream& stream) {
  Received<Response> r;
  Response response;
  while (stream.Read(&response)) {
    if (response.has_result()) {
      r.order.push_back("result");
      r.result = response;
    } else if (response.has_chunk()) {
      const std::string& name = response.chunk().name();
      if (r.order.empty() || r.order.back() != "chunk:" + name) r.order.push_back("chunk:" + name);
      std::string& bytes = r.bytes[name];
      EXPECT_EQ(response.chunk().offset(), bytes.size()) << name;
      bytes += response.chunk().data();
    } else if (response.has_digest()) {
      r.order.push_back("digest:" + response.digest().name());
      r.digests[response.digest().name()] = response.digest().xxh3();
    }
  }
  return r;
}

inline std::string BytesOf(const Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.bytes()), t.nbytes());
}

// Each output of a result: its bytes arrived whole and match the digest its
// spec announced.
template <typename Response>
void ExpectIntact(const Received<Response>& got, const v1::TensorSpec& spec,
                  std::uint64_t want_bytes) {
  SCOPED_TRACE(spec.name());
  ASSERT_EQ(got.bytes.count(spec.name()), 1u);
  const std::string& bytes = got.bytes.at(spec.name());
  ASSERT_EQ(bytes.size(), want_bytes);
  EXPECT_EQ(Xxh3(bytes.data(), bytes.size()), spec.xxh3());
}

// Logits, Backward, FetchGradient, CrossEntropy and Cast through `stub`,
// each returning an output of scale * 64 MiB (Cast's input is twice that),
// checked whole against its digest. `register_weight` registers a weight and
// returns its handle; `client` accumulates the gradient FetchGradient reads.
inline void ExpectEveryTensorCallStreams(
    v1::Logitd::Stub* stub, client::Client& client, std::int64_t scale,
    const std::function<std::string(const Tensor&, const std::string&)>& register_weight) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(scale) << 26;
  const auto finish = [](auto& stream) {
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
  };
  {  // Logits: Y fp32 [1024 * scale, 16384].
    const std::string handle = register_weight(IntBf16({16384, 64}, 31), "default-logits");
    const Tensor x = IntBf16({1024 * scale, 64}, 32);
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->Logits(&context);
    v1::LogitsRequest request;
    request.mutable_header()->set_weight_handle(handle);
    *request.mutable_header()->mutable_x() = wire::MakeSpec("x", x);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(WriteChunks<v1::LogitsRequest>(*stream, "x", x));
    stream->WritesDone();
    const Received<v1::LogitsResponse> got = ReadAll<v1::LogitsResponse>(*stream);
    finish(stream);
    ExpectIntact(got, got.result.result().y(), bytes);
  }
  // Backward, FetchGradient and CrossEntropy: dW fp32 [65536 * scale, 256].
  const std::string handle = register_weight(IntBf16({65536 * scale, 256}, 33), "default-dw");
  const Tensor x = IntBf16({4, 256}, 34);
  const Tensor dy = IntFp32({4, 65536 * scale}, 35);
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->Backward(&context);
    v1::BackwardRequest request;
    v1::BackwardHeader* h = request.mutable_header();
    h->set_weight_handle(handle);
    *h->mutable_dy() = wire::MakeSpec("dy", dy);
    *h->mutable_x() = wire::MakeSpec("x", x);
    h->set_want_dw(true);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(WriteChunks<v1::BackwardRequest>(*stream, "dy", dy));
    ASSERT_TRUE(WriteChunks<v1::BackwardRequest>(*stream, "x", x));
    stream->WritesDone();
    const Received<v1::BackwardResponse> got = ReadAll<v1::BackwardResponse>(*stream);
    finish(stream);
    ExpectIntact(got, got.result.result().dw(), bytes);
  }
  {
    client::BackwardOptions accumulate;
    accumulate.want_dx = false;
    accumulate.accumulate_dw = true;
    ASSERT_TRUE(client.Backward(dy, x, handle, accumulate).ok());
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::FetchGradientRequest request;
    request.set_weight_handle(handle);
    auto stream = stub->FetchGradient(&context, request);
    const Received<v1::FetchGradientResponse> got = ReadAll<v1::FetchGradientResponse>(*stream);
    finish(stream);
    EXPECT_EQ(got.result.result().accumulated_calls(), 1u);
    ExpectIntact(got, got.result.result().dw(), bytes);
  }
  {
    Tensor targets(DType::kInt32, {4});
    for (int i = 0; i < 4; ++i) targets.data<std::int32_t>()[i] = 1000 * i + 7;
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->CrossEntropy(&context);
    v1::CrossEntropyRequest request;
    v1::CrossEntropyHeader* h = request.mutable_header();
    h->set_weight_handle(handle);
    *h->mutable_x() = wire::MakeSpec("x", x);
    *h->mutable_targets() = wire::MakeSpec("targets", targets);
    h->set_want_dw(true);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(WriteChunks<v1::CrossEntropyRequest>(*stream, "x", x));
    ASSERT_TRUE(WriteChunks<v1::CrossEntropyRequest>(*stream, "targets", targets));
    stream->WritesDone();
    const Received<v1::CrossEntropyResponse> got = ReadAll<v1::CrossEntropyResponse>(*stream);
    finish(stream);
    ExpectIntact(got, got.result.result().dw(), bytes);
  }
  {  // Cast: fp32 [8192 * scale, 4096] in, bf16 out.
    const Tensor in = IntFp32({8192 * scale, 4096}, 36);
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->Cast(&context);
    v1::CastRequest request;
    *request.mutable_header()->mutable_input() = wire::MakeSpec("input", in);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(WriteChunks<v1::CastRequest>(*stream, "input", in));
    stream->WritesDone();
    const Received<v1::CastResponse> got = ReadAll<v1::CastResponse>(*stream);
    finish(stream);
    ExpectIntact(got, got.result.result().output(), bytes);
  }
}

}  // namespace logitd::testing
