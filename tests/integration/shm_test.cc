// The same-host shared-memory path against the real server (cpu backend):
// results through shared memory equal the streamed ones bitwise, and every
// refusal (flag off, bounds, names, sizes, tenants, released regions, input
// bytes that do not match their digest) has its status. Faults the client
// library never produces go through the generated stub directly. Run twice:
// the in_place. variant (LOGITD_TEST_SHM_IN_PLACE=1 in the environment) runs
// every test against a server that reads the inputs in place
// (--shm_in_place).
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "logitd/safetensors.h"
#include "logitd/shared_region.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/wire.h"
#include "tests/integration/integration_util.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kV = 96;
constexpr std::int64_t kK = 64;

client::ClientOptions WithToken(const std::string& token) {
  client::ClientOptions o;
  o.timeout = absl::Seconds(60);
  o.auth_token = token;
  return o;
}

// The server's mappings of shared-memory objects, from /proc.
bool ServerMaps(pid_t pid, const std::string& shm_name) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::stringstream text;
  text << maps.rdbuf();
  return absl::StrContains(text.str(), absl::StrCat("/dev/shm", shm_name));
}

class ShmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/logitd-shm-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      start_error_ = new absl::Status(absl::InternalError("mkdtemp"));
      return;
    }
    dir_ = new std::string(dir);
    tokens_ = new std::string(*dir_ + "/tokens");
    std::ofstream(*tokens_) << "tok-a team-a\ntok-b team-b\n";
    std::vector<std::string> flags = {"--allow_shm", "--shm_max_region_bytes=4194304",
                                      "--auth_tokens=" + *tokens_};
    // The same tests with inputs read where they lie (the in_place. variant).
    if (TestVariant("LOGITD_TEST_SHM_IN_PLACE") == "1") flags.push_back("--shm_in_place");
    absl::StatusOr<std::unique_ptr<SharedServer>> s =
        SharedServer::Start(flags, WithToken("tok-a"));
    if (!s.ok()) {
      start_error_ = new absl::Status(s.status());
      return;
    }
    server_ = std::move(*s).release();
    weight_ = new Tensor(NormalBf16({kV, kK}, 7));
    absl::StatusOr<client::WeightInfo> info = server_->client->RegisterWeight(*weight_, "w");
    if (!info.ok()) {
      start_error_ = new absl::Status(info.status());
      return;
    }
    handle_ = new std::string(info->handle);
  }
  static void TearDownTestSuite() {
    delete handle_;
    delete weight_;
    delete server_;
    if (tokens_ != nullptr) std::remove(tokens_->c_str());
    if (dir_ != nullptr) std::remove(dir_->c_str());
    delete tokens_;
    delete dir_;
  }
  void SetUp() override { ASSERT_EQ(start_error_, nullptr) << *start_error_; }
  void TearDown() override { EXPECT_TRUE(ServerAnswers(a())) << server_->process.Log(); }

  static client::Client& a() { return *server_->client; }
  static std::unique_ptr<client::Client> As(const std::string& token) {
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        client::Client::Create(server_->process.address(), WithToken(token));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static const std::string& handle() { return *handle_; }

  // A region of `bytes` registered by tenant a.
  struct Registered {
    client::SharedRegion region;
    std::string handle;
  };
  static Registered Register(std::uint64_t bytes) {
    Registered r;
    absl::StatusOr<client::SharedRegion> region = client::SharedRegion::Create(bytes);
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return r;
    r.region = *std::move(region);
    absl::StatusOr<std::string> h = a().RegisterShm(r.region);
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) r.handle = *h;
    return r;
  }

  // logitctl against the suite's server as tenant a; with `merge_stderr`
  // its stderr joins stdout, else it is left out of `out`.
  static LogitctlRun Logitctl(const std::vector<std::string>& args, bool merge_stderr = true) {
    std::vector<std::string> all = {"--server=" + server_->process.address(), "--token=tok-a"};
    all.insert(all.end(), args.begin(), args.end());
    LogitctlOptions options;
    options.merge_stderr = merge_stderr;
    return RunLogitctl(all, options);
  }

  // A raw Logits call with the given header and no chunks.
  static grpc::Status RawLogits(const v1::LogitsHeader& header, v1::LogitsResult* result) {
    auto channel =
        grpc::CreateChannel(server_->process.address(), grpc::InsecureChannelCredentials());
    auto stub = v1::Logitd::NewStub(channel);
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer tok-a");
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub->Logits(&context);
    v1::LogitsRequest request;
    *request.mutable_header() = header;
    stream->Write(request);
    stream->WritesDone();
    v1::LogitsResponse response;
    while (stream->Read(&response)) {
      if (response.has_result()) *result = response.result();
    }
    return stream->Finish();
  }

  static inline std::string* dir_ = nullptr;
  static inline std::string* tokens_ = nullptr;
  static inline SharedServer* server_ = nullptr;
  static inline absl::Status* start_error_ = nullptr;
  static inline Tensor* weight_ = nullptr;
  static inline std::string* handle_ = nullptr;
};

