// Logits, LogProbs and CrossEntropy in row blocks (their headers' pipeline)
// against the real server: the bits equal those of
// the same call run whole, at odd row counts and with chunks that split rows
// on both sides; what a client may accept when the call fails after the
// first chunks went out (nothing: no digest, and the call's status); and a
// call cancelled half way returns every byte.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
#include "tests/common/seeded_tensors.h"
#include "tests/common/targets.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/shared_weight_test.h"

namespace logitd::testing {
namespace {

// X rows of 400 bytes; Y rows of 384 (fp32) or 192 (bf16) bytes.
constexpr std::int64_t kV = 96;
constexpr std::int64_t kK = 200;
// The server's smallest chunk (64 KiB) and the client's 1,000-byte chunks
// both fall inside rows.
constexpr std::size_t kClientChunk = 1000;

class PipelineTest : public SharedWeightTest {
 protected:
  static void SetUpTestSuite() {
    client::ClientOptions options;
    options.chunk_bytes = kClientChunk;
    StartSharedServer({"--chunk_bytes=65536"}, options);
    if (server_ == nullptr) return;
    weight_ = new Tensor(NormalBf16({kV, kK}, 7));
    handle_ = new std::string(Register(*weight_, "w"));
    OpenStub();
  }

  struct Ran {
    Tensor y;
    client::Timing timing;
  };
  static absl::StatusOr<Ran> Run(const Tensor& x, bool pipeline, DType out, float alpha) {
    client::LogitsOptions options;
    options.pipeline = pipeline;
    options.out_dtype = out;
    options.alpha = alpha;
    Ran ran;
    absl::StatusOr<Tensor> y = client().Logits(x, *handle_, options, &ran.timing);
    if (!y.ok()) return y.status();
    ran.y = *std::move(y);
    return ran;
  }

  static v1::ServerInfo Info() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerInfo info;
    const grpc::Status st = stub_->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return info;
  }

  // A pipelined Logits request for `x` through the generated stub: the
  // header, then X in 1,000-byte chunks.
  // X's chunks travel under `name`, which the client chooses.
  static std::vector<v1::LogitsRequest> Messages(const Tensor& x, const std::string& name = "x") {
    std::vector<v1::LogitsRequest> m(1);
    v1::LogitsHeader* h = m[0].mutable_header();
    h->set_weight_handle(*handle_);
    *h->mutable_x() = wire::MakeSpec(name, x);
    h->set_pipeline(true);
    h->set_digest_last(true);
    const absl::Status s =
        wire::SendChunks(name, x.bytes(), x.nbytes(), kClientChunk, [&](v1::TensorChunk&& c) {
          m.emplace_back();
          *m.back().mutable_chunk() = std::move(c);
          return true;
        });
    EXPECT_TRUE(s.ok()) << s;
    return m;
  }

  // What came back for `messages`: the status, and how many result, chunk
  // and digest messages.
  struct Received {
    grpc::Status status;
    int results = 0;
    int chunks = 0;
    int digests = 0;
  };
  // With `last_after_a_chunk`, the last message is written only once a
  // chunk of Y has come back: the call's first blocks ran before it.
  static Received RunRaw(const std::vector<v1::LogitsRequest>& messages,
                         bool last_after_a_chunk = false) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub_->Logits(&ctx);
    Received got;
    std::mutex mu;
    std::condition_variable chunk_seen;
    bool seen = false;
    // Written while the response is read: the server answers as it receives.
    std::thread writer([&] {
      for (std::size_t i = 0; i < messages.size(); ++i) {
        if (last_after_a_chunk && i + 1 == messages.size()) {
          std::unique_lock<std::mutex> lock(mu);
          chunk_seen.wait(lock, [&] { return seen; });
        }
        if (!stream->Write(messages[i])) break;
      }
      stream->WritesDone();
    });
    v1::LogitsResponse response;
    while (stream->Read(&response)) {
      got.results += response.has_result() ? 1 : 0;
      got.chunks += response.has_chunk() ? 1 : 0;
      got.digests += response.has_digest() ? 1 : 0;
      if (response.has_chunk()) {
        std::lock_guard<std::mutex> lock(mu);
        seen = true;
        chunk_seen.notify_all();
      }
    }
    {
      // A call that ended before any chunk: let the writer finish.
      std::lock_guard<std::mutex> lock(mu);
      seen = true;
      chunk_seen.notify_all();
    }
    writer.join();
    got.status = stream->Finish();
    return got;
  }
};

