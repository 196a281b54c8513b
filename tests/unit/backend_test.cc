// Tests of the interface's own code and the backend factory: name parsing
// (backends and split-K), the argument checks every backend makes, what the
// entry points do around a backend's own methods (checks first, a lost
// device failing every call), and the choice --backend makes, with and
// without the cuda backend built in.
#include "server/kernels/backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "logitd/bf16.h"
#include "server/kernels/kernel_table.h"
#include "server/kernels/ops/cast.h"
#include "server/kernels/ops/cross_entropy.h"

namespace logitd::kernels {
namespace {

TEST(Backend, ParseBackendKindAcceptsTheThreeNames) {
  absl::StatusOr<BackendKind> k = ParseBackendKind("auto");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, BackendKind::kAuto);
  k = ParseBackendKind("cuda");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, BackendKind::kCuda);
  k = ParseBackendKind("CPU");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, BackendKind::kCpu);
}

TEST(Backend, ParseBackendKindUnknownIsInvalidArgument) {
  for (const char* name : {"gpu", "", "cpu ", "rocm"}) {
    absl::Status s = ParseBackendKind(name).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("auto, cuda or cpu"), absl::string_view::npos) << s;
  }
}

TEST(Backend, ParseSplitKAcceptsTheThreeNamesInAnyCase) {
  for (SplitK split_k : {SplitK::kOff, SplitK::kFp32, SplitK::kAny}) {
    const std::string name = SplitKName(split_k);
    absl::StatusOr<SplitK> parsed = ParseSplitK(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, split_k) << name;
  }
  EXPECT_STREQ(SplitKName(SplitK::kFp32), "fp32");
  absl::StatusOr<SplitK> upper = ParseSplitK("FP32");
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_EQ(*upper, SplitK::kFp32);
  EXPECT_EQ(BackendOptions{}.split_k, SplitK::kFp32);
}

TEST(Backend, ParseSplitKUnknownIsInvalidArgumentNamingTheChoices) {
  for (const char* name : {"sometimes", "", "fp16", "on"}) {
    absl::Status s = ParseSplitK(name).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("split_k: expected off, fp32 or any, got '"),
              absl::string_view::npos)
        << s;
  }
}

// A weight of no backend: the checks look at its shape only.
class ShapeOnlyWeight final : public Weight {
 public:
  ShapeOnlyWeight(std::int64_t v, std::int64_t k) : Weight(v, k) {}
  std::uint64_t weight_bytes() const override { return 0; }
  std::uint64_t gradient_bytes() const override { return 0; }
};

void ExpectInvalid(const absl::Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message << ": " << s;
  EXPECT_EQ(s.message(), message);
}

TEST(BackendChecks, LogitsArgs) {
  const ShapeOnlyWeight w(100, 8);
  const std::vector<Bf16Bits> x(32);
  std::vector<float> y(400);
  LogitsArgs good;
  good.weight = &w;
  good.x = x.data();
  good.m = 4;
  good.y = y.data();
  EXPECT_TRUE(CheckArgs(good).ok());
  LogitsArgs a = good;
  a.x = nullptr;
  ExpectInvalid(CheckArgs(a), "logits: x is null");
  a = good;
  a.weight = nullptr;
  ExpectInvalid(CheckArgs(a), "logits: weight is null");
  a = good;
  a.m = 0;
  ExpectInvalid(CheckArgs(a), "logits: expected m (rows of x) >= 1, got 0");
  a = good;
  a.out_dtype = DType::kInt32;
  ExpectInvalid(CheckArgs(a), "logits: expected out_dtype fp32 or bf16, got int32");
  a = good;
  a.m = std::int64_t{1} << 58;  // [m, 8] bf16 fits in int64; [m, 100] fp32 does not
  ExpectInvalid(CheckArgs(a),
                "logits: y fp32: shape [288230376151711744, 100]: element count overflows int64");
}

TEST(BackendChecks, BackwardArgs) {
  ShapeOnlyWeight w(100, 8);
  const std::vector<float> dy(400);
  const std::vector<Bf16Bits> x(32);
  std::vector<Bf16Bits> dx(32);
  BackwardArgs good;
  good.weight = &w;
  good.dy = dy.data();
  good.m = 4;
  good.dx = dx.data();
  // dX alone needs no x.
  EXPECT_TRUE(CheckArgs(good).ok());
  BackwardArgs a = good;
  a.accumulate_dw = true;
  ExpectInvalid(CheckArgs(a), "backward: x is null but dW was asked for");
  a.x = x.data();
  EXPECT_TRUE(CheckArgs(a).ok());
  a = good;
  a.dx = nullptr;
  ExpectInvalid(CheckArgs(a),
                "backward: nothing to compute: expected dx, dw or accumulate_dw, got none");
  a = good;
  a.dx_dtype = DType::kInt64;
  ExpectInvalid(CheckArgs(a), "backward: expected dx_dtype fp32 or bf16, got int64");
  // An unused output's dtype is not looked at.
  a = good;
  a.dw_dtype = DType::kInt32;
  EXPECT_TRUE(CheckArgs(a).ok());
}