TEST_F(ShmTest, RoundTripEqualsStreamedBitwise) {
  const Tensor x = NormalBf16({13, kK}, 21);
  for (DType out : {DType::kFp32, DType::kBf16}) {
    SCOPED_TRACE(DTypeName(out));
    client::LogitsOptions options;
    options.out_dtype = out;
    options.alpha = 0.375f;
    absl::StatusOr<Tensor> streamed = a().Logits(x, handle(), options);
    ASSERT_TRUE(streamed.ok()) << streamed.status();

    // X at 8 (any offset will do for an input), Y after it at a multiple of 64.
    const std::uint64_t y_at = (8 + x.nbytes() + 63) / 64 * 64;
    Registered r = Register(y_at + streamed->nbytes() + 100);
    std::copy_n(x.bytes(), x.nbytes(), r.region.data() + 8);
    client::LogitsShmArgs args;
    args.x.slot = client::ShmSlot{r.handle, &r.region, 8};
    args.x.shape = x.shape();
    args.y.slot = client::ShmSlot{r.handle, &r.region, y_at};
    absl::StatusOr<client::LogitsShmResult> got = a().LogitsShm(args, handle(), options);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->y.has_value());
    EXPECT_EQ(got->y_shm->dtype, out);
    EXPECT_EQ(got->y_shm->shape, streamed->shape());
    EXPECT_EQ(got->y_shm->offset, y_at);
    EXPECT_EQ(got->y_shm->bytes, streamed->nbytes());
    EXPECT_EQ(got->y_shm->xxh3, streamed->Digest());
    EXPECT_TRUE(std::equal(streamed->bytes(), streamed->bytes() + streamed->nbytes(),
                           r.region.data() + y_at));

    // X's digest given with its slot (hashed as it was written): the same
    // Y, and the server still checks X against it.
    client::LogitsShmArgs known = args;
    known.x.slot->xxh3 = x.Digest();
    std::fill_n(r.region.data() + y_at, streamed->nbytes(), std::byte{0});
    absl::StatusOr<client::LogitsShmResult> with_digest = a().LogitsShm(known, handle(), options);
    ASSERT_TRUE(with_digest.ok()) << with_digest.status();
    EXPECT_EQ(with_digest->y_shm->xxh3, streamed->Digest());
    EXPECT_TRUE(std::equal(streamed->bytes(), streamed->bytes() + streamed->nbytes(),
                           r.region.data() + y_at));
    known.x.slot->xxh3 = x.Digest() ^ 1;
    absl::StatusOr<client::LogitsShmResult> wrong = a().LogitsShm(known, handle(), options);
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss) << wrong.status();
    EXPECT_THAT(wrong.status().message(), HasSubstr("read from shared memory"));

    // Only X in shared memory: Y streamed back.
    client::LogitsShmArgs x_only = args;
    x_only.y.slot.reset();
    absl::StatusOr<client::LogitsShmResult> y_streamed = a().LogitsShm(x_only, handle(), options);
    ASSERT_TRUE(y_streamed.ok()) << y_streamed.status();
    ASSERT_TRUE(y_streamed->y.has_value());
    EXPECT_TRUE(BitwiseEqual(*y_streamed->y, *streamed));

    // Only Y in shared memory: X streamed.
    std::fill_n(r.region.data() + y_at, streamed->nbytes(), std::byte{0});
    client::LogitsShmArgs y_only;
    y_only.x = x;
    y_only.y.slot = args.y.slot;
    absl::StatusOr<client::LogitsShmResult> x_streamed = a().LogitsShm(y_only, handle(), options);
    ASSERT_TRUE(x_streamed.ok()) << x_streamed.status();
    EXPECT_TRUE(std::equal(streamed->bytes(), streamed->bytes() + streamed->nbytes(),
                           r.region.data() + y_at));
    EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
  }
}

