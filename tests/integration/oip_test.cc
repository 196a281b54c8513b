// The Open Inference Protocol front door (KServe v2 inference.
// GRPCInferenceService) of the real logitd, called through the generated stub
// with default channel options: metadata, readiness, ModelInfer's exact and
// bounded results, and its refusals.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kserve/grpc_predict_v2.grpc.pb.h"
#include "logitd/bf16.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

constexpr std::int64_t kV = 96;
constexpr std::int64_t kK = 64;

class OipTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer({});
    if (server_ == nullptr) return;
    channel_ = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel(server_->process.address(), grpc::InsecureChannelCredentials()));
    stub_ = GRPCInferenceService::NewStub(*channel_).release();
    w_ = new Tensor(IntBf16({kV, kK}, 11));
    handle_ = new std::string(Register(*w_, "lm_head"));
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete channel_;
    delete w_;
    delete handle_;
    SharedServerTest::TearDownTestSuite();
  }

  static GRPCInferenceService::Stub& stub() { return *stub_; }

  // A request for `model` with x as its raw input.
  static ModelInferRequest Request(const std::string& model, const Tensor& x) {
    ModelInferRequest req;
    req.set_model_name(model);
    req.set_id("req-1");
    auto* in = req.add_inputs();
    in->set_name("x");
    in->set_datatype("BF16");
    for (std::int64_t d : x.shape()) in->add_shape(d);
    req.add_raw_input_contents(std::string(reinterpret_cast<const char*>(x.bytes()), x.nbytes()));
    return req;
  }

  static grpc::Status Infer(const ModelInferRequest& req, ModelInferResponse* resp) {
    grpc::ClientContext context;
    return stub().ModelInfer(&context, req, resp);
  }

  // The response's one output as a tensor of `dtype`.
  static Tensor Output(const ModelInferResponse& resp, DType dtype) {
    EXPECT_EQ(resp.outputs_size(), 1);
    EXPECT_EQ(resp.raw_output_contents_size(), 1);
    if (resp.outputs_size() != 1 || resp.raw_output_contents_size() != 1) return Tensor();
    const auto& out = resp.outputs(0);
    Tensor t(dtype, {out.shape().begin(), out.shape().end()});
    EXPECT_EQ(resp.raw_output_contents(0).size(), t.nbytes());
    std::memcpy(t.bytes(), resp.raw_output_contents(0).data(),
                std::min(t.nbytes(), resp.raw_output_contents(0).size()));
    return t;
  }

  static inline std::shared_ptr<grpc::Channel>* channel_ = nullptr;
  static inline GRPCInferenceService::Stub* stub_ = nullptr;
  static inline Tensor* w_ = nullptr;
  static inline std::string* handle_ = nullptr;
};

