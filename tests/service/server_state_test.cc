// The service under conditions a test cannot easily make a real server
// reach: a lost device, a full admission queue, calls stuck in the backend
// past their deadline, a full set of call threads, and shared memory off or
// misused. Every refusal has its status code and message, and the server
// keeps serving (the fixture checks after every test that GetServerInfo
// answers and that no request memory is left held).
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "logitd/shared_region.h"
#include "server/service/call/operations.h"
#include "server/service/call/verify.h"
#include "server/service/transport/call_runner.h"
#include "tests/service/service_test.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kBlockWait = absl::Seconds(10);

// --- a lost device ------------------------------------------------------------------

TEST_F(ServiceTest, LostDeviceMakesDeviceCallsUnavailableWithTheCause) {
  const std::string handle = Register();
  fake().SetHealth(absl::UnavailableError("fake device lost: it fell off the bus"));
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  const Tensor dy = Ramp(DType::kFp32, {2, kV});
  const auto expect_unavailable = [](const absl::Status& s, const char* call) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << call << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("fake device lost: it fell off the bus"))
        << call;
  };
  expect_unavailable(client().Logits(x, handle).status(), "Logits");
  expect_unavailable(client().Backward(dy, x, handle).status(), "Backward");
  expect_unavailable(client().FetchGradient(handle, false).status(), "FetchGradient");
  expect_unavailable(client().ZeroGradient(handle), "ZeroGradient");
  expect_unavailable(client().CastToBf16(dy).status(), "Cast");
  expect_unavailable(client().CrossEntropy(x, Targets(2), handle, {}).status(), "CrossEntropy");
  expect_unavailable(client().RegisterWeight(Ramp(DType::kBf16, {8, kK}), "w2").status(),
                     "RegisterWeight");
  expect_unavailable(client().LoadWeight("w.safetensors", "w", "").status(), "LoadWeight");
  const Tensor targets = Targets(2);
  expect_unavailable(client().LogProbs(x, &targets, handle).status(), "LogProbs");
  client::VerifyArgs verify;
  verify.weight_handle = handle;
  verify.x = x;
  verify.candidates["y"] = Ramp(DType::kFp32, {2, kV});
  expect_unavailable(client().Verify(verify).status(), "Verify");
  for (FakeMethod m : {FakeMethod::kLogits, FakeMethod::kBackward, FakeMethod::kFetchGradient,
                       FakeMethod::kZeroGradient, FakeMethod::kCast, FakeMethod::kCrossEntropy}) {
    EXPECT_EQ(fake().calls(m), 0) << static_cast<int>(m);
  }
  EXPECT_EQ(fake().calls(FakeMethod::kLoadWeight), 1);  // the registration before the loss

  // The calls that need no device still answer.
  absl::StatusOr<client::ServerInfo> info = client().Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend, "fake");
  absl::StatusOr<std::vector<client::WeightInfo>> weights = client().ListWeights();
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->size(), 1u);
  EXPECT_TRUE(client().ReleaseWeight(handle).ok());
}

// Which calls a lost device refuses: every one but those that only read or
// forget the server's records, so that an operation added later is refused
// too unless it is named as needing no device.
TEST(NeedsDeviceTest, EveryCallButTheRecordKeepingOnesNeedsTheDevice) {
  const google::protobuf::ServiceDescriptor* v1 =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Logitd::service_full_name());
  ASSERT_NE(v1, nullptr);
  const std::set<std::string> no_device = {
      "GetServerInfo", "ListWeights",      "ReleaseWeight", "Probe",    "RegisterShm",
      "ReleaseShm",    "ListRuns",         "PromoteRun",    "SetRules", "ListRules",
      "DeleteProject", "RecordValidation", "ListProjects",  "ListCases"};
  for (int i = 0; i < v1->method_count(); ++i) {
    const std::string name = v1->method(i)->name();
    EXPECT_EQ(service::NeedsDevice(name), no_device.count(name) == 0) << name;
  }
  EXPECT_TRUE(service::NeedsDevice("Verify"));
  EXPECT_TRUE(service::NeedsDevice("oip.ModelInfer"));
  for (const char* oip :
       {"oip.ServerLive", "oip.ServerReady", "oip.ModelReady", "oip.ServerMetadata",
        "oip.ModelMetadata", "oip.SystemSharedMemoryRegister", "oip.SystemSharedMemoryStatus",
        "oip.SystemSharedMemoryUnregister"}) {
    EXPECT_FALSE(service::NeedsDevice(oip)) << oip;
  }
}