TEST_F(ShmTest, BackwardRoundTripEqualsStreamedBitwise) {
  const std::int64_t m = 11;
  const Tensor dy = NormalFp32({m, kV}, 31, 0.01f);
  const Tensor x = NormalBf16({m, kK}, 32);
  client::BackwardOptions options;
  options.dx_dtype = DType::kFp32;
  absl::StatusOr<client::BackwardResult> streamed = a().Backward(dy, x, handle(), options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  ASSERT_TRUE(streamed->dx.has_value() && streamed->dw.has_value());

  // dY, X, dX and dW one after the other, each at a multiple of 64.
  const auto up = [](std::uint64_t n) { return (n + 63) / 64 * 64; };
  const std::uint64_t x_at = up(dy.nbytes());
  const std::uint64_t dx_at = x_at + up(x.nbytes());
  const std::uint64_t dw_at = dx_at + up(streamed->dx->nbytes());
  Registered r = Register(dw_at + streamed->dw->nbytes());
  std::copy_n(dy.bytes(), dy.nbytes(), r.region.data());
  std::copy_n(x.bytes(), x.nbytes(), r.region.data() + x_at);
  client::BackwardShmArgs args;
  args.dy.slot = client::ShmSlot{r.handle, &r.region, 0};
  args.dy.dtype = DType::kFp32;
  args.dy.shape = dy.shape();
  args.x.slot = client::ShmSlot{r.handle, &r.region, x_at};
  args.x.shape = x.shape();
  args.dx.slot = client::ShmSlot{r.handle, &r.region, dx_at};
  args.dw.slot = client::ShmSlot{r.handle, &r.region, dw_at};
  absl::StatusOr<client::BackwardShmResult> got = a().BackwardShm(args, handle(), options);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->dx_shm.has_value() && got->dw_shm.has_value());
  EXPECT_FALSE(got->dx.has_value() || got->dw.has_value());
  EXPECT_EQ(got->dx_shm->xxh3, streamed->dx->Digest());
  EXPECT_EQ(got->dw_shm->xxh3, streamed->dw->Digest());
  EXPECT_TRUE(std::equal(streamed->dx->bytes(), streamed->dx->bytes() + streamed->dx->nbytes(),
                         r.region.data() + dx_at));
  EXPECT_TRUE(std::equal(streamed->dw->bytes(), streamed->dw->bytes() + streamed->dw->nbytes(),
                         r.region.data() + dw_at));

  // Inputs streamed, dW in shared memory, dX streamed back.
  client::BackwardShmArgs mixed;
  mixed.dy = dy;
  mixed.x = x;
  mixed.dw.slot = args.dw.slot;
  got = a().BackwardShm(mixed, handle(), options);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->dx.has_value());
  EXPECT_TRUE(BitwiseEqual(*got->dx, *streamed->dx));
  EXPECT_TRUE(got->dw_shm.has_value());

  // A slot for an output that is not returned.
  client::BackwardOptions no_dx = options;
  no_dx.want_dx = false;
  args.dw.slot.reset();
  got = a().BackwardShm(args, handle(), no_dx);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("dx_shm"));
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
}

TEST_F(ShmTest, CastRoundTripEqualsStreamedBitwise) {
  Tensor input(DType::kFp32, {5, 37});
  for (std::int64_t i = 0; i < input.numel(); ++i) {
    input.data<float>()[i] = 1.0f + static_cast<float>(i) * 0.001953125f + 1e-6f;
  }
  absl::StatusOr<Tensor> streamed = a().CastToBf16(input);
  ASSERT_TRUE(streamed.ok()) << streamed.status();

  // Input at 4, output at 1024 (a multiple of 2).
  Registered r = Register(1024 + streamed->nbytes());
  std::copy_n(input.bytes(), input.nbytes(), r.region.data() + 4);
  client::CastShmArgs args;
  args.input.slot = client::ShmSlot{r.handle, &r.region, 4};
  args.input.shape = input.shape();
  args.output.slot = client::ShmSlot{r.handle, &r.region, 1024};
  absl::StatusOr<client::CastShmResult> got = a().CastShm(args);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->output.has_value());
  ASSERT_TRUE(got->output_shm.has_value());
  EXPECT_EQ(got->output_shm->dtype, DType::kBf16);
  EXPECT_EQ(got->output_shm->shape, input.shape());
  EXPECT_EQ(got->output_shm->xxh3, streamed->Digest());
  EXPECT_TRUE(std::equal(streamed->bytes(), streamed->bytes() + streamed->nbytes(),
                         r.region.data() + 1024));

  // Input streamed, output in the region; and the other way round.
  std::fill_n(r.region.data() + 1024, streamed->nbytes(), std::byte{0});
  client::CastShmArgs out_only;
  out_only.input = input;
  out_only.output.slot = args.output.slot;
  ASSERT_TRUE(a().CastShm(out_only).ok());
  EXPECT_TRUE(std::equal(streamed->bytes(), streamed->bytes() + streamed->nbytes(),
                         r.region.data() + 1024));
  client::CastShmArgs in_only = args;
  in_only.output.slot.reset();
  absl::StatusOr<client::CastShmResult> back = a().CastShm(in_only);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->output.has_value());
  EXPECT_TRUE(BitwiseEqual(*back->output, *streamed));

  // An odd output offset is refused by the server, naming the slot.
  client::CastShmArgs odd = args;
  odd.output.slot->offset = 1025;
  absl::StatusOr<client::CastShmResult> refused = a().CastShm(odd);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("output"));
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
}

