// Every class of bad input gets its exact status from the real server, and the
// server keeps answering afterwards. Wire-level faults (digests, truncation,
// offsets, missing headers) go through the generated stub directly, since the
// client library never produces them.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
#include "tests/common/stub_stream.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/shared_weight_test.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kV = 64;
constexpr std::int64_t kK = 128;

class BadInputTest : public SharedWeightTest {
 public:
  // For the raw-stream helpers below.
  static v1::Logitd::Stub& StubForTest() { return *stub_; }

 protected:
  static void SetUpTestSuite() {
    StartSharedServer({});
    if (server_ == nullptr) return;
    weight_ = new Tensor(IntBf16({kV, kK}, 9));
    absl::StatusOr<client::WeightInfo> info = server_->client->RegisterWeight(*weight_, "w");
    if (!info.ok()) {
      start_error_ = new absl::Status(info.status());
      return;
    }
    handle_ = new std::string(info->handle);
    OpenStub();
  }
  void SetUp() override { ASSERT_EQ(start_error_, nullptr) << *start_error_; }
  // The point of every test here: a refused call leaves a working server.
  void TearDown() override {
    ASSERT_TRUE(ServerAnswers(client())) << server_->process.Log();
    const Tensor x = IntBf16({3, kK}, 1);
    absl::StatusOr<Tensor> y = client().Logits(x, handle());
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(Fp32EqualsExact(*y, ExactNT(x, *weight_), {3, kV}));
  }

  static const std::string& handle() { return *handle_; }
  static v1::Logitd::Stub& stub() { return *stub_; }
};

// --- through the client --------------------------------------------------------