TEST(BackendChecks, CrossEntropyArgs) {
  const ShapeOnlyWeight w(1000, 8);
  const std::vector<Bf16Bits> x(32);
  std::vector<std::int64_t> targets = {1, 2, -100, 999};
  std::vector<float> loss(4);
  ShapeOnlyWeight& mutable_w = const_cast<ShapeOnlyWeight&>(w);
  CrossEntropyArgs good;
  good.weight = &mutable_w;
  good.x = x.data();
  good.m = 4;
  good.targets = targets.data();
  good.loss = loss.data();
  EXPECT_TRUE(CheckArgs(good).ok());
  CrossEntropyArgs a = good;
  a.loss = nullptr;
  ExpectInvalid(CheckArgs(a), "cross entropy: loss is null");
  a = good;
  a.z_loss = -1e-4f;
  ExpectInvalid(CheckArgs(a), "cross entropy: expected z_loss finite and >= 0, got -0.0001");
  a = good;
  a.grad_scale = std::numeric_limits<float>::infinity();
  ExpectInvalid(CheckArgs(a), "cross entropy: expected grad_scale finite, got inf");
  targets[3] = 1000;
  ExpectInvalid(CheckArgs(good),
                "cross entropy: targets[3] = 1000: expected a token id in [0, 1000) or "
                "ignore_index -100");
}

TEST(BackendChecks, CastAndLoadWeightArgs) {
  EXPECT_TRUE(CheckArgs(CastArgs{nullptr, 0, nullptr}).ok());
  ExpectInvalid(CheckArgs(CastArgs{nullptr, -1, nullptr}), "cast to bf16: expected n >= 0, got -1");
  ExpectInvalid(CheckArgs(CastArgs{nullptr, 4, nullptr}), "cast to bf16: in or out is null");
  const std::vector<Bf16Bits> w(64);
  EXPECT_TRUE(CheckLoadWeightArgs(w.data(), 8, 8).ok());
  ExpectInvalid(CheckLoadWeightArgs(nullptr, 8, 8), "load weight: w is null");
  ExpectInvalid(CheckLoadWeightArgs(w.data(), 0, 8),
                "load weight: expected V and K >= 1, got [0, 8]");
}

TEST(BackendChecks, ForeignWeightNamesTheBackendAndTheShape) {
  ExpectInvalid(ForeignWeightError("logits", "cuda", ShapeOnlyWeight(4, 8)),
                "logits: expected a weight loaded by the cuda backend, got one [4, 8] from "
                "another backend");
}

// A backend whose Do* methods count their calls and fail as told: what the
// entry points do around them.
class RecordingBackend final : public Backend {
 public:
  BackendInfo Info() const override {
    BackendInfo info;
    info.backend = "recording";
    return info;
  }
  absl::Status Health() const override { return health_; }
  std::uint64_t DeviceBytesInUse() const override { return 0; }

  absl::Status health_;
  absl::Status fail_with_;
  // A failure with this message loses the device.
  std::string loses_device_;
  int calls_ = 0;
  std::vector<absl::Status> noted_;

 protected:
  absl::StatusOr<HostBuffer> DoAllocateHost(std::size_t) override {
    if (absl::Status s = Done(); !s.ok()) return s;
    return HostBuffer();
  }
  absl::StatusOr<std::shared_ptr<Weight>> DoLoadWeight(const Bf16Bits*, std::int64_t v,
                                                       std::int64_t k) override {
    if (absl::Status s = Done(); !s.ok()) return s;
    return std::make_shared<ShapeOnlyWeight>(v, k);
  }
  absl::StatusOr<std::uint64_t> DoFetchGradient(Weight&, float*, bool) override {
    if (absl::Status s = Done(); !s.ok()) return s;
    return 0;
  }
  absl::Status DoZeroGradient(Weight&) override { return Done(); }
  absl::Status DoKernel(const KernelOp&, const void*, Timing*) override { return Done(); }
  void NoteFailure(const absl::Status& failure) override {
    noted_.push_back(failure);
    if (failure.message() == loses_device_) health_ = absl::UnavailableError("device lost: test");
  }

 private:
  absl::Status Done() {
    ++calls_;
    return fail_with_;
  }
};