TEST_F(ShmTest, CrossEntropyRoundTripEqualsStreamedBitwise) {
  const std::int64_t m = 9;
  const Tensor x = NormalBf16({m, kK}, 31);
  Tensor targets(DType::kInt64, {m});
  for (std::int64_t i = 0; i < m; ++i) targets.data<std::int64_t>()[i] = (i * 37) % kV;
  targets.data<std::int64_t>()[3] = -100;  // ignored
  for (client::Reduction reduction : {client::Reduction::kNone, client::Reduction::kMean}) {
    SCOPED_TRACE(reduction == client::Reduction::kNone ? "none" : "mean");
    client::CrossEntropyOptions options;
    options.reduction = reduction;
    options.want_lse = true;
    options.want_dx = true;
    options.want_dw = true;
    absl::StatusOr<client::CrossEntropyResult> streamed =
        a().CrossEntropy(x, targets, handle(), options);
    ASSERT_TRUE(streamed.ok()) << streamed.status();

    // Inputs first, then every output at a multiple of 64.
    const auto up = [](std::uint64_t n) { return (n + 63) / 64 * 64; };
    const std::uint64_t x_at = 0;
    const std::uint64_t t_at = up(x_at + x.nbytes());
    const std::uint64_t loss_at = up(t_at + targets.nbytes());
    const std::uint64_t lse_at = up(loss_at + streamed->loss.nbytes());
    const std::uint64_t dx_at = up(lse_at + streamed->lse->nbytes());
    const std::uint64_t dw_at = up(dx_at + streamed->dx->nbytes());
    Registered r = Register(dw_at + streamed->dw->nbytes());
    std::copy_n(x.bytes(), x.nbytes(), r.region.data() + x_at);
    std::copy_n(targets.bytes(), targets.nbytes(), r.region.data() + t_at);
    client::CrossEntropyShmArgs args;
    args.x.slot = client::ShmSlot{r.handle, &r.region, x_at};
    args.x.shape = x.shape();
    args.targets.slot = client::ShmSlot{r.handle, &r.region, t_at};
    args.targets.dtype = DType::kInt64;
    args.targets.shape = targets.shape();
    args.loss.slot = client::ShmSlot{r.handle, &r.region, loss_at};
    args.lse.slot = client::ShmSlot{r.handle, &r.region, lse_at};
    args.dx.slot = client::ShmSlot{r.handle, &r.region, dx_at};
    args.dw.slot = client::ShmSlot{r.handle, &r.region, dw_at};
    absl::StatusOr<client::CrossEntropyShmResult> got =
        a().CrossEntropyShm(args, handle(), options);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->counted_tokens, streamed->counted_tokens);
    EXPECT_FALSE(got->loss || got->lse || got->dx || got->dw);
    const std::vector<std::pair<const Tensor*, const std::optional<client::ShmOutput>*>> pairs = {
        {&streamed->loss, &got->loss_shm},
        {&*streamed->lse, &got->lse_shm},
        {&*streamed->dx, &got->dx_shm},
        {&*streamed->dw, &got->dw_shm}};
    for (const auto& [want, out] : pairs) {
      ASSERT_TRUE(out->has_value());
      EXPECT_EQ((*out)->shape, want->shape());
      EXPECT_EQ((*out)->xxh3, want->Digest());
      EXPECT_TRUE(std::equal(want->bytes(), want->bytes() + want->nbytes(),
                             r.region.data() + (*out)->offset));
    }

    // Inputs in the region, outputs streamed back.
    client::CrossEntropyShmArgs inputs_only;
    inputs_only.x.slot = args.x.slot;
    inputs_only.x.shape = args.x.shape;
    inputs_only.targets = args.targets;
    absl::StatusOr<client::CrossEntropyShmResult> back =
        a().CrossEntropyShm(inputs_only, handle(), options);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE(back->loss && back->lse && back->dx && back->dw);
    EXPECT_TRUE(BitwiseEqual(*back->loss, streamed->loss));
    EXPECT_TRUE(BitwiseEqual(*back->dw, *streamed->dw));
    EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
  }
}