TEST_F(PipelineTest, RowBlocksGiveTheBitsOfTheWholeCall) {
  // One row; one block; a block and one row; several blocks, the last one
  // taking the rest (777 = 256 + 256 + 265); many.
  for (const std::int64_t m : {1, 255, 256, 257, 777, 1029}) {
    const Tensor x = NormalBf16({m, kK}, static_cast<std::uint32_t>(100 + m));
    for (const DType out : {DType::kFp32, DType::kBf16}) {
      for (const float alpha : {1.0f, 0.3f}) {
        SCOPED_TRACE(::testing::Message()
                     << "M=" << m << " out=" << DTypeName(out) << " alpha=" << alpha);
        absl::StatusOr<Ran> whole = Run(x, false, out, alpha);
        absl::StatusOr<Ran> blocks = Run(x, true, out, alpha);
        ASSERT_TRUE(whole.ok()) << whole.status();
        ASSERT_TRUE(blocks.ok()) << blocks.status();
        ASSERT_EQ(blocks->y.nbytes(), whole->y.nbytes());
        EXPECT_EQ(blocks->y.Digest(), whole->y.Digest()) << "bits differ";
        // The trailer says the call ran in blocks, and of how many rows;
        // the whole call's says nothing of blocks.
        ASSERT_TRUE(blocks->timing.trailer.has_value());
        ASSERT_TRUE(blocks->timing.trailer->pipeline_rows.has_value());
        EXPECT_EQ(*blocks->timing.trailer->pipeline_rows, std::min<std::int64_t>(m, 256));
        EXPECT_GT(blocks->timing.compute_us + blocks->timing.receive_us, 0);
        ASSERT_TRUE(whole->timing.trailer.has_value());
        EXPECT_FALSE(whole->timing.trailer->pipeline_rows.has_value());
      }
    }
  }
}

TEST_F(PipelineTest, ALargeOutputHashedBesideTheSenderKeepsItsBitsAndDigest) {
  // Y of fp32 past wire::kHashAsideBytes is hashed on a thread beside the
  // sender; bf16 stays under it and is hashed in the sender's path. The
  // client checks either digest against the bytes it received.
  const std::int64_t m = static_cast<std::int64_t>(wire::kHashAsideBytes / (kV * 4)) + 155;
  ASSERT_GE(static_cast<std::uint64_t>(m * kV * 4), wire::kHashAsideBytes);
  ASSERT_LT(static_cast<std::uint64_t>(m * kV * 2), wire::kHashAsideBytes);
  const Tensor x = NormalBf16({m, kK}, 21);
  for (const DType out : {DType::kFp32, DType::kBf16}) {
    SCOPED_TRACE(DTypeName(out));
    absl::StatusOr<Ran> whole = Run(x, false, out, 1.0f);
    absl::StatusOr<Ran> blocks = Run(x, true, out, 1.0f);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    EXPECT_EQ(blocks->y.Digest(), whole->y.Digest()) << "bits differ";
  }
  // Damaged X: the hasher stops with the sender; DATA_LOSS, no digest.
  std::vector<v1::LogitsRequest> msgs = Messages(x);
  msgs[0].mutable_header()->mutable_x()->set_xxh3(x.Digest() ^ 1);
  const Received got = RunRaw(msgs, /*last_after_a_chunk=*/true);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DATA_LOSS) << got.status.error_message();
  EXPECT_EQ(got.digests, 0);
  // Intact: Y's digest follows its chunks.
  const Received fine = RunRaw(Messages(x));
  EXPECT_TRUE(fine.status.ok()) << fine.status.error_message();
  EXPECT_EQ(fine.digests, 1);
}

