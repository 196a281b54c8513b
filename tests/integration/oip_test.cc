// The Open Inference Protocol front door (KServe v2 inference.
// GRPCInferenceService) of the real logitd, called through the generated stub
// with default channel options: metadata, readiness, ModelInfer's exact and
// bounded results, and its refusals; the system shared-memory extension;
// and the NAME/logprobs models, bitwise equal to logitd's own LogProbs.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kserve/grpc_predict_v2.grpc.pb.h"
#include "logitd/bf16.h"
#include "logitd/shared_region.h"
#include "tests/common/targets.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using ::testing::HasSubstr;
using Parameters = google::protobuf::Map<std::string, inference::InferParameter>;

constexpr std::int64_t kV = 96;
constexpr std::int64_t kK = 64;

// The Open Inference Protocol's datatype: "BF16", "FP32", "INT32", "INT64".
std::string Datatype(DType dtype) { return absl::AsciiStrToUpper(DTypeName(dtype)); }

// Input `name` with t's datatype and shape, its bytes in raw_input_contents.
void AddRawInput(ModelInferRequest* req, const std::string& name, const Tensor& t) {
  auto* in = req->add_inputs();
  in->set_name(name);
  in->set_datatype(Datatype(t.dtype()));
  for (std::int64_t d : t.shape()) in->add_shape(d);
  req->add_raw_input_contents(std::string(reinterpret_cast<const char*>(t.bytes()), t.nbytes()));
}

// The shared-memory parameters of a tensor (no offset parameter when 0).
void SetShm(Parameters* params, const std::string& region, std::int64_t bytes,
            std::int64_t offset = 0) {
  (*params)["shared_memory_region"].set_string_param(region);
  (*params)["shared_memory_byte_size"].set_int64_param(bytes);
  if (offset != 0) (*params)["shared_memory_offset"].set_int64_param(offset);
}

// Input `name` of `dtype` and `shape` in a region.
void AddShmInput(ModelInferRequest* req, const std::string& name, DType dtype,
                 const std::vector<std::int64_t>& shape, const std::string& region,
                 std::int64_t offset) {
  auto* in = req->add_inputs();
  in->set_name(name);
  in->set_datatype(Datatype(dtype));
  std::int64_t bytes = static_cast<std::int64_t>(ElementSize(dtype));
  for (std::int64_t d : shape) {
    in->add_shape(d);
    bytes *= d;
  }
  SetShm(in->mutable_parameters(), region, bytes, offset);
}

// Requested output `name`, in a region when `region` is not empty.
void AddOutput(ModelInferRequest* req, const std::string& name, const std::string& region = "",
               std::int64_t bytes = 0, std::int64_t offset = 0) {
  auto* out = req->add_outputs();
  out->set_name(name);
  if (!region.empty()) SetShm(out->mutable_parameters(), region, bytes, offset);
}

// The response's output `name` from raw_output_contents, as a tensor of
// `dtype` with the shape it declares; an empty tensor when it is missing.
Tensor RawOutput(const ModelInferResponse& resp, const std::string& name, DType dtype) {
  EXPECT_EQ(resp.outputs_size(), resp.raw_output_contents_size());
  for (int i = 0; i < resp.outputs_size() && i < resp.raw_output_contents_size(); ++i) {
    const auto& out = resp.outputs(i);
    if (out.name() != name) continue;
    EXPECT_EQ(out.datatype(), Datatype(dtype)) << name;
    Tensor t(dtype, {out.shape().begin(), out.shape().end()});
    EXPECT_EQ(resp.raw_output_contents(i).size(), t.nbytes()) << name;
    std::memcpy(t.bytes(), resp.raw_output_contents(i).data(),
                std::min(t.nbytes(), resp.raw_output_contents(i).size()));
    return t;
  }
  ADD_FAILURE() << "no output '" << name << "' in the response";
  return Tensor();
}

// A tensor of `dtype` and `shape` copied out of `data`.
Tensor FromBytes(DType dtype, std::vector<std::int64_t> shape, const std::byte* data) {
  Tensor t(dtype, std::move(shape));
  std::memcpy(t.bytes(), data, t.nbytes());
  return t;
}