TEST_F(ShmTest, CrossEntropySlotForAnOutputNotAskedIsInvalidArgument) {
  const Tensor x = NormalBf16({4, kK}, 41);
  Tensor targets(DType::kInt64, {4});
  for (std::int64_t i = 0; i < 4; ++i) targets.data<std::int64_t>()[i] = i;
  Registered r = Register(1 << 16);
  client::CrossEntropyShmArgs args;
  args.x = x;
  args.targets = targets;
  args.dx.slot = client::ShmSlot{r.handle, &r.region, 0};
  absl::StatusOr<client::CrossEntropyShmResult> got = a().CrossEntropyShm(args, handle(), {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("dx_shm"));
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
}

TEST_F(ShmTest, SkipDigestWritesTheSameBytesWithoutHashingThem) {
  const Tensor x = NormalBf16({9, kK}, 41);
  absl::StatusOr<Tensor> streamed = a().Logits(x, handle());
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  const std::uint64_t y_at = (x.nbytes() + 63) / 64 * 64;
  Registered r = Register(y_at + streamed->nbytes());
  std::copy_n(x.bytes(), x.nbytes(), r.region.data());
  client::LogitsShmArgs args;
  args.x.slot = client::ShmSlot{r.handle, &r.region, 0};
  args.x.shape = x.shape();
  args.y.slot = client::ShmSlot{r.handle, &r.region, y_at};
  args.y.slot->skip_digest = true;
  absl::StatusOr<client::LogitsShmResult> got = a().LogitsShm(args, handle());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->y_shm->xxh3, 0u);  // not computed, on either side
  EXPECT_EQ(got->y_shm->bytes, streamed->nbytes());
  EXPECT_TRUE(std::equal(streamed->bytes(), streamed->bytes() + streamed->nbytes(),
                         r.region.data() + y_at));

  // On the wire: the spec carries xxh3 0 and the answer says the digest was skipped.
  v1::LogitsHeader header;
  header.set_weight_handle(handle());
  *header.mutable_x() = wire::MakeSpec("x", x);
  header.mutable_x_shm()->set_region(r.handle);
  header.mutable_x_shm()->set_bytes(x.nbytes());
  header.mutable_x_shm()->set_skip_digest(true);  // ignored on an input: X is still checked
  header.mutable_y_shm()->set_region(r.handle);
  header.mutable_y_shm()->set_offset(y_at);
  header.mutable_y_shm()->set_bytes(streamed->nbytes());
  header.mutable_y_shm()->set_skip_digest(true);
  v1::LogitsResult result;
  ASSERT_TRUE(RawLogits(header, &result).ok());
  EXPECT_EQ(result.y().xxh3(), 0u);
  EXPECT_TRUE(result.y_shm().skip_digest());
  header.mutable_x()->set_xxh3(header.x().xxh3() ^ 1);
  EXPECT_EQ(RawLogits(header, &result).error_code(), grpc::StatusCode::DATA_LOSS);

  // Backward: dX and dW in the region without digests, the same bytes as streamed.
  const Tensor dy = NormalFp32({9, kV}, 42, 0.01f);
  absl::StatusOr<client::BackwardResult> want = a().Backward(dy, x, handle());
  ASSERT_TRUE(want.ok()) << want.status();
  Registered g = Register(want->dx->nbytes() + 64 + want->dw->nbytes());
  client::BackwardShmArgs bargs;
  bargs.dy = dy;
  bargs.x = x;
  bargs.dx.slot = client::ShmSlot{g.handle, &g.region, 0, /*skip_digest=*/true};
  bargs.dw.slot = client::ShmSlot{g.handle, &g.region, (want->dx->nbytes() + 63) / 64 * 64, true};
  absl::StatusOr<client::BackwardShmResult> b = a().BackwardShm(bargs, handle());
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->dx_shm && b->dw_shm);
  EXPECT_EQ(b->dx_shm->xxh3, 0u);
  EXPECT_EQ(b->dw_shm->xxh3, 0u);
  EXPECT_TRUE(std::equal(want->dx->bytes(), want->dx->bytes() + want->dx->nbytes(),
                         g.region.data() + bargs.dx.slot->offset));
  EXPECT_TRUE(std::equal(want->dw->bytes(), want->dw->bytes() + want->dw->nbytes(),
                         g.region.data() + bargs.dw.slot->offset));
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
  EXPECT_TRUE(a().ReleaseShm(g.handle).ok());
}

TEST_F(ShmTest, RegionIsMappedUntilReleased) {
  Registered r = Register(4096);
  EXPECT_TRUE(ServerMaps(server_->process.pid(), r.region.name()));
  ASSERT_TRUE(a().ReleaseShm(r.handle).ok());
  EXPECT_FALSE(ServerMaps(server_->process.pid(), r.region.name()));
}