TEST_F(PipelineTest, ACallSpreadOverConnectionsGivesTheBitsOfOneCall) {
  // The weight says where a call may be cut: the cpu backend's 256 rows.
  absl::StatusOr<std::vector<client::WeightInfo>> listed = client().ListWeights();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].logits_block_rows_fp32, 256);
  EXPECT_EQ((*listed)[0].logits_block_rows_bf16, 256);

  // 1029 rows are 5 blocks: 2 connections take 768 + 261 rows, 3 take
  // 512 + 512 + 5, 8 take five parts.
  const Tensor x = NormalBf16({1029, kK}, 9);
  for (const DType out : {DType::kFp32, DType::kBf16}) {
    client::LogitsOptions options;
    options.out_dtype = out;
    options.alpha = 0.3f;
    absl::StatusOr<Tensor> one = client().Logits(x, *handle_, options);
    ASSERT_TRUE(one.ok()) << one.status();
    for (const int connections : {2, 3, 4, 8}) {
      for (const bool pipeline : {true, false}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(out) << " connections=" << connections
                                          << " pipeline=" << pipeline);
        options.connections = connections;
        options.pipeline = pipeline;
        client::Timing timing;
        absl::StatusOr<Tensor> spread = client().Logits(x, *handle_, options, &timing);
        ASSERT_TRUE(spread.ok()) << spread.status();
        EXPECT_EQ(spread->shape(), one->shape());
        EXPECT_EQ(spread->Digest(), one->Digest()) << "bits differ";
        EXPECT_TRUE(timing.trailer.has_value());
      }
    }
    // Into a caller's tensor of the right shape: its memory is used.
    options.connections = 3;
    Tensor y = *Tensor::Create(out, {1029, kV});
    const std::byte* memory = y.bytes();
    ASSERT_TRUE(client().LogitsInto(x, *handle_, &y, options).ok());
    EXPECT_EQ(y.bytes(), memory);
    EXPECT_EQ(y.Digest(), one->Digest());
  }
  // Fewer rows than a block: one call; an unknown handle: the server's
  // NOT_FOUND; a count out of range: INVALID_ARGUMENT.
  client::LogitsOptions options;
  options.connections = 4;
  const Tensor small = NormalBf16({100, kK}, 10);
  absl::StatusOr<Tensor> y = client().Logits(small, *handle_, options);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->dim(0), 100);
  EXPECT_EQ(client().Logits(x, "w-unknown", options).status().code(), absl::StatusCode::kNotFound);
  options.connections = 0;
  EXPECT_EQ(client().Logits(x, *handle_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.connections = 65;
  EXPECT_EQ(client().Logits(x, *handle_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PipelineTest, WellFormedRawCallEndsWithTheDigest) {
  // The baseline of the faults below: a result, Y's chunks, one digest.
  const Tensor x = NormalBf16({777, kK}, 1);
  const Received got = RunRaw(Messages(x));
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.results, 1);
  EXPECT_EQ(got.chunks, static_cast<int>((777 * kV * 4 + 65535) / 65536));
  EXPECT_EQ(got.digests, 1);
}

TEST_F(PipelineTest, XUnderANameOfTheClientsChoosing) {
  // Blocks wait for X's rows by the name its chunks carry.
  const Tensor x = NormalBf16({777, kK}, 5);
  const Received got = RunRaw(Messages(x, "activations"), /*last_after_a_chunk=*/true);
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.digests, 1);
}

TEST_F(PipelineTest, DamagedXIsDataLossAndNoDigestGoesOut) {
  const Tensor x = NormalBf16({777, kK}, 2);
  // The announced digest wrong: every row arrives and is computed, Y's
  // chunks go out, and the call ends DATA_LOSS without Y's digest.
  std::vector<v1::LogitsRequest> m = Messages(x);
  m[0].mutable_header()->mutable_x()->set_xxh3(x.Digest() ^ 1);
  Received got = RunRaw(m, /*last_after_a_chunk=*/true);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DATA_LOSS) << got.status.error_message();
  EXPECT_EQ(got.results, 1);
  EXPECT_GT(got.chunks, 0) << "Y's first blocks went out before X's digest was known";
  EXPECT_EQ(got.digests, 0);

  // A byte flipped in the last chunk.
  m = Messages(x);
  (*m.back().mutable_chunk()->mutable_data())[3] ^= 0x10;
  got = RunRaw(m);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DATA_LOSS) << got.status.error_message();
  EXPECT_EQ(got.digests, 0);

  // A chunk out of order half way: INVALID_ARGUMENT, no digest.
  m = Messages(x);
  m[m.size() / 2].mutable_chunk()->set_offset(m[m.size() / 2].chunk().offset() + 2);
  got = RunRaw(m);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << got.status.error_message();
  EXPECT_EQ(got.digests, 0);

  // The stream cut short: DATA_LOSS, no digest.
  m = Messages(x);
  m.resize(m.size() - 3);
  got = RunRaw(m);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DATA_LOSS) << got.status.error_message();
  EXPECT_EQ(got.digests, 0);
}