// The service's table of methods (operations.h) is the proto's: a row for
// every method of logitd.v1.Logitd and none besides, and each row's tensors
// the TensorSpec fields of its header (or request) and of its result (or
// response), so a method or a tensor added without its row fails here.
std::vector<std::string> TensorFields(const google::protobuf::Descriptor* message,
                                      const char* part) {
  const google::protobuf::FieldDescriptor* nested = message->FindFieldByName(part);
  if (nested != nullptr && nested->message_type() != nullptr) message = nested->message_type();
  std::vector<std::string> names;
  for (int i = 0; i < message->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = message->field(i);
    if (!f->is_repeated() && f->message_type() != nullptr &&
        f->message_type()->full_name() == "logitd.v1.TensorSpec") {
      names.push_back(f->name());
    }
  }
  return names;
}

std::vector<std::string> Strings(absl::Span<const absl::string_view> names) {
  return std::vector<std::string>(names.begin(), names.end());
}

TEST(OperationsTest, TheTableIsTheProtosMethodsAndTensors) {
  const google::protobuf::ServiceDescriptor* v1 =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Logitd::service_full_name());
  ASSERT_NE(v1, nullptr);
  ASSERT_EQ(service::Operations().size(), static_cast<std::size_t>(v1->method_count()));
  for (int i = 0; i < v1->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = v1->method(i);
    SCOPED_TRACE(m->name());
    const service::OperationInfo* op = service::FindOperation(m->name());
    ASSERT_NE(op, nullptr) << "no row in server/service/call/operations.cc, nor one registered "
                              "from an operation's file in call/";
    EXPECT_EQ(Strings(op->inputs), TensorFields(m->input_type(), "header"));
    EXPECT_EQ(Strings(op->outputs), TensorFields(m->output_type(), "result"));
  }
  // Verify's operations are the methods it names, each giving what Verify
  // accepts as candidates.
  for (const auto& [operation, method] :
       {std::pair{service::VerifyOperation::kLogits, "Logits"},
        std::pair{service::VerifyOperation::kBackward, "Backward"},
        std::pair{service::VerifyOperation::kCrossEntropy, "CrossEntropy"},
        std::pair{service::VerifyOperation::kLogProbs, "LogProbs"}}) {
    const service::OperationInfo* op = service::FindVerifiable(operation);
    ASSERT_NE(op, nullptr) << method;
    EXPECT_EQ(op->method, method);
    for (absl::string_view name : op->outputs) {
      EXPECT_TRUE(service::VerifyOutputOf(std::string(name)).has_value()) << name;
    }
  }
  EXPECT_EQ(service::FindVerifiable(service::VerifyOperation::kUnknown), nullptr);
}

// --- admission ----------------------------------------------------------------------

// One tensor call at a time, and a short wait for a slot.
class ServiceAdmissionTest : public ServiceTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.admission.max_concurrent_requests = 1;
    o.admission.max_wait = absl::Milliseconds(300);
    return o;
  }

  // Starts a Logits call of X [2, K] on a client of its own that stays in
  // the backend (blocked) until fake().Release(kLogits); *result receives
  // its outcome when the returned thread ends.
  std::thread StartBlockedLogits(const std::string& handle, absl::Status* result,
                                 client::ClientOptions options = {}) {
    fake().Block(FakeMethod::kLogits);
    std::shared_ptr<client::Client> c = server().NewClient(options).value();
    std::thread t([c, handle, result] {
      *result = c->Logits(Ramp(DType::kBf16, {2, kK}), handle).status();
    });
    EXPECT_TRUE(fake().WaitUntilBlocked(FakeMethod::kLogits, 1, kBlockWait));
    return t;
  }
};

// X [2, K] bf16 and Y [2, V] fp32: what a Logits call of M = 2 holds.
constexpr std::uint64_t kLogitsBytes = 2 * kK * 2 + 2 * kV * 4;