TEST_F(ShmTest, BoundsViolationsAreInvalidArgument) {
  const Tensor x = NormalBf16({4, kK}, 22);
  const std::uint64_t y_bytes = 4 * kV * 4;
  Registered r = Register(1024 + y_bytes);
  std::copy_n(x.bytes(), x.nbytes(), r.region.data());

  // Y does not fit after its offset: the server refuses, with the numbers.
  client::LogitsShmArgs args;
  args.x.slot = client::ShmSlot{r.handle, &r.region, 0};
  args.x.shape = x.shape();
  args.y.slot = client::ShmSlot{r.handle, &r.region, 1024 + 64};
  absl::StatusOr<client::LogitsShmResult> got = a().LogitsShm(args, handle());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(),
              HasSubstr(absl::StrCat("is less than the ", y_bytes, " bytes")));

  // Y's offset not a multiple of fp32's 4 bytes.
  args.y.slot = client::ShmSlot{r.handle, &r.region, 1022};
  got = a().LogitsShm(args, handle());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("not a multiple of 4"));

  // The client library checks its own slots before any call.
  args.y.slot = client::ShmSlot{r.handle, &r.region, 1024 + y_bytes + 1};
  EXPECT_EQ(a().LogitsShm(args, handle()).status().code(), absl::StatusCode::kInvalidArgument);

  // Raw refs past the region's end, and an offset that would overflow.
  v1::LogitsHeader h;
  h.set_weight_handle(handle());
  *h.mutable_x() = wire::MakeSpec("x", x);
  h.mutable_x_shm()->set_region(r.handle);
  h.mutable_x_shm()->set_offset(r.region.size() - 16);
  h.mutable_x_shm()->set_bytes(x.nbytes());
  v1::LogitsResult result;
  grpc::Status s = RawLogits(h, &result);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      s.error_message(),
      HasSubstr(absl::StrCat("shm offset ", r.region.size() - 16, " + bytes ", x.nbytes(),
                             " exceeds region '", r.handle, "' of ", r.region.size(), " bytes")));
  h.mutable_x_shm()->set_offset(std::numeric_limits<std::uint64_t>::max() - 8);
  s = RawLogits(h, &result);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("exceeds region"));
  // An input ref whose bytes are not X's size.
  h.mutable_x_shm()->set_offset(0);
  h.mutable_x_shm()->set_bytes(x.nbytes() - 2);
  s = RawLogits(h, &result);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("is not the ", x.nbytes(), " bytes")));
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
}

TEST_F(ShmTest, ScribbledInputIsDataLoss) {
  const Tensor x = NormalBf16({4, kK}, 23);
  Registered r = Register(x.nbytes() + 4 * kV * 4);
  std::copy_n(x.bytes(), x.nbytes(), r.region.data());
  v1::LogitsHeader h;
  h.set_weight_handle(handle());
  *h.mutable_x() = wire::MakeSpec("x", x);  // the spec of the bytes as they were
  h.mutable_x_shm()->set_region(r.handle);
  h.mutable_x_shm()->set_bytes(x.nbytes());
  h.mutable_y_shm()->set_region(r.handle);
  h.mutable_y_shm()->set_offset(x.nbytes());
  h.mutable_y_shm()->set_bytes(4 * kV * 4);
  r.region.data()[5] ^= std::byte{0x40};  // then the client scribbles
  v1::LogitsResult result;
  const grpc::Status s = RawLogits(h, &result);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(s.error_message(), HasSubstr("read from shared memory"));
  // Where the server read it: in place in the in_place. variant (so that
  // variant fails if its flag stops reaching the server), a copy otherwise.
  const bool in_place = TestVariant("LOGITD_TEST_SHM_IN_PLACE") == "1";
  EXPECT_EQ(absl::StrContains(s.error_message(), "in place (region offset"), in_place)
      << s.error_message();
  // Restored, the same header works and says where Y went.
  r.region.data()[5] ^= std::byte{0x40};
  // A tensor in shared memory has no chunks for its digest to follow.
  h.mutable_x()->set_xxh3(0);
  const grpc::Status no_digest = RawLogits(h, &result);
  EXPECT_EQ(no_digest.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_digest.error_message(), HasSubstr("x: TensorSpec.xxh3 is 0"));
  *h.mutable_x() = wire::MakeSpec("x", x);
  ASSERT_TRUE(RawLogits(h, &result).ok());
  EXPECT_EQ(result.y_shm().offset(), x.nbytes());
  EXPECT_EQ(result.y_shm().bytes(), 4u * kV * 4);
  EXPECT_EQ(result.y().xxh3(), Xxh3(r.region.data() + x.nbytes(), 4 * kV * 4));
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
}