TEST_F(PipelineTest, TheClientRefusesAResultWithoutItsDigest) {
  // Through the client library: a damaged X is never a result.
  // (The client computes X's digest itself, so the damage is done to the
  // weight handle instead: an unknown handle is refused before any block.)
  const Tensor x = NormalBf16({300, kK}, 3);
  client::LogitsOptions options;
  options.pipeline = true;
  absl::StatusOr<Tensor> y = client().Logits(x, "w-not-registered", options);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kNotFound) << y.status();
}

TEST_F(PipelineTest, CancelledHalfWayReturnsEveryByte) {
  const v1::ServerInfo before = Info();
  const Tensor x = NormalBf16({2048, kK}, 4);
  const std::vector<v1::LogitsRequest> m = Messages(x);
  grpc::ClientContext ctx;
  auto stream = stub_->Logits(&ctx);
  // The header and half of X: the first blocks run, Y's first chunks go out.
  for (std::size_t i = 0; i < 1 + (m.size() - 1) / 2; ++i) ASSERT_TRUE(stream->Write(m[i]));
  v1::LogitsResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_TRUE(response.has_result());
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_TRUE(response.has_chunk());
  ctx.TryCancel();
  while (stream->Read(&response)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  v1::ServerInfo after;
  do {
    after = Info();
    if (after.requests_in_flight() == before.requests_in_flight() &&
        after.request_bytes_in_flight() == before.request_bytes_in_flight()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  } while (absl::Now() < until);
  EXPECT_EQ(after.requests_in_flight(), before.requests_in_flight());
  EXPECT_EQ(after.request_bytes_in_flight(), before.request_bytes_in_flight());
}

// Targets for M rows of the test's weight, every 11th ignored.
Tensor SomeTargets(std::int64_t m, DType dtype, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> token(0, kV - 1);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i)
    t[static_cast<std::size_t>(i)] = i % 11 == 5 ? -100 : token(rng);
  return TargetsTensor(dtype, t);
}

client::LogProbsOptions EveryLogProbsOutput(bool pipeline) {
  client::LogProbsOptions o;
  o.pipeline = pipeline;
  o.top_k = 5;
  o.want_entropy = true;
  o.want_lse = true;
  o.want_rank = true;
  o.temperature = 0.8f;
  return o;
}

// Every output of two LogProbs results is there in both, with the same bits.
void ExpectSameLogProbs(const client::LogProbsResult& whole, const client::LogProbsResult& other) {
  for (const auto& [name, a, b] :
       {std::make_tuple("logprob", &whole.logprob, &other.logprob),
        std::make_tuple("lse", &whole.lse, &other.lse),
        std::make_tuple("entropy", &whole.entropy, &other.entropy),
        std::make_tuple("topk_ids", &whole.topk_ids, &other.topk_ids),
        std::make_tuple("topk_logprobs", &whole.topk_logprobs, &other.topk_logprobs),
        std::make_tuple("rank", &whole.rank, &other.rank)}) {
    ASSERT_TRUE(a->has_value() && b->has_value()) << name;
    EXPECT_EQ((*a)->shape(), (*b)->shape()) << name;
    EXPECT_EQ((*a)->Digest(), (*b)->Digest()) << name << ": bits differ";
  }
}

TEST_F(PipelineTest, LogProbsInRowBlocksGiveTheBitsOfTheWholeCall) {
  for (const std::int64_t m : {1, 255, 257, 777, 1029}) {
    for (const DType dtype : {DType::kInt32, DType::kInt64}) {
      SCOPED_TRACE(::testing::Message() << "M=" << m << " targets " << DTypeName(dtype));
      const Tensor x = NormalBf16({m, kK}, static_cast<std::uint32_t>(300 + m));
      const Tensor targets = SomeTargets(m, dtype, static_cast<std::uint32_t>(m));
      absl::StatusOr<client::LogProbsResult> whole =
          client().LogProbs(x, &targets, *handle_, EveryLogProbsOutput(false));
      absl::StatusOr<client::LogProbsResult> blocks =
          client().LogProbs(x, &targets, *handle_, EveryLogProbsOutput(true));
      ASSERT_TRUE(whole.ok()) << whole.status();
      ASSERT_TRUE(blocks.ok()) << blocks.status();
      ExpectSameLogProbs(*whole, *blocks);
      ASSERT_TRUE(blocks->timing.trailer.has_value());
      ASSERT_TRUE(blocks->timing.trailer->pipeline_rows.has_value());
      EXPECT_EQ(*blocks->timing.trailer->pipeline_rows, std::min<std::int64_t>(m, 256));
      ASSERT_TRUE(whole->timing.trailer.has_value());
      EXPECT_FALSE(whole->timing.trailer->pipeline_rows.has_value());
    }
  }
}

// LogProbsOptions.connections: the call cut at the weight's
// logprobs_block_rows (the cpu backend's 256), each part on a connection of
// its own, every output the bits of one call; a bad target in a later part
// is the server's INVALID_ARGUMENT with the part's rows named.
TEST_F(PipelineTest, LogProbsSpreadOverConnectionsGivesTheBitsOfOneCall) {
  absl::StatusOr<std::vector<client::WeightInfo>> listed = client().ListWeights();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].logprobs_block_rows, 256);
  for (const std::int64_t m : {300, 1029}) {
    for (const DType dtype : {DType::kInt32, DType::kInt64}) {
      const Tensor x = NormalBf16({m, kK}, static_cast<std::uint32_t>(500 + m));
      const Tensor targets = SomeTargets(m, dtype, static_cast<std::uint32_t>(m + 1));
      absl::StatusOr<client::LogProbsResult> one =
          client().LogProbs(x, &targets, *handle_, EveryLogProbsOutput(true));
      ASSERT_TRUE(one.ok()) << one.status();
      for (const int connections : {2, 3, 8}) {
        for (const bool pipeline : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << "M=" << m << " targets " << DTypeName(dtype)
                       << " connections=" << connections << " pipeline=" << pipeline);
          client::LogProbsOptions options = EveryLogProbsOutput(pipeline);
          options.connections = connections;
          absl::StatusOr<client::LogProbsResult> spread =
              client().LogProbs(x, &targets, *handle_, options);
          ASSERT_TRUE(spread.ok()) << spread.status();
          ExpectSameLogProbs(*one, *spread);
          EXPECT_TRUE(spread->timing.trailer.has_value());
        }
      }
    }
  }
  // Without targets: lse, entropy and top-k alone.
  const Tensor x = NormalBf16({700, kK}, 13);
  client::LogProbsOptions options;
  options.want_lse = true;
  options.top_k = 2;
  absl::StatusOr<client::LogProbsResult> one = client().LogProbs(x, nullptr, *handle_, options);
  options.connections = 3;
  absl::StatusOr<client::LogProbsResult> spread = client().LogProbs(x, nullptr, *handle_, options);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(spread.ok()) << spread.status();
  EXPECT_FALSE(spread->logprob.has_value());
  EXPECT_FALSE(spread->rank.has_value());
  ASSERT_TRUE(spread->lse.has_value() && spread->topk_ids.has_value());
  EXPECT_EQ(spread->lse->Digest(), one->lse->Digest());
  EXPECT_EQ(spread->topk_ids->Digest(), one->topk_ids->Digest());
  EXPECT_EQ(spread->topk_logprobs->Digest(), one->topk_logprobs->Digest());

  // 777 rows are 4 blocks: 3 connections take 512 + 265 rows, row 700 in
  // the second part.
  std::vector<std::int64_t> t(777, 3);
  t[700] = kV;
  const Tensor bad = TargetsTensor(DType::kInt64, t);
  const Tensor x777 = NormalBf16({777, kK}, 14);
  client::LogProbsOptions every = EveryLogProbsOutput(true);
  every.connections = 3;
  absl::StatusOr<client::LogProbsResult> r = client().LogProbs(x777, &bad, *handle_, every);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("rows [512, 777) of 777"), std::string::npos) << r.status();
  every.connections = 65;
  EXPECT_EQ(client().LogProbs(x777, nullptr, *handle_, every).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PipelineTest, ASpreadCallsFailingPartCancelsTheOthers) {
  // Two parts of 390 blocks of 256 rows (40 MB of X each); the second has a
  // bad target in its first block, so it fails while the first still uploads.
  // The first is cancelled rather than run to its end (the server logs it
  // CANCELLED), and the call's status is the failing part's.
  const std::int64_t m = 2 * 390 * 256;
  std::vector<std::int64_t> t(static_cast<std::size_t>(m), 3);
  t[static_cast<std::size_t>(m / 2) + 5] = kV;
  const Tensor targets = TargetsTensor(DType::kInt32, t);
  const Tensor x = NormalBf16({m, kK}, 31);
  const auto cancelled_calls = [] {
    const std::string log = server_->process.Log();
    std::size_t n = 0;
    for (std::size_t at = log.find("rpc=LogProbs code=CANCELLED"); at != std::string::npos;
         at = log.find("rpc=LogProbs code=CANCELLED", at + 1)) {
      ++n;
    }
    return n;
  };
  const std::size_t before = cancelled_calls();
  client::LogProbsOptions options;
  options.pipeline = true;
  options.connections = 2;
  absl::StatusOr<client::LogProbsResult> r = client().LogProbs(x, &targets, *handle_, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("rows [99840, 199680) of 199680"), std::string::npos)
      << r.status();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (cancelled_calls() == before && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(cancelled_calls(), before + 1) << server_->process.Log();
}

TEST_F(PipelineTest, ACallThatFailsInAnEarlyBlockStopsReadingItsRequest) {
  // 100,000 rows of X (40 MB) and a bad target in the first block: the
  // status comes back without the server taking in the rest of X (it logs
  // the bytes it read).
  const std::int64_t m = 100000;
  std::vector<std::int64_t> t(static_cast<std::size_t>(m), 3);
  t[5] = kV;
  const Tensor targets = TargetsTensor(DType::kInt32, t);
  const Tensor x = NormalBf16({m, kK}, 32);
  const std::string key = "rpc=LogProbs code=INVALID_ARGUMENT in=";
  const auto logged = [&key] {
    const std::string log = server_->process.Log();
    std::size_t n = 0;
    for (std::size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) ++n;
    return n;
  };
  const std::size_t before = logged();
  client::LogProbsOptions options;
  options.pipeline = true;
  absl::StatusOr<client::LogProbsResult> r = client().LogProbs(x, &targets, *handle_, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("targets[5]"), std::string::npos) << r.status();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (logged() == before && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  const std::string log = server_->process.Log();
  const std::size_t at = log.rfind(key);
  ASSERT_EQ(logged(), before + 1) << log;
  const std::uint64_t read = std::stoull(log.substr(at + key.size(), 20));
  EXPECT_LT(read, x.nbytes() / 2) << "the server read " << read << " of the request's "
                                  << x.nbytes() + targets.nbytes() << " bytes";
}

TEST_F(PipelineTest, LogProbsTargetOutOfRangeInALaterBlock) {
  // Row 700 is in the third block: the first two have run when it is read.
  const std::int64_t m = 777;
  const Tensor x = NormalBf16({m, kK}, 11);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m), 3);
  t[700] = kV;
  const Tensor targets = TargetsTensor(DType::kInt32, t);
  for (const bool pipeline : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "pipeline=" << pipeline);
    absl::StatusOr<client::LogProbsResult> r =
        client().LogProbs(x, &targets, *handle_, EveryLogProbsOutput(pipeline));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("targets[700] = 96"), std::string::npos) << r.status();
  }
  // And the server goes on.
  t[700] = kV - 1;
  const Tensor fixed = TargetsTensor(DType::kInt32, t);
  EXPECT_TRUE(client().LogProbs(x, &fixed, *handle_, EveryLogProbsOutput(true)).ok());
}