TEST_F(ServiceAdmissionTest, CallWaitingForABusySlotIsResourceExhaustedAfterTheWait) {
  const std::string handle = Register();
  absl::Status first;
  std::thread holder = StartBlockedLogits(handle, &first);
  EXPECT_EQ(state().admission().Stats().requests_in_flight, 1u);
  EXPECT_EQ(state().admission().Stats().bytes_in_flight, kLogitsBytes);

  const absl::Time t0 = absl::Now();
  const absl::Status second = client().CastToBf16(Ramp(DType::kFp32, {16})).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("request slot"));
  EXPECT_THAT(std::string(second.message()), HasSubstr("--max_concurrent_requests"));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(250));
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 0);

  fake().Release(FakeMethod::kLogits);
  holder.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(client().CastToBf16(Ramp(DType::kFp32, {16})).ok());
}

TEST_F(ServiceAdmissionTest, CallWhoseDeadlinePassesWhileWaitingIsDeadlineExceeded) {
  const std::string handle = Register();
  client::ClientOptions impatient;
  impatient.timeout = absl::Milliseconds(100);  // shorter than the server's wait
  absl::StatusOr<std::unique_ptr<client::Client>> c = server().NewClient(impatient);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status first;
  std::thread holder = StartBlockedLogits(handle, &first);

  const absl::Status second = (*c)->CastToBf16(Ramp(DType::kFp32, {16})).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kDeadlineExceeded) << second;
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 0);

  fake().Release(FakeMethod::kLogits);
  holder.join();
  EXPECT_TRUE(first.ok()) << first;
}

TEST_F(ServiceAdmissionTest, CallStuckInTheBackendPastItsDeadlineGivesItsMemoryBack) {
  const std::string handle = Register();
  client::ClientOptions impatient;
  impatient.timeout = absl::Seconds(1);
  absl::Status s;
  std::thread caller = StartBlockedLogits(handle, &s, impatient);
  caller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  // The handler is still in the backend, holding its memory, until released.
  EXPECT_EQ(state().admission().Stats().bytes_in_flight, kLogitsBytes);
  fake().Release(FakeMethod::kLogits);
  EXPECT_TRUE(NoRequestMemoryHeld(state()));
}

class ServiceRequestMemoryTest : public ServiceTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.admission.memory_bytes = 32 << 10;
    return o;
  }
};

TEST_F(ServiceRequestMemoryTest, CallLargerThanAllRequestMemoryIsResourceExhaustedAtOnce) {
  const std::string handle = Register();  // 16 KiB
  // X [128, K] bf16 32 KiB + Y [128, V] fp32 32 KiB: twice the budget.
  const absl::Time t0 = absl::Now();
  const absl::Status s = client().Logits(Ramp(DType::kBf16, {128, kK}), handle).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("--request_memory_bytes"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 0);
}

class ServiceCallThreadsTest : public ServiceTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.max_call_threads = 1;
    return o;
  }
};

TEST_F(ServiceCallThreadsTest, TensorCallBeyondTheCallThreadsIsResourceExhausted) {
  const std::string handle = Register();
  fake().Block(FakeMethod::kLogits);
  absl::Status first;
  absl::StatusOr<std::unique_ptr<client::Client>> c = server().NewClient();
  ASSERT_TRUE(c.ok()) << c.status();
  std::thread holder([&] { first = (*c)->Logits(Ramp(DType::kBf16, {2, kK}), handle).status(); });
  EXPECT_TRUE(fake().WaitUntilBlocked(FakeMethod::kLogits, 1, kBlockWait));

  const absl::Status second = client().CastToBf16(Ramp(DType::kFp32, {16})).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("as many calls as it has threads for (1)"));

  fake().Release(FakeMethod::kLogits);
  holder.join();
  EXPECT_TRUE(first.ok()) << first;
}

// --- shared memory ------------------------------------------------------------------

