// Both front doors of the real logitd, logitd.v1 (through its generated
// stub) and the Open Inference Protocol's ModelInfer, given the same bad
// input: each is refused with the same code and the same message, since
// both build one protocol-neutral call and run one validation.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"
#include "kserve/grpc_predict_v2.grpc.pb.h"
#include "logitd/protocol.h"
#include "logitd/wire/wire.h"
#include "tests/common/stub_stream.h"
#include "tests/common/targets.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/stub_calls.h"

namespace logitd::testing {
namespace {

constexpr std::int64_t kV = 80;
constexpr std::int64_t kK = 32;
constexpr std::int64_t kM = 3;

// One bad input, as both doors can say it: the Logits RPC and model NAME,
// or (logprobs) the LogProbs RPC and model NAME/logprobs.
struct BadInput {
  std::string what;
  bool logprobs = false;
  std::string x_dtype = "BF16";
  std::vector<std::int64_t> x_shape = {kM, kK};
  std::string out_dtype;  // Logits: "" unspecified
  float alpha = 0.0f;
  // LogProbs:
  std::optional<Tensor> targets;
  float temperature = 0.0f;
  float logit_softcap = 0.0f;
  std::int64_t vocab_size = 0;
  std::int64_t top_k = 0;
  bool want_lse = true;
  bool want_rank = false;
};

// The bytes of a tensor of `dtype` and `shape` (any shape: a bad one
// gives what its dims multiply to).
std::string Bytes(const std::string& dtype, const std::vector<std::int64_t>& shape) {
  std::int64_t n = dtype == "BF16" ? 2 : 4;
  for (std::int64_t d : shape) n *= std::max<std::int64_t>(d, 0);
  std::string bytes(static_cast<std::size_t>(n), '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>(i % 7 == 0 ? 0x3f : 0);
  return bytes;
}

v1::TensorSpec Spec(const std::string& name, const std::string& dtype,
                    const std::vector<std::int64_t>& shape, const std::string& bytes) {
  v1::TensorSpec spec;
  spec.set_name(name);
  v1::DType d = v1::DTYPE_UNSPECIFIED;
  EXPECT_TRUE(v1::DType_Parse("DTYPE_" + dtype, &d)) << dtype;
  spec.set_dtype(d);
  for (std::int64_t s : shape) spec.add_shape(s);
  spec.set_xxh3(Xxh3(bytes.data(), bytes.size()));
  return spec;
}

// A call through the generated stub: the header, then the inputs' chunks
// (a refused header ends the call while they are still being written).
template <typename Request, typename Response>
grpc::Status Refusal(v1::Logitd::Stub* stub,
                     std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> (
                         v1::Logitd::Stub::*method)(grpc::ClientContext*),
                     const Request& header, const StubInputs& inputs) {
  std::vector<Request> messages = {header};
  for (const auto& [name, t] : inputs) {
    EXPECT_TRUE(wire::SendChunks(name, t->bytes(), t->nbytes(), wire::kDefaultChunkBytes,
                                 [&](v1::TensorChunk&& c) {
                                   *messages.emplace_back().mutable_chunk() = std::move(c);
                                   return true;
                                 })
                    .ok());
  }
  grpc::ClientContext context;
  SetDeadline(&context);
  auto stream = (stub->*method)(&context);
  return FinishAfterWriting<Response>(*stream, messages);
}

class FrontDoorsTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer({});
    if (server_ == nullptr) return;
    w_ = new Tensor(IntBf16({kV, kK}, 5));
    handle_ = new std::string(Register(*w_, "doors_head"));
  }
  static void TearDownTestSuite() {
    delete w_;
    delete handle_;
    SharedServerTest::TearDownTestSuite();
  }

  // The call through logitd.v1's generated stub: the header, then the
  // inputs' chunks where their bytes are what their spec says.
  grpc::Status ThroughV1(const std::string& address, const BadInput& b) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    auto stub = v1::Logitd::NewStub(channel);
    const std::string x = Bytes(b.x_dtype, b.x_shape);
    const Tensor x_tensor = TensorOfBytes(x);
    if (!b.logprobs) {
      v1::LogitsRequest request;
      v1::LogitsHeader* h = request.mutable_header();
      h->set_weight_handle(*handle_);
      *h->mutable_x() = Spec("x", b.x_dtype, b.x_shape, x);
      if (!b.out_dtype.empty()) {
        v1::DType d = v1::DTYPE_UNSPECIFIED;
        EXPECT_TRUE(v1::DType_Parse("DTYPE_" + b.out_dtype, &d));
        h->set_out_dtype(d);
      }
      h->set_alpha(b.alpha);
      return Refusal(stub.get(), &v1::Logitd::Stub::Logits, request, {{"x", &x_tensor}});
    }
    v1::LogProbsRequest request;
    v1::LogProbsHeader* h = request.mutable_header();
    h->set_weight_handle(*handle_);
    *h->mutable_x() = Spec("x", b.x_dtype, b.x_shape, x);
    StubInputs inputs = {{"x", &x_tensor}};
    if (b.targets) {
      *h->mutable_targets() = wire::MakeSpec("targets", *b.targets);
      inputs.push_back({"targets", &*b.targets});
    }
    h->set_temperature(b.temperature);
    h->set_logit_softcap(b.logit_softcap);
    h->set_vocab_size(b.vocab_size);
    h->set_top_k(static_cast<std::uint32_t>(b.top_k));
    h->set_want_lse(b.want_lse);
    h->set_want_rank(b.want_rank);
    return Refusal(stub.get(), &v1::Logitd::Stub::LogProbs, request, inputs);
  }