TEST_F(OipTest, ServerLiveReadyAndMetadata) {
  grpc::ClientContext c1, c2, c3;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(stub().ServerLive(&c1, {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub().ServerReady(&c2, {}, &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ServerMetadataResponse meta;
  ASSERT_TRUE(stub().ServerMetadata(&c3, {}, &meta).ok());
  EXPECT_EQ(meta.name(), "logitd");
  EXPECT_FALSE(meta.version().empty());
}

TEST_F(OipTest, ModelMetadataAndReadyByNameAndHandle) {
  for (const std::string& model : {std::string("lm_head"), *handle_}) {
    grpc::ClientContext c1, c2;
    inference::ModelMetadataRequest req;
    req.set_name(model);
    inference::ModelMetadataResponse meta;
    grpc::Status s = stub().ModelMetadata(&c1, req, &meta);
    ASSERT_TRUE(s.ok()) << model << ": " << s.error_message();
    EXPECT_EQ(meta.name(), model);
    ASSERT_EQ(meta.versions_size(), 1);
    EXPECT_EQ(meta.versions(0), "1");
    ASSERT_EQ(meta.inputs_size(), 1);
    EXPECT_EQ(meta.inputs(0).name(), "x");
    EXPECT_EQ(meta.inputs(0).datatype(), "BF16");
    EXPECT_EQ(
        std::vector<std::int64_t>(meta.inputs(0).shape().begin(), meta.inputs(0).shape().end()),
        (std::vector<std::int64_t>{-1, kK}));
    ASSERT_EQ(meta.outputs_size(), 1);
    EXPECT_EQ(meta.outputs(0).name(), "logits");
    EXPECT_EQ(meta.outputs(0).datatype(), "FP32");
    EXPECT_EQ(
        std::vector<std::int64_t>(meta.outputs(0).shape().begin(), meta.outputs(0).shape().end()),
        (std::vector<std::int64_t>{-1, kV}));
    inference::ModelReadyRequest rr;
    rr.set_name(model);
    inference::ModelReadyResponse ready;
    ASSERT_TRUE(stub().ModelReady(&c2, rr, &ready).ok());
    EXPECT_TRUE(ready.ready());
  }
  grpc::ClientContext c3, c4;
  inference::ModelReadyRequest rr;
  rr.set_name("no_such_model");
  inference::ModelReadyResponse ready;
  ASSERT_TRUE(stub().ModelReady(&c3, rr, &ready).ok());
  EXPECT_FALSE(ready.ready());
  inference::ModelMetadataRequest mr;
  mr.set_name("no_such_model");
  inference::ModelMetadataResponse meta;
  EXPECT_EQ(stub().ModelMetadata(&c4, mr, &meta).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(OipTest, ModelInferExactIntegerLogits) {
  const Tensor x = IntBf16({5, kK}, 12);
  ModelInferResponse resp;
  grpc::Status s = Infer(Request("lm_head", x), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.model_name(), "lm_head");
  EXPECT_EQ(resp.model_version(), "1");
  EXPECT_EQ(resp.id(), "req-1");
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).name(), "logits");
  EXPECT_EQ(resp.outputs(0).datatype(), "FP32");
  const Tensor y = Output(resp, DType::kFp32);
  EXPECT_TRUE(Fp32EqualsExact(y, ExactNT(x, *w_), {5, kV}));
}

TEST_F(OipTest, ModelInferBf16OutAndAlphaByHandle) {
  const Tensor x = IntBf16({3, kK}, 13);
  ModelInferRequest req = Request(*handle_, x);
  (*req.mutable_parameters())["out_dtype"].set_string_param("bf16");
  (*req.mutable_parameters())["alpha"].set_int64_param(2);
  req.add_outputs()->set_name("logits");
  ModelInferResponse resp;
  grpc::Status s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).datatype(), "BF16");
  std::vector<std::int64_t> want = ExactNT(x, *w_);
  for (std::int64_t& v : want) v *= 2;
  EXPECT_TRUE(Bf16EqualsRoundedExact(Output(resp, DType::kBf16), want, {3, kV}));
}

TEST_F(OipTest, ModelInferFp32WithinBound) {
  const Tensor w = NormalBf16({kV, kK}, 21);
  Register(w, "normal_head");
  const Tensor x = NormalBf16({7, kK}, 22);
  ModelInferRequest req = Request("normal_head", x);
  (*req.mutable_parameters())["alpha"].set_string_param("0.5");
  ModelInferResponse resp;
  grpc::Status s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const Tensor y = Output(resp, DType::kFp32);
  const double u = std::ldexp(1.0, -24);
  const double gamma = kK * u / (1 - kK * u);
  for (std::int64_t i = 0; i < 7; ++i) {
    for (std::int64_t j = 0; j < kV; ++j) {
      double exact = 0, abs = 0;
      for (std::int64_t k = 0; k < kK; ++k) {
        const double p = x.At(i * kK + k) * w.At(j * kK + k);
        exact += p;
        abs += std::fabs(p);
      }
      // alpha = 0.5 is exact; one more rounding when fp32 accumulates.
      const double got = y.At(i * kV + j);
      EXPECT_LE(std::fabs(got - 0.5 * exact), 0.5 * (gamma * abs) + std::fabs(0.5 * exact) * u)
          << "row " << i << " col " << j;
    }
  }
}

TEST_F(OipTest, MissingModelIsNotFound) {
  ModelInferResponse resp;
  grpc::Status s = Infer(Request("no_such_model", IntBf16({1, kK}, 1)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("no_such_model"), std::string::npos) << s.error_message();
  ModelInferRequest req = Request("lm_head", IntBf16({1, kK}, 1));
  req.set_model_version("2");
  EXPECT_EQ(Infer(req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(OipTest, BadInputsAreInvalidArgument) {
  const Tensor x = IntBf16({2, kK}, 2);
  std::vector<ModelInferRequest> bad;
  bad.push_back(Request("lm_head", x));
  bad.back().mutable_inputs(0)->set_name("input");
  bad.push_back(Request("lm_head", x));
  bad.back().mutable_inputs(0)->set_datatype("FP32");
  bad.push_back(Request("lm_head", x));
  bad.back().mutable_inputs(0)->set_shape(1, kK + 1);
  bad.push_back(Request("lm_head", x));
  bad.back().mutable_inputs(0)->clear_shape();
  bad.push_back(Request("lm_head", x));
  bad.back().mutable_raw_input_contents(0)->pop_back();
  bad.push_back(Request("lm_head", x));
  bad.back().clear_raw_input_contents();
  bad.push_back(Request("lm_head", x));
  bad.back().add_outputs()->set_name("probs");
  bad.push_back(Request("lm_head", x));
  (*bad.back().mutable_parameters())["out_dtype"].set_string_param("fp8");
  for (std::size_t i = 0; i < bad.size(); ++i) {
    ModelInferResponse resp;
    grpc::Status s = Infer(bad[i], &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("expected"), std::string::npos)
        << i << ": " << s.error_message();
  }
}

TEST_F(OipTest, OversizeResponseNamesTheLimit) {
  // 11,000 rows x 96 fp32 logits = 4.2 MB: over the default 4 MiB message.
  ModelInferResponse resp;
  grpc::Status s = Infer(Request("lm_head", IntBf16({11000, kK}, 3)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max message size of 4194304"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("Logits"), std::string::npos) << s.error_message();
}

TEST_F(OipTest, OversizeRequestNamesTheLimit) {
  // x [2100, 1024] bf16 = 4.3 MB: over the 4 MiB + 4 KiB a request may be,
  // under what gRPC itself lets through; the logits are small.
  Register(IntBf16({16, 1024}, 41), "wide_head");
  ModelInferResponse resp;
  grpc::Status s = Infer(Request("wide_head", IntBf16({2100, 1024}, 42)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("the request ("), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("max message size of 4198400"), std::string::npos)
      << s.error_message();
}

TEST(OipOffTest, OipFalseIsUnimplemented) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({"--oip=false"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = GRPCInferenceService::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  inference::ServerLiveResponse live;
  EXPECT_EQ(stub->ServerLive(&context, {}, &live).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(ServerAnswers(*(*server)->client));
}

// Tokens and tenants apply as for logitd's own calls: a tenant's models are
// its weights.
TEST(OipTokenTest, TenantsSeeTheirOwnModelsOnly) {
  const std::string tokens = ::testing::TempDir() + "/oip_test_tokens";
  {
    std::ofstream f(tokens);
    f << "tok-a team-a\ntok-b team-b\n";
  }
  client::ClientOptions as_a;
  as_a.auth_token = "tok-a";
  absl::StatusOr<std::unique_ptr<SharedServer>> server =
      SharedServer::Start({"--auth_tokens=" + tokens}, as_a);
  ASSERT_TRUE(server.ok()) << server.status();
  const Tensor w = IntBf16({kV, kK}, 31);
  ASSERT_TRUE((*server)->client->RegisterWeight(w, "team_a_head").ok());
  auto stub = GRPCInferenceService::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  const Tensor x = IntBf16({2, kK}, 32);
  ModelInferRequest req;
  req.set_model_name("team_a_head");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("BF16");
  in->add_shape(2);
  in->add_shape(kK);
  req.add_raw_input_contents(std::string(reinterpret_cast<const char*>(x.bytes()), x.nbytes()));
  const auto call = [&](const std::string& token, ModelInferResponse* resp) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    return stub->ModelInfer(&context, req, resp);
  };
  ModelInferResponse resp;
  EXPECT_EQ(call("", &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("tok-b", &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::Status s = call("tok-a", &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.raw_output_contents_size(), 1);
  Tensor y(DType::kFp32, {2, kV});
  ASSERT_EQ(resp.raw_output_contents(0).size(), y.nbytes());
  std::memcpy(y.bytes(), resp.raw_output_contents(0).data(), y.nbytes());
  EXPECT_TRUE(Fp32EqualsExact(y, ExactNT(x, w), {2, kV}));
  std::remove(tokens.c_str());
}

}  // namespace
}  // namespace logitd::testing