TEST(BackendEntryPoints, BadArgumentsNeverReachTheBackend) {
  RecordingBackend b;
  const ShapeOnlyWeight w(100, 8);
  LogitsArgs args;  // x is null
  args.m = 4;
  ExpectInvalid(b.Logits(w, args, nullptr), "logits: x is null");
  ExpectInvalid(b.Kernel(kernels::CastArgs{nullptr, 4, nullptr}, nullptr),
                "cast to bf16: in or out is null");
  ExpectInvalid(b.LoadWeight(nullptr, 8, 8).status(), "load weight: w is null");
  ShapeOnlyWeight mutable_w(100, 8);
  ExpectInvalid(b.FetchGradient(mutable_w, nullptr, false).status(), "fetch gradient: out is null");
  EXPECT_EQ(b.calls_, 0);
  EXPECT_TRUE(b.noted_.empty());

  const std::vector<Bf16Bits> x(32);
  std::vector<float> y(400);
  args.x = x.data();
  args.y = y.data();
  EXPECT_TRUE(b.Logits(w, args, nullptr).ok());
  EXPECT_EQ(b.calls_, 1);
}

TEST(BackendEntryPoints, ALostDeviceFailsEveryCallAtOnce) {
  RecordingBackend b;
  b.health_ = absl::UnavailableError("device lost: an earlier fault");
  const std::vector<Bf16Bits> w(64);
  const std::vector<float> in(4);
  std::vector<Bf16Bits> out(4);
  for (const absl::Status& s : {b.LoadWeight(w.data(), 8, 8).status(),
                                b.Kernel(kernels::CastArgs{in.data(), 4, out.data()}, nullptr)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_EQ(s.message(), "device lost: an earlier fault");
  }
  EXPECT_EQ(b.calls_, 0);
}

TEST(BackendEntryPoints, AFailureThatLosesTheDeviceReturnsTheLostStatus) {
  RecordingBackend b;
  const std::vector<float> in(4);
  std::vector<Bf16Bits> out(4);
  // An ordinary failure is returned as it is, and noted.
  b.fail_with_ = absl::ResourceExhaustedError("out of memory");
  absl::Status s = b.Kernel(kernels::CastArgs{in.data(), 4, out.data()}, nullptr);
  EXPECT_EQ(s, b.fail_with_);
  ASSERT_EQ(b.noted_.size(), 1u);
  EXPECT_EQ(b.noted_[0], b.fail_with_);
  // One that loses the device comes back as the device's lost status.
  b.fail_with_ = absl::InternalError("illegal address");
  b.loses_device_ = "illegal address";
  s = b.Kernel(kernels::CastArgs{in.data(), 4, out.data()}, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), "device lost: test");
  EXPECT_EQ(b.calls_, 2);
  // And the next call does not reach the backend.
  EXPECT_EQ(b.Kernel(kernels::CastArgs{in.data(), 4, out.data()}, nullptr).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(b.calls_, 2);
  // Calls with nothing to do succeed without a failure to note.
  b.health_ = absl::OkStatus();
  b.fail_with_ = absl::OkStatus();
  EXPECT_TRUE(b.AllocateHost(16).ok());
  EXPECT_EQ(b.noted_.size(), 2u);
}

// An operation Backend has no entry point for: its arguments, their check,
// and a backend that registers a kernel for it (kernel_table.h), as a new
// operation's files would.
struct ScaleArgs {
  static constexpr absl::string_view kName = "scale";
  const float* in = nullptr;
  std::int64_t n = 0;
  float factor = 1.0f;
  float* out = nullptr;
};

absl::Status CheckArgs(const ScaleArgs& args) {
  if (args.n > 0 && (args.in == nullptr || args.out == nullptr)) {
    return absl::InvalidArgumentError("scale: in or out is null");
  }
  return absl::OkStatus();
}

std::vector<KernelOutput> OutputsOf(const ScaleArgs& args) {
  return {{"output", DType::kFp32, reinterpret_cast<std::byte*>(args.out),
           static_cast<std::size_t>(args.n) * sizeof(float)}};
}

class TableBackend final : public Backend {
 public:
  BackendInfo Info() const override {
    BackendInfo info;
    info.backend = "table";
    return info;
  }
  std::uint64_t DeviceBytesInUse() const override { return 0; }
  int scaled = 0;

 protected:
  absl::StatusOr<HostBuffer> DoAllocateHost(std::size_t) override { return HostBuffer(); }
  absl::StatusOr<std::shared_ptr<Weight>> DoLoadWeight(const Bf16Bits*, std::int64_t v,
                                                       std::int64_t k) override {
    return std::make_shared<ShapeOnlyWeight>(v, k);
  }
  absl::StatusOr<std::uint64_t> DoFetchGradient(Weight&, float*, bool) override { return 0; }
  absl::Status DoZeroGradient(Weight&) override { return absl::OkStatus(); }
  absl::Status DoKernel(const KernelOp& op, const void* args, Timing* timing) override {
    return KernelTable<TableBackend>::Get().Run(*this, op, args, timing);
  }
};

}  // namespace