TEST_F(PipelineTest, LogProbsTakesXBeforeTheTargetsToo) {
  // The client sends the targets first; a client that sends X first gets
  // the same call, its blocks waiting for the targets' rows.
  const std::int64_t m = 600;
  const Tensor x = NormalBf16({m, kK}, 12);
  const Tensor targets = SomeTargets(m, DType::kInt64, 12);
  absl::StatusOr<client::LogProbsResult> expected =
      client().LogProbs(x, &targets, *handle_, EveryLogProbsOutput(false));
  ASSERT_TRUE(expected.ok()) << expected.status();

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub_->LogProbs(&ctx);
  v1::LogProbsRequest head;
  v1::LogProbsHeader* h = head.mutable_header();
  h->set_weight_handle(*handle_);
  *h->mutable_x() = wire::MakeSpec("x", x);
  *h->mutable_targets() = wire::MakeSpec("targets", targets);
  h->set_want_lse(true);
  h->set_temperature(0.8f);  // EveryLogProbsOutput's
  h->set_pipeline(true);
  ASSERT_TRUE(stream->Write(head));
  for (const auto& [name, tensor] :
       {std::make_pair("x", &x), std::make_pair("targets", &targets)}) {
    const absl::Status s = wire::SendChunks(name, tensor->bytes(), tensor->nbytes(), kClientChunk,
                                            [&](v1::TensorChunk&& c) {
                                              v1::LogProbsRequest r;
                                              *r.mutable_chunk() = std::move(c);
                                              return stream->Write(r);
                                            });
    ASSERT_TRUE(s.ok()) << s;
  }
  stream->WritesDone();
  v1::LogProbsResponse response;
  std::vector<std::byte> lse;
  int digests = 0;
  while (stream->Read(&response)) {
    if (response.has_chunk() && response.chunk().name() == "lse") {
      const std::string& d = response.chunk().data();
      ASSERT_EQ(response.chunk().offset(), lse.size());
      lse.insert(lse.end(), reinterpret_cast<const std::byte*>(d.data()),
                 reinterpret_cast<const std::byte*>(d.data()) + d.size());
    }
    digests += response.has_digest() ? 1 : 0;
  }
  const grpc::Status st = stream->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(digests, 2);  // logprob and lse
  ASSERT_EQ(lse.size(), expected->lse->nbytes());
  EXPECT_EQ(std::memcmp(lse.data(), expected->lse->bytes(), lse.size()), 0);
}