TEST_F(BadInputTest, UnknownHandleIsNotFound) {
  const std::string missing = "no-such-handle";
  EXPECT_EQ(client().Logits(IntBf16({2, kK}, 2), missing).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client().Backward(IntBf16({2, kV}, 3), IntBf16({2, kK}, 4), missing).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client().ReleaseWeight(missing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().FetchGradient(missing, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().ZeroGradient(missing).code(), absl::StatusCode::kNotFound);
  // An empty handle is a missing field rather than an unknown handle.
  EXPECT_EQ(client().Logits(IntBf16({2, kK}, 2), "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, KMismatchIsInvalidArgument) {
  absl::Status s = client().Logits(IntBf16({4, kK - 1}, 5), handle()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The message names what was expected and what came.
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(kK)));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat(kK - 1)));
}

TEST_F(BadInputTest, Fp32ActivationsAreInvalidArgument) {
  absl::Status s = client().Logits(IntFp32({4, kK}, 6), handle()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_F(BadInputTest, WrongRankIsInvalidArgument) {
  EXPECT_EQ(client().Logits(IntBf16({2, 2, kK}, 7), handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().Logits(IntBf16({kK}, 7), handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, ZeroDimensionIsInvalidArgument) {
  EXPECT_EQ(client().Logits(Tensor(DType::kBf16, {0, kK}), handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().RegisterWeight(Tensor(DType::kBf16, {0, kK}), "empty").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().CastToBf16(Tensor(DType::kFp32, {3, 0})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, BadOutDtypeIsInvalidArgument) {
  for (DType bad : {DType::kInt32, DType::kInt64}) {
    client::LogitsOptions options;
    options.out_dtype = bad;
    EXPECT_EQ(client().Logits(IntBf16({2, kK}, 8), handle(), options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << DTypeName(bad);
  }
}

TEST_F(BadInputTest, AccumulateWithBf16DwIsInvalidArgument) {
  client::BackwardOptions options;
  options.accumulate_dw = true;
  options.dw_dtype = DType::kBf16;
  EXPECT_EQ(client()
                .Backward(IntBf16({2, kV}, 10), IntBf16({2, kK}, 11), handle(), options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, NeitherDxNorDwIsInvalidArgument) {
  client::BackwardOptions options;
  options.want_dx = false;
  options.want_dw = false;
  EXPECT_EQ(client()
                .Backward(IntBf16({2, kV}, 12), IntBf16({2, kK}, 13), handle(), options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, BackwardShapeAndDtypeErrorsAreInvalidArgument) {
  const Tensor x = IntBf16({4, kK}, 14);
  // dY's V differs from the weight's.
  EXPECT_EQ(client().Backward(IntBf16({4, kV + 1}, 15), x, handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // dY and X disagree on M.
  EXPECT_EQ(client().Backward(IntBf16({5, kV}, 16), x, handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // X's K differs from the weight's.
  EXPECT_EQ(
      client().Backward(IntBf16({4, kV}, 17), IntBf16({4, kK + 1}, 18), handle()).status().code(),
      absl::StatusCode::kInvalidArgument);
  // fp32 X.
  EXPECT_EQ(client().Backward(IntBf16({4, kV}, 19), IntFp32({4, kK}, 20), handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Integer dY.
  Tensor int_dy(DType::kInt32, {4, kV});
  EXPECT_EQ(client().Backward(int_dy, x, handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // dX dtype that is neither bf16 nor fp32.
  client::BackwardOptions options;
  options.dx_dtype = DType::kInt32;
  EXPECT_EQ(client().Backward(IntBf16({4, kV}, 21), x, handle(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, BadWeightsAreInvalidArgument) {
  EXPECT_EQ(client().RegisterWeight(IntFp32({8, 8}, 22), "fp32").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().RegisterWeight(IntBf16({64}, 23), "rank1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client().RegisterWeight(IntBf16({2, 4, 8}, 24), "rank3").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, CastOfBf16IsInvalidArgument) {
  EXPECT_EQ(client().CastToBf16(IntBf16({4, 4}, 25)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, ClientRefusesWhatTheWireCannotCarry) {
  // An empty (default-constructed) tensor and alpha = 0, which proto3 would
  // deliver as "unset", i.e. 1.
  EXPECT_EQ(client().Logits(Tensor(), handle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  client::LogitsOptions zero_alpha;
  zero_alpha.alpha = 0.0f;
  EXPECT_EQ(client().Logits(IntBf16({2, kK}, 26), handle(), zero_alpha).status().code(),
            absl::StatusCode::kInvalidArgument);
  client::ClientOptions no_chunks;
  no_chunks.chunk_bytes = 0;
  EXPECT_EQ(client::Client::Create(server_->process.address(), no_chunks).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client::Client::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, UnreachableServerIsUnavailable) {
  client::ClientOptions options;
  options.timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<client::Client>> c =
      client::Client::Create(absl::StrCat("127.0.0.1:", UnusedPort()), options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->Info().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*c)->Logits(IntBf16({2, kK}, 27), handle()).status().code(),
            absl::StatusCode::kUnavailable);
}

// --- wire level, through the generated stub -------------------------------------

std::unique_ptr<grpc::ClientContext> Context() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return c;
}

std::vector<v1::TensorChunk> Chunks(const std::string& name, const Tensor& t, std::size_t size) {
  std::vector<v1::TensorChunk> out;
  absl::Status s = wire::SendChunks(name, t.bytes(), t.nbytes(), size, [&](v1::TensorChunk&& c) {
    out.push_back(std::move(c));
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

template <typename Request>
Request ChunkMessage(v1::TensorChunk chunk) {
  Request r;
  *r.mutable_chunk() = std::move(chunk);
  return r;
}

// Writes `messages` on a bidirectional stream, half-closes, drains the
// responses and returns the call's status.
template <typename Response, typename Request, typename StreamFactory>
grpc::Status RunBidi(StreamFactory open, const std::vector<Request>& messages) {
  std::unique_ptr<grpc::ClientContext> context = Context();
  auto stream = open(context.get());
  return FinishAfterWriting<Response>(*stream, messages);
}

grpc::Status RunLogits(const std::vector<v1::LogitsRequest>& messages) {
  return RunBidi<v1::LogitsResponse>(
      [](grpc::ClientContext* c) { return BadInputTest::StubForTest().Logits(c); }, messages);
}

v1::LogitsRequest LogitsHeader(const std::string& handle, const v1::TensorSpec& x) {
  v1::LogitsRequest r;
  r.mutable_header()->set_weight_handle(handle);
  *r.mutable_header()->mutable_x() = x;
  return r;
}

// A well-formed Logits request for X [4, K], in 256-byte chunks (4 chunks).
std::vector<v1::LogitsRequest> GoodLogits(const std::string& handle, const Tensor& x) {
  std::vector<v1::LogitsRequest> m = {LogitsHeader(handle, wire::MakeSpec("x", x))};
  for (v1::TensorChunk& c : Chunks("x", x, 256)) m.push_back(ChunkMessage<v1::LogitsRequest>(c));
  return m;
}

TEST_F(BadInputTest, WellFormedRawRequestSucceeds) {
  // The baseline the faults below deviate from.
  const Tensor x = IntBf16({4, kK}, 30);
  EXPECT_TRUE(RunLogits(GoodLogits(handle(), x)).ok());
}

TEST_F(BadInputTest, DigestMismatchIsDataLoss) {
  const Tensor x = IntBf16({4, kK}, 31);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  m[0].mutable_header()->mutable_x()->set_xxh3(x.Digest() ^ 1);
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::DATA_LOSS);

  // Right digest, one flipped payload byte.
  m = GoodLogits(handle(), x);
  (*m[2].mutable_chunk()->mutable_data())[7] ^= 0x10;
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::DATA_LOSS);
}

TEST_F(BadInputTest, TruncatedStreamIsDataLoss) {
  const Tensor x = IntBf16({4, kK}, 32);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  m.pop_back();
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::DATA_LOSS);
  // Header only.
  m.resize(1);
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::DATA_LOSS);
}

TEST_F(BadInputTest, OutOfOrderChunkIsInvalidArgument) {
  const Tensor x = IntBf16({4, kK}, 33);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  std::swap(m[1], m[2]);  // offset 256 first
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  m = GoodLogits(handle(), x);
  m.insert(m.begin() + 2, m[1]);  // offset 0 twice
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  m = GoodLogits(handle(), x);
  m[2].mutable_chunk()->set_offset(300);  // a gap
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(BadInputTest, ChunkPastTheEndIsInvalidArgument) {
  const Tensor x = IntBf16({4, kK}, 34);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  v1::TensorChunk extra;
  extra.set_name("x");
  extra.set_offset(x.nbytes());
  extra.set_data("abcd");
  m.push_back(ChunkMessage<v1::LogitsRequest>(extra));
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(BadInputTest, MissingOrRepeatedHeaderIsInvalidArgument) {
  const Tensor x = IntBf16({4, kK}, 35);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  m.erase(m.begin());  // chunks without a header
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  EXPECT_EQ(RunLogits({}).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "empty stream";

  m = GoodLogits(handle(), x);
  m.insert(m.begin() + 1, m[0]);  // header twice
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(BadInputTest, ChunkOfAnUnannouncedTensorIsInvalidArgument) {
  const Tensor x = IntBf16({4, kK}, 36);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  m[1].mutable_chunk()->set_name("dy");
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(BadInputTest, OverflowingOrNegativeShapeIsInvalidArgument) {
  // Element count past INT64_MAX; byte count past INT64_MAX; a negative dim.
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{std::int64_t{1} << 62, kK},
        std::vector<std::int64_t>{std::int64_t{1} << 55, kK}, std::vector<std::int64_t>{-4, kK}}) {
    v1::TensorSpec spec;
    spec.set_name("x");
    spec.set_dtype(v1::DTYPE_BF16);
    for (std::int64_t d : shape) spec.add_shape(d);
    EXPECT_EQ(RunLogits({LogitsHeader(handle(), spec)}).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << ShapeString(shape);
  }
  // The same through weight registration.
  std::unique_ptr<grpc::ClientContext> context = Context();
  v1::WeightInfo info;
  auto writer = stub().RegisterWeight(context.get(), &info);
  v1::RegisterWeightRequest header;
  header.mutable_header()->set_name("huge");
  v1::TensorSpec* spec = header.mutable_header()->mutable_weight();
  spec->set_name("weight");
  spec->set_dtype(v1::DTYPE_BF16);
  spec->add_shape(std::int64_t{1} << 62);
  spec->add_shape(4);
  writer->Write(header);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(BadInputTest, UnspecifiedDtypeIsInvalidArgument) {
  const Tensor x = IntBf16({4, kK}, 37);
  std::vector<v1::LogitsRequest> m = GoodLogits(handle(), x);
  m[0].mutable_header()->mutable_x()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(RunLogits(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

grpc::Status RunRegister(const std::vector<v1::RegisterWeightRequest>& messages) {
  std::unique_ptr<grpc::ClientContext> context = Context();
  v1::WeightInfo info;
  auto writer = BadInputTest::StubForTest().RegisterWeight(context.get(), &info);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

std::vector<v1::RegisterWeightRequest> GoodRegister(const Tensor& w) {
  v1::RegisterWeightRequest header;
  header.mutable_header()->set_name("raw");
  *header.mutable_header()->mutable_weight() = wire::MakeSpec("weight", w);
  std::vector<v1::RegisterWeightRequest> m = {header};
  for (v1::TensorChunk& c : Chunks("weight", w, 1024)) {
    m.push_back(ChunkMessage<v1::RegisterWeightRequest>(c));
  }
  return m;
}

TEST_F(BadInputTest, RegisterWeightWireFaults) {
  const Tensor w = IntBf16({32, 64}, 38);  // 4 KiB: 4 chunks
  std::vector<v1::RegisterWeightRequest> m = GoodRegister(w);
  m[0].mutable_header()->mutable_weight()->set_xxh3(w.Digest() + 1);
  EXPECT_EQ(RunRegister(m).error_code(), grpc::StatusCode::DATA_LOSS) << "digest";

  m = GoodRegister(w);
  m.pop_back();
  EXPECT_EQ(RunRegister(m).error_code(), grpc::StatusCode::DATA_LOSS) << "truncated";

  m = GoodRegister(w);
  m.erase(m.begin());
  EXPECT_EQ(RunRegister(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "no header";

  m = GoodRegister(w);
  m[3].mutable_chunk()->set_offset(0);
  EXPECT_EQ(RunRegister(m).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "offset";

  // None of these registered anything.
  absl::StatusOr<std::vector<client::WeightInfo>> list = client().ListWeights();
  ASSERT_TRUE(list.ok()) << list.status();
  for (const client::WeightInfo& info : *list) {
    EXPECT_NE(info.xxh3, w.Digest()) << info.handle;
  }

  EXPECT_TRUE(RunRegister(GoodRegister(w)).ok());
}

TEST_F(BadInputTest, BackwardWireFaults) {
  const Tensor dy = IntBf16({4, kV}, 39);
  const Tensor x = IntBf16({4, kK}, 40);
  auto build = [&] {
    v1::BackwardRequest header;
    v1::BackwardHeader* h = header.mutable_header();
    h->set_weight_handle(handle());
    *h->mutable_dy() = wire::MakeSpec("dy", dy);
    *h->mutable_x() = wire::MakeSpec("x", x);
    h->set_want_dx(true);
    h->set_want_dw(true);
    std::vector<v1::BackwardRequest> m = {header};
    for (v1::TensorChunk& c : Chunks("dy", dy, 128))
      m.push_back(ChunkMessage<v1::BackwardRequest>(c));
    for (v1::TensorChunk& c : Chunks("x", x, 128))
      m.push_back(ChunkMessage<v1::BackwardRequest>(c));
    return m;
  };
  auto run = [](const std::vector<v1::BackwardRequest>& m) {
    return RunBidi<v1::BackwardResponse>(
        [](grpc::ClientContext* c) { return BadInputTest::StubForTest().Backward(c); }, m);
  };
  EXPECT_TRUE(run(build()).ok());

  std::vector<v1::BackwardRequest> m = build();
  m[0].mutable_header()->mutable_dy()->set_xxh3(dy.Digest() ^ 0x8000);
  EXPECT_EQ(run(m).error_code(), grpc::StatusCode::DATA_LOSS) << "dy digest";

  m = build();
  m.resize(1 + Chunks("dy", dy, 128).size());  // dY complete, X never sent
  EXPECT_EQ(run(m).error_code(), grpc::StatusCode::DATA_LOSS) << "x missing";
}

TEST_F(BadInputTest, CastDigestMismatchIsDataLoss) {
  const Tensor in = NormalFp32({16, 16}, 41);
  v1::CastRequest header;
  *header.mutable_header()->mutable_input() = wire::MakeSpec("input", in);
  header.mutable_header()->mutable_input()->set_xxh3(in.Digest() ^ 1);
  std::vector<v1::CastRequest> m = {header};
  for (v1::TensorChunk& c : Chunks("input", in, 512)) m.push_back(ChunkMessage<v1::CastRequest>(c));
  EXPECT_EQ(RunBidi<v1::CastResponse>(
                [](grpc::ClientContext* c) { return BadInputTest::StubForTest().Cast(c); }, m)
                .error_code(),
            grpc::StatusCode::DATA_LOSS);
}

// A streamed tensor announced with xxh3 0 sends its digest after its
// chunks (TensorDigest): taken when it follows and matches; DATA_LOSS when
// it never comes or does not match; INVALID_ARGUMENT for a digest of a
// tensor whose spec carried one, or of no tensor announced.
TEST_F(BadInputTest, ADigestAfterTheChunksIsCheckedAsOneInTheSpec) {
  const Tensor in = NormalFp32({16, 16}, 42);
  const std::uint64_t digest = in.Digest();
  // The header with the input's spec (its xxh3 as given), the chunks, then
  // the digest messages given.
  const auto run = [&](std::uint64_t spec_xxh3,
                       const std::vector<std::pair<std::string, std::uint64_t>>& digests) {
    v1::CastRequest header;
    *header.mutable_header()->mutable_input() = wire::MakeSpec("input", in);
    header.mutable_header()->mutable_input()->set_xxh3(spec_xxh3);
    std::vector<v1::CastRequest> m = {header};
    for (v1::TensorChunk& c : Chunks("input", in, 512)) {
      m.push_back(ChunkMessage<v1::CastRequest>(c));
    }
    for (const auto& [name, xxh3] : digests) {
      v1::CastRequest d;
      d.mutable_digest()->set_name(name);
      d.mutable_digest()->set_xxh3(xxh3);
      m.push_back(d);
    }
    return RunBidi<v1::CastResponse>(
        [](grpc::ClientContext* c) { return BadInputTest::StubForTest().Cast(c); }, m);
  };
  EXPECT_TRUE(run(0, {{"input", digest}}).ok());
  EXPECT_TRUE(run(digest, {}).ok());

  grpc::Status status = run(0, {});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("input: its spec carried xxh3 0 and no digest"));
  status = run(0, {{"input", digest ^ 1}});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("input: xxh3 digest of the received bytes"));
  status = run(digest, {{"input", digest}});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("TensorDigest for 'input'"));
  EXPECT_THAT(status.error_message(), HasSubstr("has its digest already"));
  status = run(0, {{"input", digest}, {"input", digest}});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = run(0, {{"other", digest}, {"input", digest}});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("no tensor 'other' was announced"));
}

}  // namespace
}  // namespace logitd::testing