TEST_F(ServiceTest, SharedMemoryIsFailedPreconditionWithoutAllowShm) {
  const std::string handle = Register();
  absl::StatusOr<client::SharedRegion> region = client::SharedRegion::Create(1 << 16);
  ASSERT_TRUE(region.ok()) << region.status();

  absl::StatusOr<std::string> registered = client().RegisterShm(*region);
  EXPECT_EQ(registered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(registered.status().message()), HasSubstr("--allow_shm"));
  const absl::Status released = client().ReleaseShm("shm-1");
  EXPECT_EQ(released.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(released.message()), HasSubstr("--allow_shm"));

  // A slot in a tensor call, input or output, whatever region it names.
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  client::LogitsShmArgs logits;
  logits.x = x;
  logits.y.slot = client::ShmSlot{"shm-1", &*region, 0};
  absl::Status s = client().LogitsShm(logits, handle).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("--allow_shm"));
  const Tensor in = Ramp(DType::kFp32, {16});
  std::memcpy(region->data(), in.bytes(), in.nbytes());
  client::CastShmArgs cast;
  cast.input.slot = client::ShmSlot{"shm-1", &*region, 0};
  cast.input.shape = {16};
  s = client().CastShm(cast).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("--allow_shm"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 0);
  EXPECT_EQ(fake().calls(FakeMethod::kCast), 0);
  EXPECT_TRUE(client().Logits(x, handle).ok()) << "the streamed path is unaffected";
}

class ServiceShmTest : public ServiceTest {
 protected:
  service::ServiceOptions Options() override {
    service::ServiceOptions o;
    o.shm.allowed = true;
    return o;
  }
  void SetUp() override {
    ServiceTest::SetUp();
    handle_ = Register();
    absl::StatusOr<client::SharedRegion> region = client::SharedRegion::Create(1 << 16);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
    absl::StatusOr<std::string> registered = client().RegisterShm(region_);
    ASSERT_TRUE(registered.ok()) << registered.status();
    region_handle_ = *registered;
  }
  void TearDown() override {
    if (!region_handle_.empty()) {
      EXPECT_TRUE(client().ReleaseShm(region_handle_).ok());
    }
    ServiceTest::TearDown();
  }
  client::ShmSlot Slot(std::uint64_t offset = 0) {
    return client::ShmSlot{region_handle_, &region_, offset};
  }

  std::string handle_;
  client::SharedRegion region_;
  std::string region_handle_;
};

TEST_F(ServiceShmTest, OutputWrittenIntoTheRegionIsTheBackendsResult) {
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  client::LogitsShmArgs args;
  args.x = x;
  args.y.slot = Slot(0);
  absl::StatusOr<client::LogitsShmResult> got = client().LogitsShm(args, handle_);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->y_shm->bytes, 2u * kV * 4);
  const float* y = reinterpret_cast<const float*>(region_.data());
  for (std::int64_t i = 0; i < 2 * kV; ++i) ASSERT_EQ(y[i], static_cast<float>(i)) << i;
}

TEST_F(ServiceShmTest, SlotForAnOutputNotAskedForIsInvalidArgument) {
  const Tensor dy = Ramp(DType::kFp32, {2, kV});
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  client::BackwardShmArgs backward;
  backward.dy = dy;
  backward.x = x;
  backward.dx.slot = Slot(0);
  client::BackwardOptions no_dx;
  no_dx.want_dx = false;
  absl::Status s = client().BackwardShm(backward, handle_, no_dx).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("dx_shm: given, but dX is not asked for"));

  const Tensor targets = Targets(2);
  client::CrossEntropyShmArgs ce;
  ce.x = x;
  ce.targets = targets;
  ce.dx.slot = Slot(0);
  s = client().CrossEntropyShm(ce, handle_, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("dx_shm"));
  EXPECT_EQ(fake().calls(FakeMethod::kBackward), 0);
  EXPECT_EQ(fake().calls(FakeMethod::kCrossEntropy), 0);
}

TEST_F(ServiceShmTest, SlotOfAnUnknownRegionIsNotFound) {
  const Tensor x = Ramp(DType::kBf16, {2, kK});
  client::LogitsShmArgs args;
  args.x = x;
  args.y.slot = client::ShmSlot{"shm-404", &region_, 0};
  const absl::Status s = client().LogitsShm(args, handle_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("shared-memory region 'shm-404' is not registered"));
  EXPECT_EQ(fake().calls(FakeMethod::kLogits), 0);
}

}  // namespace
}  // namespace logitd::testing
