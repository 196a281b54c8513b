// Calls made through the stubs generated from the proto, as a client in any
// language makes them: request chunks written as TensorChunk messages,
// responses read and reassembled message by message.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
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
// message, each tensor's bytes and each trailing digest; and, for a call made
// by CallThroughStub, the status the call finished with.
template <typename Response>
struct Received {
  std::vector<std::string> order;
  Response result;
  std::map<std::string, std::string> bytes;
  std::map<std::string, std::uint64_t> digests;
  grpc::Status status;
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

// A request's tensors, in the order their chunks follow the header.
using StubInputs = std::vector<std::pair<const char*, const Tensor*>>;

// A request stream as any client writes it: the header message, each input's
// chunks in turn, WritesDone. Fatal failures return early: call it inside
// ASSERT_NO_FATAL_FAILURE.
template <typename Request, typename Stream>
void WriteRequest(Stream& stream, const Request& header, const StubInputs& inputs) {
  ASSERT_TRUE(stream.Write(header));
  for (const auto& [name, t] : inputs) {
    ASSERT_TRUE(WriteChunks<Request>(stream, name, *t)) << name;
  }
  stream.WritesDone();
}

// A whole bidirectional call through the generated stub, e.g.
// CallThroughStub(stub, &v1::Logitd::Stub::Logits, ...): a deadline, the
// request stream as WriteRequest writes it, the response read to its end and
// the call finished (got->status). Call it inside ASSERT_NO_FATAL_FAILURE.
template <typename Request, typename Response>
void CallThroughStub(v1::Logitd::Stub* stub,
                     std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> (
                         v1::Logitd::Stub::*method)(grpc::ClientContext*),
                     const Request& header, const StubInputs& inputs, Received<Response>* got) {
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = (stub->*method)(&context);
  ASSERT_NO_FATAL_FAILURE(WriteRequest(*stream, header, inputs));
  *got = ReadAll<Response>(*stream);
  got->status = stream->Finish();
}

// The same for a server-streaming call (FetchGradient): one request message.
template <typename Request, typename Response>
void CallThroughStub(v1::Logitd::Stub* stub,
                     std::unique_ptr<grpc::ClientReader<Response>> (v1::Logitd::Stub::*method)(
                         grpc::ClientContext*, const Request&),
                     const Request& request, Received<Response>* got) {
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = (stub->*method)(&context, request);
  *got = ReadAll<Response>(*stream);
  got->status = stream->Finish();
}

// The requests and calls of the stream-order tests and
// ExpectEveryTensorCallStreams. Each ...ThroughStub is CallThroughStub for one
// RPC (call it inside ASSERT_NO_FATAL_FAILURE too); digest_last asks for each
// output's digest after its chunks.

// Logits of x against `handle`.
inline v1::LogitsRequest MakeLogitsRequest(const std::string& handle, const Tensor& x,
                                           bool digest_last) {
  v1::LogitsRequest request;
  v1::LogitsHeader* h = request.mutable_header();
  h->set_weight_handle(handle);
  *h->mutable_x() = wire::MakeSpec("x", x);
  h->set_digest_last(digest_last);
  return request;
}

inline void LogitsThroughStub(v1::Logitd::Stub* stub, const std::string& handle, const Tensor& x,
                              bool digest_last, Received<v1::LogitsResponse>* got) {
  CallThroughStub(stub, &v1::Logitd::Stub::Logits, MakeLogitsRequest(handle, x, digest_last),
                  {{"x", &x}}, got);
}

// Backward of dy and x against `handle`, asking for dW (and dX when want_dx).
inline void BackwardThroughStub(v1::Logitd::Stub* stub, const std::string& handle, const Tensor& dy,
                                const Tensor& x, bool want_dx, bool digest_last,
                                Received<v1::BackwardResponse>* got) {
  v1::BackwardRequest request;
  v1::BackwardHeader* h = request.mutable_header();
  h->set_weight_handle(handle);
  *h->mutable_dy() = wire::MakeSpec("dy", dy);
  *h->mutable_x() = wire::MakeSpec("x", x);
  h->set_want_dx(want_dx);
  h->set_want_dw(true);
  h->set_digest_last(digest_last);
  CallThroughStub(stub, &v1::Logitd::Stub::Backward, request, {{"dy", &dy}, {"x", &x}}, got);
}

inline void FetchGradientThroughStub(v1::Logitd::Stub* stub, const std::string& handle,
                                     bool digest_last, Received<v1::FetchGradientResponse>* got) {
  v1::FetchGradientRequest request;
  request.set_weight_handle(handle);
  request.set_digest_last(digest_last);
  CallThroughStub(stub, &v1::Logitd::Stub::FetchGradient, request, got);
}

inline void CastThroughStub(v1::Logitd::Stub* stub, const Tensor& in, bool digest_last,
                            Received<v1::CastResponse>* got) {
  v1::CastRequest request;
  *request.mutable_header()->mutable_input() = wire::MakeSpec("input", in);
  request.mutable_header()->set_digest_last(digest_last);
  CallThroughStub(stub, &v1::Logitd::Stub::Cast, request, {{"input", &in}}, got);
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
  const auto expect_finished = [](const auto& got) {
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  };
  {  // Logits: Y fp32 [1024 * scale, 16384].
    const std::string handle = register_weight(IntBf16({16384, 64}, 31), "default-logits");
    const Tensor x = IntBf16({1024 * scale, 64}, 32);
    Received<v1::LogitsResponse> got;
    ASSERT_NO_FATAL_FAILURE(LogitsThroughStub(stub, handle, x, /*digest_last=*/false, &got));
    expect_finished(got);
    ExpectIntact(got, got.result.result().y(), bytes);
  }
  // Backward, FetchGradient and CrossEntropy: dW fp32 [65536 * scale, 256].
  const std::string handle = register_weight(IntBf16({65536 * scale, 256}, 33), "default-dw");
  const Tensor x = IntBf16({4, 256}, 34);
  const Tensor dy = IntFp32({4, 65536 * scale}, 35);
  {
    Received<v1::BackwardResponse> got;
    ASSERT_NO_FATAL_FAILURE(BackwardThroughStub(stub, handle, dy, x, /*want_dx=*/false,
                                                /*digest_last=*/false, &got));
    expect_finished(got);
    ExpectIntact(got, got.result.result().dw(), bytes);
  }
  {
    client::BackwardOptions accumulate;
    accumulate.want_dx = false;
    accumulate.accumulate_dw = true;
    ASSERT_TRUE(client.Backward(dy, x, handle, accumulate).ok());
    Received<v1::FetchGradientResponse> got;
    FetchGradientThroughStub(stub, handle, /*digest_last=*/false, &got);
    expect_finished(got);
    EXPECT_EQ(got.result.result().accumulated_calls(), 1u);
    ExpectIntact(got, got.result.result().dw(), bytes);
  }
  {
    Tensor targets(DType::kInt32, {4});
    for (int i = 0; i < 4; ++i) targets.data<std::int32_t>()[i] = 1000 * i + 7;
    v1::CrossEntropyRequest request;
    v1::CrossEntropyHeader* h = request.mutable_header();
    h->set_weight_handle(handle);
    *h->mutable_x() = wire::MakeSpec("x", x);
    *h->mutable_targets() = wire::MakeSpec("targets", targets);
    h->set_want_dw(true);
    Received<v1::CrossEntropyResponse> got;
    ASSERT_NO_FATAL_FAILURE(CallThroughStub(stub, &v1::Logitd::Stub::CrossEntropy, request,
                                            {{"x", &x}, {"targets", &targets}}, &got));
    expect_finished(got);
    ExpectIntact(got, got.result.result().dw(), bytes);
  }
  {  // Cast: fp32 [8192 * scale, 4096] in, bf16 out.
    const Tensor in = IntFp32({8192 * scale, 4096}, 36);
    Received<v1::CastResponse> got;
    ASSERT_NO_FATAL_FAILURE(CastThroughStub(stub, in, /*digest_last=*/false, &got));
    expect_finished(got);
    ExpectIntact(got, got.result.result().output(), bytes);
  }
}

}  // namespace logitd::testing