template <>
struct KernelOf<TableBackend, ScaleArgs> {
  static absl::Status Run(TableBackend& backend, const ScaleArgs& args, Timing* /*timing*/) {
    ++backend.scaled;
    for (std::int64_t i = 0; i < args.n; ++i) args.out[i] = args.in[i] * args.factor;
    return absl::OkStatus();
  }
};
LOGITD_KERNEL(TableBackend, ScaleArgs);

namespace {

TEST(BackendKernels, AnOperationBackendNeverNamesRunsThroughItsRegisteredKernel) {
  TableBackend b;
  const std::vector<float> in = {1.0f, -2.0f, 3.5f};
  std::vector<float> out(3, 0.0f);
  ASSERT_TRUE(b.Kernel(ScaleArgs{in.data(), 3, 2.0f, out.data()}, nullptr).ok());
  EXPECT_EQ(out, (std::vector<float>{2.0f, -4.0f, 7.0f}));
  EXPECT_EQ(b.scaled, 1);
  // The check beside the arguments runs first: the kernel never sees them.
  ExpectInvalid(b.Kernel(ScaleArgs{nullptr, 3, 2.0f, out.data()}, nullptr),
                "scale: in or out is null");
  EXPECT_EQ(b.scaled, 1);
  // The type-erased entry (what a backend in front of this one forwards)
  // finds the same kernel and reports the same outputs.
  const KernelOp& op = KernelOpOf<ScaleArgs>();
  const ScaleArgs args{in.data(), 3, -1.0f, out.data()};
  ASSERT_TRUE(b.RunKernel(op, &args, nullptr).ok());
  EXPECT_EQ(out[2], -3.5f);
  const std::vector<KernelOutput> outputs = op.outputs(&args);
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, "output");
  EXPECT_EQ(outputs[0].bytes, 3 * sizeof(float));
}

TEST(BackendKernels, AKernelTheBackendDoesNotHaveIsUnimplementedNamingTheOperation) {
  TableBackend b;
  const std::vector<float> in = {1.0f};
  std::vector<Bf16Bits> out(1);
  const absl::Status s = b.Kernel(CastArgs{in.data(), 1, out.data()}, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(), "table backend has no cast to bf16 kernel");
}

BackendOptions CpuOptions() {
  BackendOptions options;
  options.kind = BackendKind::kCpu;
  return options;
}

TEST(BackendKernels, TheCpuBackendRegistersTheCast) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend(CpuOptions());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const std::vector<float> in = {1.0f, BitsToFloat(0x3f808000u), BitsToFloat(0x3f818000u)};
  std::vector<Bf16Bits> out(3);
  ASSERT_TRUE((*cpu)->Kernel(CastArgs{in.data(), 3, out.data()}, nullptr).ok());
  EXPECT_EQ(out, (std::vector<Bf16Bits>{0x3f80, 0x3f80, 0x3f82}));
  // An operation only another backend registered is not the cpu backend's.
  std::vector<float> scaled(1);
  EXPECT_EQ((*cpu)->Kernel(ScaleArgs{in.data(), 1, 1.0f, scaled.data()}, nullptr).code(),
            absl::StatusCode::kUnimplemented);
}

TEST(Backend, CreateCpuGivesTheCpuBackend) {
  BackendOptions options;
  options.kind = BackendKind::kCpu;
  std::string why;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Info().backend, "cpu");
  EXPECT_NE(why.find("cpu"), std::string::npos) << why;
  // `why` is optional.
  EXPECT_TRUE(CreateBackend(options).ok());
}

#ifndef LOGITD_HAVE_CUDA
TEST(Backend, CreateCudaWithoutCudaBuildIsFailedPrecondition) {
  BackendOptions options;
  options.kind = BackendKind::kCuda;
  absl::Status s = CreateBackend(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("LOGITD_WITH_CUDA=OFF"), absl::string_view::npos) << s;
}

TEST(Backend, AutoWithoutCudaBuildFallsBackToCpuAndSaysWhy) {
  BackendOptions options;
  options.kind = BackendKind::kAuto;
  std::string why;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Info().backend, "cpu");
  EXPECT_NE(why.find("without the cuda backend"), std::string::npos) << why;
  EXPECT_NE(why.find("using cpu"), std::string::npos) << why;
}
#else
TEST(Backend, AutoPicksCudaOrExplainsTheFallback) {
  BackendOptions options;
  options.kind = BackendKind::kAuto;
  std::string why;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(options, &why);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string backend = (*b)->Info().backend;
  if (backend == "cuda") {
    EXPECT_NE(why.find("using cuda"), std::string::npos) << why;
  } else {
    EXPECT_EQ(backend, "cpu");
    EXPECT_NE(why.find("no CUDA device visible"), std::string::npos) << why;
    EXPECT_NE(why.find("using cpu"), std::string::npos) << why;
  }
}
#endif

}  // namespace
}  // namespace logitd::kernels