TEST_F(ShmTest, UnknownAndOtherTenantsRegionsAreNotFound) {
  const Tensor x = NormalBf16({2, kK}, 24);
  Registered r = Register(64 + 2 * kV * 4);
  std::unique_ptr<client::Client> b = As("tok-b");
  ASSERT_NE(b, nullptr);
  // b's own weight, so that only the region is foreign.
  absl::StatusOr<client::WeightInfo> wb = b->RegisterWeight(*weight_, "b's head");
  ASSERT_TRUE(wb.ok()) << wb.status();

  client::LogitsShmArgs args;
  args.x = x;
  args.y.slot = client::ShmSlot{r.handle, &r.region, 0};
  absl::StatusOr<client::LogitsShmResult> got = b->LogitsShm(args, wb->handle);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("for tenant 'team-b'"));
  EXPECT_EQ(b->ReleaseShm(r.handle).code(), absl::StatusCode::kNotFound);
  // Still a's.
  ASSERT_TRUE(a().LogitsShm(args, handle()).ok());

  args.y.slot->handle = "shm-999999";
  got = a().LogitsShm(args, handle());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("'shm-999999' is not registered"));
  EXPECT_EQ(a().ReleaseShm("shm-999999").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(a().ReleaseShm(r.handle).ok());
  EXPECT_TRUE(b->ReleaseWeight(wb->handle).ok());
}