TEST_F(PipelineTest, CrossEntropyInRowBlocksGivesTheBitsOfTheWholeCall) {
  for (const std::int64_t m : {1, 257, 777}) {
    for (const client::Reduction reduction :
         {client::Reduction::kNone, client::Reduction::kMean, client::Reduction::kSum}) {
      for (const DType dx_dtype : {DType::kFp32, DType::kBf16}) {
        SCOPED_TRACE(::testing::Message()
                     << "M=" << m << " reduction " << static_cast<int>(reduction) << " dX "
                     << DTypeName(dx_dtype));
        const Tensor x = NormalBf16({m, kK}, static_cast<std::uint32_t>(500 + m));
        const Tensor targets = SomeTargets(m, DType::kInt32, static_cast<std::uint32_t>(m + 1));
        client::CrossEntropyOptions o;
        o.reduction = reduction;
        o.z_loss = 1e-3f;
        o.logit_softcap = 25.0f;
        o.grad_scale = 0.5f;
        o.want_lse = true;
        o.want_dx = true;
        o.dx_dtype = dx_dtype;
        o.pipeline = false;
        absl::StatusOr<client::CrossEntropyResult> whole =
            client().CrossEntropy(x, targets, *handle_, o);
        o.pipeline = true;
        absl::StatusOr<client::CrossEntropyResult> blocks =
            client().CrossEntropy(x, targets, *handle_, o);
        ASSERT_TRUE(whole.ok()) << whole.status();
        ASSERT_TRUE(blocks.ok()) << blocks.status();
        EXPECT_EQ(blocks->loss.shape(), whole->loss.shape());
        EXPECT_EQ(blocks->loss.Digest(), whole->loss.Digest()) << "loss bits differ";
        ASSERT_TRUE(blocks->lse && blocks->dx);
        EXPECT_EQ(blocks->lse->Digest(), whole->lse->Digest()) << "lse bits differ";
        EXPECT_EQ(blocks->dx->Digest(), whole->dx->Digest()) << "dX bits differ";
        EXPECT_EQ(blocks->counted_tokens, whole->counted_tokens);
        ASSERT_TRUE(blocks->timing.trailer.has_value());
        ASSERT_TRUE(blocks->timing.trailer->pipeline_rows.has_value());
        EXPECT_EQ(*blocks->timing.trailer->pipeline_rows, std::min<std::int64_t>(m, 256));
      }
    }
  }
  // With dW the call runs whole whatever it asks: dW sums over every row.
  const Tensor x = NormalBf16({300, kK}, 13);
  const Tensor targets = SomeTargets(300, DType::kInt64, 13);
  client::CrossEntropyOptions o;
  o.want_dx = true;
  o.want_dw = true;
  absl::StatusOr<client::CrossEntropyResult> with_dw =
      client().CrossEntropy(x, targets, *handle_, o);
  ASSERT_TRUE(with_dw.ok()) << with_dw.status();
  ASSERT_TRUE(with_dw->dw.has_value());
  ASSERT_TRUE(with_dw->timing.trailer.has_value());
  EXPECT_FALSE(with_dw->timing.trailer->pipeline_rows.has_value());
  o.want_dw = false;
  absl::StatusOr<client::CrossEntropyResult> without =
      client().CrossEntropy(x, targets, *handle_, o);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->dx->Digest(), with_dw->dx->Digest()) << "dX differs with dW asked";
}