class OipTest : public SharedServerTest {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer({"--allow_shm"});
    if (server_ == nullptr) return;
    stub_ = NewGeneratedStub<GRPCInferenceService>(server_->process.address());
    w_ = new Tensor(IntBf16({kV, kK}, 11));
    handle_ = new std::string(Register(*w_, "lm_head"));
  }
  static void TearDownTestSuite() {
    delete stub_;
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

  static grpc::Status RegisterRegion(const std::string& name, const std::string& key,
                                     std::uint64_t offset, std::uint64_t bytes) {
    inference::SystemSharedMemoryRegisterRequest req;
    req.set_name(name);
    req.set_key(key);
    req.set_offset(offset);
    req.set_byte_size(bytes);
    inference::SystemSharedMemoryRegisterResponse resp;
    grpc::ClientContext context;
    return stub().SystemSharedMemoryRegister(&context, req, &resp);
  }
  static grpc::Status UnregisterRegion(const std::string& name) {
    inference::SystemSharedMemoryUnregisterRequest req;
    req.set_name(name);
    inference::SystemSharedMemoryUnregisterResponse resp;
    grpc::ClientContext context;
    return stub().SystemSharedMemoryUnregister(&context, req, &resp);
  }
  static grpc::Status RegionStatus(const std::string& name,
                                   inference::SystemSharedMemoryStatusResponse* resp) {
    inference::SystemSharedMemoryStatusRequest req;
    req.set_name(name);
    grpc::ClientContext context;
    return stub().SystemSharedMemoryStatus(&context, req, resp);
  }
  // A new shared-memory object of `bytes`, registered whole as `name`.
  static client::SharedRegion NewRegion(const std::string& name, std::uint64_t bytes) {
    absl::StatusOr<client::SharedRegion> r = client::SharedRegion::Create(bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return client::SharedRegion();
    grpc::Status s = RegisterRegion(name, r->name(), 0, bytes);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return *std::move(r);
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
  EXPECT_THAT(meta.extensions(), ::testing::ElementsAre("system_shared_memory"));
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

TEST_F(OipTest, SystemSharedMemoryRegisterStatusUnregister) {
  absl::StatusOr<client::SharedRegion> object = client::SharedRegion::Create(8192);
  ASSERT_TRUE(object.ok()) << object.status();
  ASSERT_TRUE(RegisterRegion("whole", object->name(), 0, 8192).ok());
  // A window of the same object; a key without its leading '/' is the same object.
  ASSERT_TRUE(RegisterRegion("window", object->name().substr(1), 1024, 2048).ok());
  inference::SystemSharedMemoryStatusResponse all;
  ASSERT_TRUE(RegionStatus("", &all).ok());
  ASSERT_EQ(all.regions_size(), 2);
  const auto& window = all.regions().at("window");
  EXPECT_EQ(window.name(), "window");
  EXPECT_EQ(window.key(), object->name().substr(1));
  EXPECT_EQ(window.offset(), 1024u);
  EXPECT_EQ(window.byte_size(), 2048u);
  EXPECT_EQ(all.regions().at("whole").byte_size(), 8192u);
  inference::SystemSharedMemoryStatusResponse one;
  ASSERT_TRUE(RegionStatus("whole", &one).ok());
  EXPECT_EQ(one.regions_size(), 1);
  EXPECT_EQ(RegionStatus("no_such_region", &one).error_code(), grpc::StatusCode::NOT_FOUND);

  EXPECT_EQ(RegisterRegion("whole", object->name(), 0, 8192).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  grpc::Status past_end = RegisterRegion("past_end", object->name(), 4096, 4097);
  EXPECT_EQ(past_end.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(past_end.error_message(), HasSubstr("8192 bytes")) << past_end.error_message();
  EXPECT_EQ(RegisterRegion("empty", object->name(), 0, 0).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RegisterRegion("", object->name(), 0, 8).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RegisterRegion("missing", "/logitd-no-such-object", 0, 8).error_code(),
            grpc::StatusCode::NOT_FOUND);

  ASSERT_TRUE(UnregisterRegion("whole").ok());
  // As Triton: unregistering an unknown name is no error.
  EXPECT_TRUE(UnregisterRegion("whole").ok());
  ASSERT_TRUE(RegionStatus("", &all).ok());
  ASSERT_EQ(all.regions_size(), 1);
  EXPECT_EQ(all.regions().begin()->first, "window");
  ASSERT_TRUE(UnregisterRegion("").ok());
  ASSERT_TRUE(RegionStatus("", &all).ok());
  EXPECT_EQ(all.regions_size(), 0);
}

TEST_F(OipTest, ModelInferWithInputAndOutputInSharedMemory) {
  constexpr std::int64_t kM = 5;
  const Tensor x = IntBf16({kM, kK}, 51);
  const std::vector<std::int64_t> want = ExactNT(x, *w_);
  const std::uint64_t x_bytes = x.nbytes(), y_bytes = kM * kV * 4;
  // The region is a window at 512 of a larger object; x at 0 of the window,
  // y at 1024, then another y at 1026 (not aligned for fp32: written aside).
  client::SharedRegion object = *client::SharedRegion::Create(512 + 4096 + 2 * y_bytes);
  ASSERT_TRUE(RegisterRegion("io", object.name(), 512, 4096 + 2 * y_bytes).ok());
  std::memcpy(object.data() + 512, x.bytes(), x_bytes);
  for (const std::int64_t y_offset : {1024, 1026}) {
    SCOPED_TRACE(y_offset);
    ModelInferRequest req;
    req.set_model_name("lm_head");
    AddShmInput(&req, "x", DType::kBf16, {kM, kK}, "io", 0);
    AddOutput(&req, "logits", "io", y_bytes, y_offset);
    ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    // As Triton: the output is declared, its bytes are in the region, and
    // its raw_output_contents entry is empty.
    ASSERT_EQ(resp.outputs_size(), 1);
    ASSERT_EQ(resp.raw_output_contents_size(), 1);
    EXPECT_TRUE(resp.raw_output_contents(0).empty());
    const auto& out = resp.outputs(0);
    EXPECT_EQ(out.name(), "logits");
    EXPECT_EQ(out.datatype(), "FP32");
    EXPECT_THAT(out.shape(), ::testing::ElementsAre(kM, kV));
    EXPECT_EQ(out.parameters().at("shared_memory_region").string_param(), "io");
    EXPECT_EQ(out.parameters().at("shared_memory_byte_size").int64_param(), y_bytes);
    EXPECT_EQ(out.parameters().at("shared_memory_offset").int64_param(), y_offset);
    EXPECT_TRUE(Fp32EqualsExact(FromBytes(DType::kFp32, {kM, kV}, object.data() + 512 + y_offset),
                                want, {kM, kV}));
  }
  // Either side alone in shared memory.
  ModelInferRequest in_shm;
  in_shm.set_model_name("lm_head");
  AddShmInput(&in_shm, "x", DType::kBf16, {kM, kK}, "io", 0);
  ModelInferResponse resp;
  ASSERT_TRUE(Infer(in_shm, &resp).ok());
  EXPECT_TRUE(Fp32EqualsExact(RawOutput(resp, "logits", DType::kFp32), want, {kM, kV}));
  ModelInferRequest out_shm = Request("lm_head", x);
  AddOutput(&out_shm, "logits", "io", y_bytes, 2048);
  std::memset(object.data() + 512 + 2048, 0, y_bytes);
  ASSERT_TRUE(Infer(out_shm, &resp).ok());
  EXPECT_TRUE(Fp32EqualsExact(FromBytes(DType::kFp32, {kM, kV}, object.data() + 512 + 2048), want,
                              {kM, kV}));
  EXPECT_TRUE(UnregisterRegion("io").ok());
}

// One message holds at most 4 MiB of logits; a region holds more.
TEST_F(OipTest, OutputInSharedMemoryIsNotBoundByTheMessageLimit) {
  constexpr std::int64_t kM = 11000;
  const Tensor x = IntBf16({kM, kK}, 52);
  const std::uint64_t y_bytes = kM * kV * 4;
  client::SharedRegion y = NewRegion("big_y", y_bytes);
  ModelInferRequest req = Request("lm_head", x);
  AddOutput(&req, "logits", "big_y", y_bytes);
  ModelInferResponse resp;
  grpc::Status s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(
      Fp32EqualsExact(FromBytes(DType::kFp32, {kM, kV}, y.data()), ExactNT(x, *w_), {kM, kV}));
  EXPECT_TRUE(UnregisterRegion("big_y").ok());
}

TEST_F(OipTest, SharedMemoryRefusals) {
  constexpr std::int64_t kM = 2;
  const Tensor x = IntBf16({kM, kK}, 53);
  const std::int64_t x_bytes = kM * kK * 2, y_bytes = kM * kV * 4;
  client::SharedRegion region = NewRegion("small", 1024);
  std::vector<std::pair<std::string, ModelInferRequest>> bad;
  const auto with_x = [&](std::int64_t bytes, std::int64_t offset) {
    ModelInferRequest req;
    req.set_model_name("lm_head");
    AddShmInput(&req, "x", DType::kBf16, {kM, kK}, "small", offset);
    (*req.mutable_inputs(0)->mutable_parameters())["shared_memory_byte_size"].set_int64_param(
        bytes);
    return req;
  };
  bad.emplace_back("x bytes short", with_x(x_bytes - 2, 0));
  bad.emplace_back("x bytes long", with_x(x_bytes + 2, 0));
  bad.emplace_back("x past the region", with_x(x_bytes, 1024 - x_bytes + 2));
  bad.emplace_back("x offset past the region", with_x(x_bytes, 4096));
  bad.emplace_back("negative offset", with_x(x_bytes, -2));
  bad.emplace_back("y bytes", Request("lm_head", x));
  AddOutput(&bad.back().second, "logits", "small", y_bytes - 4);
  bad.emplace_back("y past the region", Request("lm_head", x));
  AddOutput(&bad.back().second, "logits", "small", y_bytes, 1024 - y_bytes + 4);
  bad.emplace_back("no byte size", Request("lm_head", x));
  AddOutput(&bad.back().second, "logits");
  (*bad.back().second.mutable_outputs(0)->mutable_parameters())["shared_memory_region"]
      .set_string_param("small");
  bad.emplace_back("raw and shm", with_x(x_bytes, 0));
  bad.back().second.add_raw_input_contents(std::string(x_bytes, '\0'));
  for (const auto& [what, req] : bad) {
    ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << what << ": " << s.error_message();
  }
  ModelInferRequest unknown = Request("lm_head", x);
  AddOutput(&unknown, "logits", "no_such_region", y_bytes);
  ModelInferResponse resp;
  grpc::Status s = Infer(unknown, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("no_such_region"));
  EXPECT_TRUE(UnregisterRegion("small").ok());
  // Unregistered, the region is unknown.
  EXPECT_EQ(Infer(with_x(x_bytes, 0), &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(OipTest, LogProbsMetadataAndReady) {
  grpc::ClientContext c1;
  inference::ModelMetadataRequest req;
  req.set_name("lm_head/logprobs");
  inference::ModelMetadataResponse meta;
  grpc::Status s = stub().ModelMetadata(&c1, req, &meta);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(meta.name(), "lm_head/logprobs");
  std::vector<std::string> inputs, outputs;
  for (const auto& t : meta.inputs()) {
    inputs.push_back(
        absl::StrCat(t.name(), " ", t.datatype(), " [", absl::StrJoin(t.shape(), ","), "]"));
  }
  for (const auto& t : meta.outputs()) {
    outputs.push_back(
        absl::StrCat(t.name(), " ", t.datatype(), " [", absl::StrJoin(t.shape(), ","), "]"));
  }
  EXPECT_THAT(inputs, ::testing::ElementsAre("x BF16 [-1,64]", "targets INT64 [-1]"));
  EXPECT_THAT(outputs, ::testing::ElementsAre("logprob FP32 [-1]", "lse FP32 [-1]",
                                              "entropy FP32 [-1]", "topk_ids INT32 [-1,-1]",
                                              "topk_logprobs FP32 [-1,-1]", "rank INT64 [-1]"));
  for (const auto& [model, ready] : {std::pair<std::string, bool>{"lm_head/logprobs", true},
                                     {*handle_ + "/logprobs", true},
                                     {"no_such_model/logprobs", false}}) {
    grpc::ClientContext c2;
    inference::ModelReadyRequest rr;
    rr.set_name(model);
    inference::ModelReadyResponse resp;
    ASSERT_TRUE(stub().ModelReady(&c2, rr, &resp).ok());
    EXPECT_EQ(resp.ready(), ready) << model;
  }
}

// NAME/logprobs and logitd.v1's LogProbs on the same inputs: the same bits,
// with int32 and int64 targets, every option and every output.
TEST_F(OipTest, LogProbsBitwiseEqualToTheNativeCall) {
  constexpr std::int64_t kM = 7, kTopK = 5;
  const Tensor w = NormalBf16({kV, kK}, 61);
  const std::string handle = Register(w, "lp_head");
  const Tensor x = NormalBf16({kM, kK}, 62);
  const std::vector<std::int64_t> ids = {0, 89, 17, -100, 45, 3, 60};
  client::LogProbsOptions options;
  options.temperature = 0.7f;
  options.logit_softcap = 30.0f;
  options.top_k = kTopK;
  options.vocab_size = 90;
  options.want_entropy = options.want_lse = options.want_rank = true;
  for (const DType dtype : {DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(Datatype(dtype));
    const Tensor targets = TargetsTensor(dtype, ids);
    absl::StatusOr<client::LogProbsResult> native = client().LogProbs(x, &targets, handle, options);
    ASSERT_TRUE(native.ok()) << native.status();
    ModelInferRequest req;
    req.set_model_name("lp_head/logprobs");
    AddRawInput(&req, "x", x);
    AddRawInput(&req, "targets", targets);
    Parameters& p = *req.mutable_parameters();
    p["temperature"].set_double_param(0.7);  // Triton's float parameters are doubles
    p["logit_softcap"].set_double_param(30.0);
    p["top_k"].set_int64_param(kTopK);
    p["vocab_size"].set_int64_param(90);
    p["want_entropy"].set_bool_param(true);
    p["want_lse"].set_bool_param(true);
    p["want_rank"].set_bool_param(true);
    ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.model_name(), "lp_head/logprobs");
    EXPECT_EQ(resp.outputs_size(), 6);
    EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "logprob", DType::kFp32), *native->logprob));
    EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "lse", DType::kFp32), *native->lse));
    EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "entropy", DType::kFp32), *native->entropy));
    EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "topk_ids", DType::kInt32), *native->topk_ids));
    EXPECT_TRUE(
        BitwiseEqual(RawOutput(resp, "topk_logprobs", DType::kFp32), *native->topk_logprobs));
    EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "rank", DType::kInt64), *native->rank));
  }
  // No targets: top-k and lse alone.
  client::LogProbsOptions no_targets;
  no_targets.top_k = 3;
  no_targets.want_lse = true;
  absl::StatusOr<client::LogProbsResult> native = client().LogProbs(x, nullptr, handle, no_targets);
  ASSERT_TRUE(native.ok()) << native.status();
  ModelInferRequest req;
  req.set_model_name("lp_head/logprobs");
  AddRawInput(&req, "x", x);
  (*req.mutable_parameters())["top_k"].set_int64_param(3);
  (*req.mutable_parameters())["want_lse"].set_bool_param(true);
  ModelInferResponse resp;
  grpc::Status s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outputs_size(), 3);
  EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "lse", DType::kFp32), *native->lse));
  EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "topk_ids", DType::kInt32), *native->topk_ids));
  EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "topk_logprobs", DType::kFp32), *native->topk_logprobs));
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