TEST_F(ShmTest, ReleasedRegionIsNotFound) {
  const Tensor x = NormalBf16({2, kK}, 25);
  Registered r = Register(2 * kV * 4);
  ASSERT_TRUE(a().ReleaseShm(r.handle).ok());
  client::LogitsShmArgs args;
  args.x = x;
  args.y.slot = client::ShmSlot{r.handle, &r.region, 0};
  EXPECT_EQ(a().LogitsShm(args, handle()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a().ReleaseShm(r.handle).code(), absl::StatusCode::kNotFound);
}

TEST_F(ShmTest, RegisterRefusesBadNamesSizesAndObjects) {
  absl::StatusOr<client::SharedRegion> region = client::SharedRegion::Create(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  for (const char* name : {"no-slash", "/a/b", "/..", "/x..y", "/", ""}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(a().RegisterShm(name, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<std::string> h = a().RegisterShm(region->name(), 8192);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), HasSubstr("registered as 8192 bytes, but the object has 4096"));
  EXPECT_EQ(a().RegisterShm(region->name(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a().RegisterShm("/logitd-test-does-not-exist", 4096).status().code(),
            absl::StatusCode::kNotFound);

  // Over --shm_max_region_bytes (4 MiB here).
  absl::StatusOr<client::SharedRegion> big = client::SharedRegion::Create(8u << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  h = a().RegisterShm(*big);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(h.status().message(), HasSubstr("--shm_max_region_bytes"));
}

TEST_F(ShmTest, LogitctlLogitsAndBenchWithShm) {
  const Tensor x = NormalBf16({9, kK}, 27);
  const std::string x_path = *dir_ + "/x.safetensors";
  const std::string y_path = *dir_ + "/y.safetensors";
  ASSERT_TRUE(WriteSafetensors(x_path, {{"x", &x}}).ok());
  absl::StatusOr<Tensor> streamed = a().Logits(x, handle());
  ASSERT_TRUE(streamed.ok()) << streamed.status();

  LogitctlRun r =
      Logitctl({"logits", "--shm", "--x=" + x_path, "--weight=" + handle(), "--out=" + y_path});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  absl::StatusOr<Tensor> y = ReadSafetensorsTensor(y_path, "logits");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(BitwiseEqual(*y, *streamed));
  std::remove(x_path.c_str());
  std::remove(y_path.c_str());

  r = Logitctl({"bench", "--rpc=logits", "--shm", "--m=8", "--k=64", "--v=96", "--requests=3",
                "--nobaseline", "--json"},
               /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"shm\": true"));
  EXPECT_THAT(r.out, HasSubstr("\"error_count\": 0"));

  r = Logitctl({"bench", "--rpc=logits", "--shm", "--shm_skip_digest", "--m=8", "--k=64", "--v=96",
                "--requests=3", "--nobaseline", "--json"},
               /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"shm_skip_digest\": true"));
  EXPECT_THAT(r.out, HasSubstr("\"error_count\": 0"));

  // LogProbs with X in the worker's region, its digest taken each call or
  // once when X was written.
  for (const char* once : {"--noshm_digest_once", "--shm_digest_once"}) {
    r = Logitctl({"bench", "--rpc=logprobs", "--shm", once, "--top_k=3", "--entropy", "--m=8",
                  "--k=64", "--v=96", "--requests=3", "--nobaseline", "--json"},
                 /*merge_stderr=*/false);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("\"shm\": true"));
    EXPECT_THAT(r.out, HasSubstr("\"error_count\": 0"));
  }
  EXPECT_THAT(r.out, HasSubstr("\"shm_digest_once\": true"));
  r = Logitctl(
      {"bench", "--rpc=logits", "--shm_digest_once", "--m=8", "--k=64", "--v=96", "--requests=1"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--shm_digest_once: only with --shm"));
  r = Logitctl({"bench", "--rpc=backward", "--shm", "--m=8", "--k=64", "--v=96", "--requests=1"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("only --rpc=logits and --rpc=logprobs"));
}

TEST_F(ShmTest, LogitctlCastAndCrossEntropyWithShmEqualStreamed) {
  const std::string in_path = *dir_ + "/cast_in.safetensors";
  const std::string out_path = *dir_ + "/cast_out.safetensors";
  Tensor in(DType::kFp32, {3, 33});
  for (std::int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = 0.1f * static_cast<float>(i);
  ASSERT_TRUE(WriteSafetensors(in_path, {{"v", &in}}).ok());
  absl::StatusOr<Tensor> cast = a().CastToBf16(in);
  ASSERT_TRUE(cast.ok()) << cast.status();
  LogitctlRun r = Logitctl({"cast", "--shm", "--in=" + in_path, "--out=" + out_path});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  absl::StatusOr<Tensor> got = ReadSafetensorsTensor(out_path, "v");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitwiseEqual(*got, *cast));

  const Tensor x = NormalBf16({7, kK}, 29);
  Tensor targets(DType::kInt32, {7});
  for (std::int32_t i = 0; i < 7; ++i) targets.data<std::int32_t>()[i] = (i * 13) % kV;
  const std::string x_path = *dir_ + "/ce_x.safetensors";
  const std::string t_path = *dir_ + "/ce_t.safetensors";
  ASSERT_TRUE(WriteSafetensors(x_path, {{"x", &x}}).ok());
  ASSERT_TRUE(WriteSafetensors(t_path, {{"targets", &targets}}).ok());
  client::CrossEntropyOptions options;
  options.reduction = client::Reduction::kNone;
  options.want_lse = options.want_dx = options.want_dw = true;
  absl::StatusOr<client::CrossEntropyResult> want = a().CrossEntropy(x, targets, handle(), options);
  ASSERT_TRUE(want.ok()) << want.status();
  r = Logitctl({"cross-entropy", "--shm", "--x=" + x_path, "--targets=" + t_path,
                "--weight=" + handle(), "--reduction=none", "--lse", "--dx", "--dw",
                "--out=" + out_path});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const auto& [name, tensor] :
       {std::make_pair("loss", &want->loss), std::make_pair("lse", &*want->lse),
        std::make_pair("dx", &*want->dx), std::make_pair("dw", &*want->dw)}) {
    absl::StatusOr<Tensor> t = ReadSafetensorsTensor(out_path, name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_TRUE(BitwiseEqual(*t, *tensor)) << name;
  }
  for (const std::string& p : {in_path, out_path, x_path, t_path}) std::remove(p.c_str());
}

TEST(ShmOffTest, EveryShmRequestIsFailedPreconditionWithoutTheFlag) {
  absl::StatusOr<std::unique_ptr<SharedServer>> s = SharedServer::Start({});
  ASSERT_TRUE(s.ok()) << s.status();
  client::Client& c = *(*s)->client;
  absl::StatusOr<client::SharedRegion> region = client::SharedRegion::Create(4096);
  ASSERT_TRUE(region.ok()) << region.status();

  absl::StatusOr<std::string> h = c.RegisterShm(*region);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(h.status().message(), HasSubstr("--allow_shm"));
  EXPECT_FALSE(ServerMaps((*s)->process.pid(), region->name()));
  EXPECT_EQ(c.ReleaseShm("shm-1").code(), absl::StatusCode::kFailedPrecondition);

  const Tensor w = NormalBf16({kV, kK}, 7);
  absl::StatusOr<client::WeightInfo> reg = c.RegisterWeight(w, "w");
  ASSERT_TRUE(reg.ok()) << reg.status();
  const Tensor x = NormalBf16({2, kK}, 26);
  client::LogitsShmArgs args;
  args.x = x;
  args.y.slot = client::ShmSlot{"shm-1", &*region, 0};
  absl::StatusOr<client::LogitsShmResult> got = c.LogitsShm(args, reg->handle);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("--allow_shm"));
  // The streamed path is unaffected.
  EXPECT_TRUE(c.Logits(x, reg->handle).ok());
}

}  // namespace
}  // namespace logitd::testing