// A reduced loss of a one-row call has the shape of a row output ([1] for
// M = 1): it goes out only once the last block's rows are reduced, never
// before. Repeated, since the sender races the reduction when it is wrong.
TEST_F(PipelineTest, AOneRowCallsReducedLossGoesOutReduced) {
  const Tensor x = NormalBf16({1, kK}, 77);
  const Tensor targets = SomeTargets(1, DType::kInt64, 78);
  for (const client::Reduction reduction : {client::Reduction::kMean, client::Reduction::kSum}) {
    client::CrossEntropyOptions o;
    o.reduction = reduction;
    o.grad_scale = 0.5f;
    o.want_dx = true;
    o.pipeline = false;
    absl::StatusOr<client::CrossEntropyResult> whole =
        client().CrossEntropy(x, targets, *handle_, o);
    ASSERT_TRUE(whole.ok()) << whole.status();
    o.pipeline = true;
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<client::CrossEntropyResult> blocks =
          client().CrossEntropy(x, targets, *handle_, o);
      ASSERT_TRUE(blocks.ok()) << blocks.status();
      ASSERT_EQ(blocks->loss.Digest(), whole->loss.Digest())
          << "reduction " << static_cast<int>(reduction) << ", call " << i;
    }
  }
}

TEST_F(PipelineTest, CrossEntropyTargetOutOfRangeEndsTheCallBeforeAnyBlock) {
  const std::int64_t m = 777;
  const Tensor x = NormalBf16({m, kK}, 14);
  std::vector<std::int64_t> t(static_cast<std::size_t>(m), 3);
  t[700] = -7;
  const Tensor targets = TargetsTensor(DType::kInt64, t);
  client::CrossEntropyOptions o;
  o.want_dx = true;
  for (const bool pipeline : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "pipeline=" << pipeline);
    o.pipeline = pipeline;
    absl::StatusOr<client::CrossEntropyResult> r = client().CrossEntropy(x, targets, *handle_, o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("targets[700] = -7"), std::string::npos) << r.status();
  }
  t[700] = 4;
  o.pipeline = true;
  EXPECT_TRUE(client().CrossEntropy(x, TargetsTensor(DType::kInt64, t), *handle_, o).ok());
}

}  // namespace
}  // namespace logitd::testing