// Requested outputs are the ones returned, and ask for what they need; the
// tensors may lie in shared memory.
TEST_F(OipTest, LogProbsRequestedOutputsAndSharedMemory) {
  constexpr std::int64_t kM = 4;
  const Tensor x = NormalBf16({kM, kK}, 63);
  const Tensor targets = TargetsTensor(DType::kInt64, {5, 6, 7, 8});
  client::LogProbsOptions options;
  options.want_entropy = true;
  absl::StatusOr<client::LogProbsResult> native = client().LogProbs(x, &targets, *handle_, options);
  ASSERT_TRUE(native.ok()) << native.status();
  client::SharedRegion region = NewRegion("lp", 4096);
  std::memcpy(region.data() + 1000, targets.bytes(), targets.nbytes());
  ModelInferRequest req;
  req.set_model_name("lm_head/logprobs");
  AddRawInput(&req, "x", x);
  AddShmInput(&req, "targets", DType::kInt64, {kM}, "lp", 1000);
  AddOutput(&req, "entropy");  // asks for it without want_entropy
  AddOutput(&req, "logprob", "lp", kM * 4, 2000);
  ModelInferResponse resp;
  grpc::Status s = Infer(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 2);
  EXPECT_EQ(resp.outputs(0).name(), "logprob");
  EXPECT_TRUE(resp.raw_output_contents(0).empty());
  EXPECT_TRUE(BitwiseEqual(FromBytes(DType::kFp32, {kM}, region.data() + 2000), *native->logprob));
  EXPECT_TRUE(BitwiseEqual(RawOutput(resp, "entropy", DType::kFp32), *native->entropy));
  EXPECT_TRUE(UnregisterRegion("lp").ok());
}