  // The same through ModelInfer, with parameters for the options.
  grpc::Status ThroughOip(const std::string& address, const BadInput& b) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    auto stub = inference::GRPCInferenceService::NewStub(channel);
    inference::ModelInferRequest req;
    req.set_model_name(b.logprobs ? "doors_head/logprobs" : "doors_head");
    auto* x = req.add_inputs();
    x->set_name("x");
    x->set_datatype(b.x_dtype);
    for (std::int64_t d : b.x_shape) x->add_shape(d);
    req.add_raw_input_contents(Bytes(b.x_dtype, b.x_shape));
    auto& p = *req.mutable_parameters();
    if (!b.logprobs) {
      if (!b.out_dtype.empty()) p["out_dtype"].set_string_param(absl::AsciiStrToLower(b.out_dtype));
      if (b.alpha != 0.0f) p["alpha"].set_double_param(b.alpha);
    } else {
      if (b.targets) {
        auto* t = req.add_inputs();
        t->set_name("targets");
        t->set_datatype(absl::AsciiStrToUpper(DTypeName(b.targets->dtype())));
        for (std::int64_t d : b.targets->shape()) t->add_shape(d);
        req.add_raw_input_contents(
            std::string(reinterpret_cast<const char*>(b.targets->bytes()), b.targets->nbytes()));
      }
      if (b.temperature != 0.0f) p["temperature"].set_double_param(b.temperature);
      if (b.logit_softcap != 0.0f) p["logit_softcap"].set_double_param(b.logit_softcap);
      if (b.vocab_size != 0) p["vocab_size"].set_int64_param(b.vocab_size);
      if (b.top_k != 0) p["top_k"].set_int64_param(b.top_k);
      if (b.want_lse) p["want_lse"].set_bool_param(true);
      if (b.want_rank) p["want_rank"].set_bool_param(true);
    }
    inference::ModelInferResponse resp;
    grpc::ClientContext context;
    return stub->ModelInfer(&context, req, &resp);
  }

  void ExpectSameRefusal(const std::string& address, const BadInput& b) {
    const grpc::Status v1 = ThroughV1(address, b);
    const grpc::Status oip = ThroughOip(address, b);
    EXPECT_EQ(v1.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << b.what << ": " << v1.error_message();
    EXPECT_EQ(oip.error_code(), v1.error_code()) << b.what << ": " << oip.error_message();
    EXPECT_EQ(oip.error_message(), v1.error_message()) << b.what;
  }

  static Tensor TensorOfBytes(const std::string& bytes) {
    Tensor t(DType::kBf16, {static_cast<std::int64_t>(bytes.size() / 2)});
    if (!bytes.empty()) std::memcpy(t.bytes(), bytes.data(), bytes.size());
    return t;
  }

  static Tensor* w_;
  static std::string* handle_;
};

Tensor* FrontDoorsTest::w_ = nullptr;
std::string* FrontDoorsTest::handle_ = nullptr;

TEST_F(FrontDoorsTest, TheSameBadInputGetsTheSameCodeAndMessage) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<BadInput> table;
  const auto add = [&](std::string what, bool logprobs) -> BadInput& {
    table.emplace_back();
    table.back().what = std::move(what);
    table.back().logprobs = logprobs;
    return table.back();
  };
  for (bool logprobs : {false, true}) {
    const std::string rpc = logprobs ? "LogProbs: " : "Logits: ";
    add(rpc + "x of dtype FP32", logprobs).x_dtype = "FP32";
    add(rpc + "x of rank 3", logprobs).x_shape = {1, kM, kK};
    add(rpc + "x of another K", logprobs).x_shape = {kM, kK + 1};
    add(rpc + "x of no rows", logprobs).x_shape = {0, kK};
  }
  add("out_dtype INT32", false).out_dtype = "INT32";
  add("alpha inf", false).alpha = inf;
  add("top_k past its limit", true).top_k = kMaxTopK + 1;
  add("vocab_size past V", true).vocab_size = kV + 1;
  add("temperature below 0", true).temperature = -1.0f;
  add("logit_softcap below 0", true).logit_softcap = -2.0f;
  add("want_rank without targets", true).want_rank = true;
  {
    BadInput& b = add("no output asked for", true);
    b.want_lse = false;
  }
  add("targets past V", true).targets = TargetsTensor(DType::kInt64, {1, kV, 3});
  add("targets of another M", true).targets = TargetsTensor(DType::kInt64, {1, 2, 3, 4});
  add("targets of dtype FP32", true).targets = Tensor(DType::kFp32, {kM});
  for (const BadInput& b : table) ExpectSameRefusal(server_->process.address(), b);
}

TEST_F(FrontDoorsTest, AnOversizeCallGetsTheSameRefusal) {
  // x [3, 32] bf16 and y [3, 80] fp32 are 1,152 bytes; LogProbs' outputs less.
  absl::StatusOr<std::unique_ptr<SharedServer>> small =
      SharedServer::Start({"--max_request_bytes=1000"});
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE((*small)->client->RegisterWeight(*w_, "doors_head").ok());
  BadInput logits;
  logits.what = "Logits over --max_request_bytes";
  const grpc::Status v1 = ThroughV1((*small)->process.address(), logits);
  const grpc::Status oip = ThroughOip((*small)->process.address(), logits);
  EXPECT_EQ(v1.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << v1.error_message();
  EXPECT_EQ(oip.error_code(), v1.error_code()) << oip.error_message();
  EXPECT_EQ(oip.error_message(), v1.error_message());
}

}  // namespace
}  // namespace logitd::testing