TEST_F(OipTest, LogProbsBadRequestsAreInvalidArgument) {
  const Tensor x = IntBf16({3, kK}, 64);
  const Tensor targets = TargetsTensor(DType::kInt64, {1, 2, 3});
  const auto request = [&](bool with_targets) {
    ModelInferRequest req;
    req.set_model_name("lm_head/logprobs");
    AddRawInput(&req, "x", x);
    if (with_targets) AddRawInput(&req, "targets", targets);
    return req;
  };
  std::vector<std::pair<std::string, ModelInferRequest>> bad;
  for (const std::int64_t k : {-1, 65, 1000}) {
    bad.emplace_back(absl::StrCat("top_k ", k), request(true));
    (*bad.back().second.mutable_parameters())["top_k"].set_int64_param(k);
  }
  bad.emplace_back("top_k string", request(true));
  (*bad.back().second.mutable_parameters())["top_k"].set_string_param("many");
  bad.emplace_back("temperature 0", request(true));
  (*bad.back().second.mutable_parameters())["temperature"].set_double_param(0.0);
  bad.emplace_back("temperature tiny", request(true));
  (*bad.back().second.mutable_parameters())["temperature"].set_double_param(1e-60);
  bad.emplace_back("want_lse int", request(true));
  (*bad.back().second.mutable_parameters())["want_lse"].set_int64_param(7);
  bad.emplace_back("vocab_size", request(true));
  (*bad.back().second.mutable_parameters())["vocab_size"].set_int64_param(kV + 1);
  bad.emplace_back("target out of range", request(false));
  AddRawInput(&bad.back().second, "targets", TargetsTensor(DType::kInt64, {1, kV, 3}));
  bad.emplace_back("targets FP32", request(false));
  AddRawInput(&bad.back().second, "targets", Tensor(DType::kFp32, {3}));
  bad.emplace_back("targets [4]", request(false));
  AddRawInput(&bad.back().second, "targets", TargetsTensor(DType::kInt64, {1, 2, 3, 4}));
  bad.emplace_back("no outputs", request(false));
  bad.emplace_back("unknown output", request(true));
  AddOutput(&bad.back().second, "logits");
  bad.emplace_back("rank without targets", request(false));
  AddOutput(&bad.back().second, "rank");
  bad.emplace_back("topk_ids without top_k", request(true));
  AddOutput(&bad.back().second, "topk_ids");
  bad.emplace_back("unknown input", request(true));
  AddRawInput(&bad.back().second, "y", targets);
  for (const auto& [what, req] : bad) {
    ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << what << ": " << s.error_message();
  }
  ModelInferRequest good = request(true);
  (*good.mutable_parameters())["top_k"].set_int64_param(64);
  ModelInferResponse resp;
  grpc::Status s = Infer(good, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ModelInferRequest unknown = request(true);
  unknown.set_model_name("no_such_model/logprobs");
  EXPECT_EQ(Infer(unknown, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Without --allow_shm the extension's calls and shared-memory tensors are
// refused, naming the flag, and ServerMetadata lists no extension.
TEST(OipShmOffTest, SharedMemoryIsRefusedWithoutAllowShm) {
  absl::StatusOr<std::unique_ptr<SharedServer>> server = SharedServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = GRPCInferenceService::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  client::SharedRegion object = *client::SharedRegion::Create(4096);
  std::vector<std::pair<std::string, grpc::Status>> calls;
  {
    grpc::ClientContext context;
    inference::SystemSharedMemoryRegisterRequest req;
    req.set_name("r");
    req.set_key(object.name());
    req.set_byte_size(4096);
    inference::SystemSharedMemoryRegisterResponse resp;
    calls.emplace_back("register", stub->SystemSharedMemoryRegister(&context, req, &resp));
  }
  {
    grpc::ClientContext context;
    inference::SystemSharedMemoryStatusResponse resp;
    calls.emplace_back("status", stub->SystemSharedMemoryStatus(&context, {}, &resp));
  }
  {
    grpc::ClientContext context;
    inference::SystemSharedMemoryUnregisterResponse resp;
    calls.emplace_back("unregister", stub->SystemSharedMemoryUnregister(&context, {}, &resp));
  }
  const Tensor w = IntBf16({kV, kK}, 71);
  ASSERT_TRUE((*server)->client->RegisterWeight(w, "head").ok());
  {
    grpc::ClientContext context;
    ModelInferRequest req;
    req.set_model_name("head");
    AddShmInput(&req, "x", DType::kBf16, {1, kK}, "r", 0);
    ModelInferResponse resp;
    calls.emplace_back("infer", stub->ModelInfer(&context, req, &resp));
  }
  for (const auto& [what, s] : calls) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << what;
    EXPECT_THAT(s.error_message(), HasSubstr("--allow_shm")) << what;
  }
  grpc::ClientContext context;
  inference::ServerMetadataResponse meta;
  ASSERT_TRUE(stub->ServerMetadata(&context, {}, &meta).ok());
  EXPECT_EQ(meta.extensions_size(), 0);
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

// System shared-memory regions are per tenant, like weights: another tenant
// neither sees, uses nor unregisters them, and may use the same name.
TEST(OipTokenTest, SharedMemoryRegionsArePerTenant) {
  const std::string tokens = ::testing::TempDir() + "/oip_shm_test_tokens";
  {
    std::ofstream f(tokens);
    f << "tok-a team-a\ntok-b team-b\n";
  }
  client::ClientOptions as_a, as_b;
  as_a.auth_token = "tok-a";
  as_b.auth_token = "tok-b";
  absl::StatusOr<std::unique_ptr<SharedServer>> server =
      SharedServer::Start({"--auth_tokens=" + tokens, "--allow_shm"}, as_a);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<client::Client>> b = (*server)->NewClient(as_b);
  ASSERT_TRUE(b.ok()) << b.status();
  const Tensor w = IntBf16({kV, kK}, 81);
  ASSERT_TRUE((*server)->client->RegisterWeight(w, "head").ok());
  ASSERT_TRUE((*b)->RegisterWeight(w, "head").ok());
  auto stub = GRPCInferenceService::NewStub(
      grpc::CreateChannel((*server)->process.address(), grpc::InsecureChannelCredentials()));
  const auto as = [](const std::string& token, grpc::ClientContext* context) {
    context->AddMetadata("authorization", "Bearer " + token);
  };
  const auto register_region = [&](const std::string& token, const std::string& key) {
    grpc::ClientContext context;
    as(token, &context);
    inference::SystemSharedMemoryRegisterRequest req;
    req.set_name("r");
    req.set_key(key);
    req.set_byte_size(4096);
    inference::SystemSharedMemoryRegisterResponse resp;
    return stub->SystemSharedMemoryRegister(&context, req, &resp);
  };
  const auto regions = [&](const std::string& token) {
    grpc::ClientContext context;
    as(token, &context);
    inference::SystemSharedMemoryStatusResponse resp;
    grpc::Status s = stub->SystemSharedMemoryStatus(&context, {}, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.regions_size();
  };
  client::SharedRegion a_object = *client::SharedRegion::Create(4096);
  client::SharedRegion b_object = *client::SharedRegion::Create(4096);
  ASSERT_TRUE(register_region("tok-a", a_object.name()).ok());
  EXPECT_EQ(regions("tok-b"), 0);
  const Tensor x = IntBf16({2, kK}, 82);
  std::memcpy(a_object.data(), x.bytes(), x.nbytes());
  const auto infer = [&](const std::string& token, ModelInferResponse* resp) {
    grpc::ClientContext context;
    as(token, &context);
    ModelInferRequest req;
    req.set_model_name("head");
    AddShmInput(&req, "x", DType::kBf16, {2, kK}, "r", 0);
    return stub->ModelInfer(&context, req, resp);
  };
  ModelInferResponse resp;
  grpc::Status s = infer("tok-b", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  {
    grpc::ClientContext context;
    as("tok-b", &context);
    inference::SystemSharedMemoryUnregisterResponse unregistered;
    ASSERT_TRUE(stub->SystemSharedMemoryUnregister(&context, {}, &unregistered).ok());
  }
  EXPECT_EQ(regions("tok-a"), 1);
  s = infer("tok-a", &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(Fp32EqualsExact(RawOutput(resp, "logits", DType::kFp32), ExactNT(x, w), {2, kV}));
  // The same name for another tenant's region of its own.
  EXPECT_TRUE(register_region("tok-b", b_object.name()).ok());
  EXPECT_EQ(regions("tok-b"), 1);
  std::remove(tokens.c_str());
}

}  // namespace
}  // namespace logitd::testing
