// libFuzzer target over what the service does with a tensor call's request
// stream before any backend runs: the header is validated
// (server/service/v1/validation.cc) and the chunks are reassembled and checked
// (wire/wire.cc, wire::Assembler), in the order the handlers in
// server/service/v1/tensor_methods.h do it. The input format is in request_input.h.
//
// Invariants checked (a violation aborts, which the fuzzer reports):
//  - a rejected call ends with a non-OK status of the codes the contract
//    names for that stage (InvalidArgument, ResourceExhausted, DataLoss),
//    with a message;
//  - nothing larger than the call's byte limit is ever allocated;
//  - an accepted call's tensors have exactly the announced dtype, shape,
//    byte count (the plan's) and xxh3 digest;
//  - cross-entropy targets that pass are all in [0, V) or ignore_index, and
//    the counted-token figure agrees with them.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "fuzz/request_input.h"
#include "google/protobuf/stubs/logging.h"
#include "logitd/tensor.h"
#include "logitd/v1/logitd.pb.h"
#include "logitd/wire/wire.h"
#include "server/service/transport/request_stream.h"
#include "server/service/v1/validation.h"

namespace logitd::fuzz {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "request_fuzzer: invariant violated: %s\n", what.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, what) \
  do {                         \
    if (!(cond)) Fail(what);   \
  } while (0)

// The request stream as the handler sees it: Read() fails at the end of the
// input, or where a message does not parse (gRPC ends the call there too).
template <typename Request>
class FakeStream {
 public:
  explicit FakeStream(const std::vector<std::string>* messages) : messages_(messages) {}
  bool Read(Request* msg) {
    if (next_ >= messages_->size()) return false;
    msg->Clear();
    return msg->ParseFromString((*messages_)[next_++]);
  }

 private:
  const std::vector<std::string>* messages_;
  std::size_t next_ = 0;
};

// The handlers' header and chunk reading (server/service/transport/request_stream.h);
// the client cannot cancel here.
template <typename Request>
absl::Status ReadHeader(FakeStream<Request>* stream, Request* first) {
  std::uint64_t bytes_in = 0;
  return service::ReadHeader(stream, first, &bytes_in);
}

template <typename Request>
absl::Status ReceiveChunks(FakeStream<Request>* stream, wire::Assembler* assembler) {
  service::StreamBytes bytes;
  return service::ReceiveChunks<Request>(stream, assembler, &bytes, [] { return false; });
}

// A reassembled tensor against its spec and the plan's byte count.
void CheckTensor(const v1::TensorSpec& spec, const Tensor& t, std::uint64_t plan_bytes) {
  const absl::StatusOr<DType> dtype = wire::FromProto(spec.dtype());
  FUZZ_CHECK(dtype.ok(), absl::StrCat(spec.name(), ": accepted with a bad dtype"));
  FUZZ_CHECK(t.dtype() == *dtype, absl::StrCat(spec.name(), ": dtype differs from the spec"));
  const std::vector<std::int64_t> shape(spec.shape().begin(), spec.shape().end());
  FUZZ_CHECK(t.shape() == shape, absl::StrCat(spec.name(), ": shape differs from the spec"));
  FUZZ_CHECK(t.nbytes() == plan_bytes,
             absl::StrCat(spec.name(), ": ", t.nbytes(), " bytes, plan says ", plan_bytes));
  FUZZ_CHECK(Xxh3(t.bytes(), t.nbytes()) == spec.xxh3(),
             absl::StrCat(spec.name(), ": accepted bytes do not match the announced digest"));
}

// A status a rejected call may end with.
void CheckRejection(const absl::Status& s) {
  FUZZ_CHECK(!s.ok(), "expected a rejection");
  const absl::StatusCode c = s.code();
  FUZZ_CHECK(c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kResourceExhausted ||
                 c == absl::StatusCode::kDataLoss,
             absl::StrCat("unexpected status ", s.ToString()));
  FUZZ_CHECK(!s.message().empty(), absl::StrCat("status without a message: ", s.ToString()));
}

// Returns the first failure, as the handlers do.
#define FUZZ_RETURN_IF_ERROR(expr)  \
  do {                              \
    const absl::Status _s = (expr); \
    if (!_s.ok()) return _s;        \
  } while (0)

absl::Status CheckHandle(const std::string& handle) {
  // FindWeight: an empty handle is InvalidArgument; any other handle is
  // taken to name the weight [V, K] of the input's prefix.
  return service::ValidateHandle(handle);
}

absl::Status RunRegisterWeight(const RequestInput& in) {
  FakeStream<v1::RegisterWeightRequest> stream(&in.messages);
  v1::RegisterWeightRequest first;
  FUZZ_RETURN_IF_ERROR(ReadHeader(&stream, &first));
  const v1::RegisterWeightHeader& header = first.header();
  absl::StatusOr<service::WeightPlan> plan = service::ValidateRegisterWeight(header);
  FUZZ_RETURN_IF_ERROR(plan.status());
  FUZZ_CHECK(plan->bytes == static_cast<std::uint64_t>(plan->v * plan->k) * 2,
             "weight plan bytes are not V * K * 2");
  // The service charges the weight budget (the registry) on the declared
  // shape before any chunk arrives; the input's limit stands in for it.
  if (plan->bytes > in.max_request_bytes) {
    return absl::ResourceExhaustedError("weight past the budget");
  }

  wire::Assembler assembler(plan->bytes);
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.weight()));
  FUZZ_RETURN_IF_ERROR(ReceiveChunks(&stream, &assembler));
  absl::StatusOr<Tensor> w = assembler.Take(header.weight().name());
  FUZZ_CHECK(w.ok(), "announced weight missing after Finish");
  CheckTensor(header.weight(), *w, plan->bytes);
  FUZZ_CHECK(
      w->dtype() == DType::kBf16 && w->rank() == 2 && w->dim(0) == plan->v && w->dim(1) == plan->k,
      "accepted weight is not bf16 [V, K]");
  return absl::OkStatus();
}

absl::Status RunLogits(const RequestInput& in, const service::WeightDims& dims) {
  FakeStream<v1::LogitsRequest> stream(&in.messages);
  v1::LogitsRequest first;
  FUZZ_RETURN_IF_ERROR(ReadHeader(&stream, &first));
  const v1::LogitsHeader& header = first.header();
  FUZZ_RETURN_IF_ERROR(CheckHandle(header.weight_handle()));
  absl::StatusOr<service::LogitsPlan> plan =
      service::ValidateLogits(header, dims, in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(plan.status());
  FUZZ_CHECK(plan->x_bytes + plan->y_bytes <= in.max_request_bytes, "logits plan past the limit");
  FUZZ_CHECK(
      plan->y_bytes == static_cast<std::uint64_t>(plan->m * dims.v) * ElementSize(plan->out_dtype),
      "y_bytes is not M * V * element size");

  wire::Assembler assembler(in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.x()));
  FUZZ_RETURN_IF_ERROR(ReceiveChunks(&stream, &assembler));
  absl::StatusOr<Tensor> x = assembler.Take(header.x().name());
  FUZZ_CHECK(x.ok(), "announced x missing after Finish");
  CheckTensor(header.x(), *x, plan->x_bytes);
  FUZZ_CHECK(
      x->dtype() == DType::kBf16 && x->rank() == 2 && x->dim(0) == plan->m && x->dim(1) == dims.k,
      "accepted x is not bf16 [M, K]");
  return absl::OkStatus();
}

absl::Status RunBackward(const RequestInput& in, const service::WeightDims& dims) {
  FakeStream<v1::BackwardRequest> stream(&in.messages);
  v1::BackwardRequest first;
  FUZZ_RETURN_IF_ERROR(ReadHeader(&stream, &first));
  const v1::BackwardHeader& header = first.header();
  FUZZ_RETURN_IF_ERROR(CheckHandle(header.weight_handle()));
  absl::StatusOr<service::BackwardPlan> plan =
      service::ValidateBackward(header, dims, in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(plan.status());
  FUZZ_CHECK(plan->want_dx || plan->want_dw, "backward accepted with nothing wanted");
  FUZZ_CHECK(!plan->accumulate_dw || plan->want_dw, "accumulate_dw accepted without want_dw");
  FUZZ_CHECK(
      plan->dy_bytes + plan->x_bytes + plan->dx_bytes + plan->dw_bytes <= in.max_request_bytes,
      "backward plan past the limit");

  wire::Assembler assembler(in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.dy()));
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.x()));
  FUZZ_RETURN_IF_ERROR(ReceiveChunks(&stream, &assembler));
  absl::StatusOr<Tensor> dy = assembler.Take(header.dy().name());
  absl::StatusOr<Tensor> x = assembler.Take(header.x().name());
  FUZZ_CHECK(dy.ok() && x.ok(), "announced dy or x missing after Finish");
  CheckTensor(header.dy(), *dy, plan->dy_bytes);
  CheckTensor(header.x(), *x, plan->x_bytes);
  FUZZ_CHECK(dy->rank() == 2 && dy->dim(0) == plan->m && dy->dim(1) == dims.v &&
                 dy->dtype() == plan->dy_dtype,
             "accepted dy is not [M, V] of the planned dtype");
  FUZZ_CHECK(
      x->dtype() == DType::kBf16 && x->rank() == 2 && x->dim(0) == plan->m && x->dim(1) == dims.k,
      "accepted x is not bf16 [M, K]");
  return absl::OkStatus();
}

absl::Status RunCast(const RequestInput& in) {
  FakeStream<v1::CastRequest> stream(&in.messages);
  v1::CastRequest first;
  FUZZ_RETURN_IF_ERROR(ReadHeader(&stream, &first));
  const v1::CastHeader& header = first.header();
  absl::StatusOr<service::CastPlan> plan = service::ValidateCast(header, in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(plan.status());
  FUZZ_CHECK(plan->in_bytes == static_cast<std::uint64_t>(plan->n) * 4 &&
                 plan->out_bytes == static_cast<std::uint64_t>(plan->n) * 2,
             "cast plan byte counts are not 4n and 2n");
  FUZZ_CHECK(plan->in_bytes + plan->out_bytes <= in.max_request_bytes, "cast plan past the limit");

  wire::Assembler assembler(in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.input()));
  FUZZ_RETURN_IF_ERROR(ReceiveChunks(&stream, &assembler));
  absl::StatusOr<Tensor> t = assembler.Take(header.input().name());
  FUZZ_CHECK(t.ok(), "announced input missing after Finish");
  CheckTensor(header.input(), *t, plan->in_bytes);
  FUZZ_CHECK(t->dtype() == DType::kFp32 && t->shape() == plan->shape, "cast input is not fp32");
  return absl::OkStatus();
}

absl::Status RunCrossEntropy(const RequestInput& in, const service::WeightDims& dims) {
  FakeStream<v1::CrossEntropyRequest> stream(&in.messages);
  v1::CrossEntropyRequest first;
  FUZZ_RETURN_IF_ERROR(ReadHeader(&stream, &first));
  const v1::CrossEntropyHeader& header = first.header();
  FUZZ_RETURN_IF_ERROR(CheckHandle(header.weight_handle()));
  absl::StatusOr<service::CrossEntropyPlan> plan =
      service::ValidateCrossEntropy(header, dims, in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(plan.status());
  FUZZ_CHECK(!plan->accumulate_dw || plan->want_dw, "accumulate_dw accepted without want_dw");

  wire::Assembler assembler(in.max_request_bytes);
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.x()));
  FUZZ_RETURN_IF_ERROR(assembler.Expect(header.targets()));
  FUZZ_RETURN_IF_ERROR(ReceiveChunks(&stream, &assembler));
  absl::StatusOr<Tensor> x = assembler.Take(header.x().name());
  absl::StatusOr<Tensor> targets = assembler.Take(header.targets().name());
  FUZZ_CHECK(x.ok() && targets.ok(), "announced x or targets missing after Finish");
  CheckTensor(header.x(), *x, plan->x_bytes);
  CheckTensor(header.targets(), *targets, plan->targets_bytes);
  FUZZ_CHECK(
      targets->dtype() == plan->targets_dtype && targets->rank() == 1 && targets->dim(0) == plan->m,
      "accepted targets are not [M] of the planned dtype");

  std::vector<std::int64_t> widened;
  absl::StatusOr<std::int64_t> counted =
      service::ConvertTargets(*targets, dims.v, plan->ignore_index, &widened);
  FUZZ_RETURN_IF_ERROR(counted.status());
  FUZZ_CHECK(widened.size() == static_cast<std::size_t>(plan->m), "widened targets are not [M]");
  std::int64_t n = 0;
  for (std::int64_t t : widened) {
    if (t == plan->ignore_index) continue;
    FUZZ_CHECK(t >= 0 && t < dims.v, absl::StrCat("target ", t, " outside [0, ", dims.v, ")"));
    ++n;
  }
  FUZZ_CHECK(n == *counted, absl::StrCat("counted ", *counted, " tokens, found ", n));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRequest(const std::uint8_t* data, std::size_t size) {
  // Parse failures (invalid UTF-8 in a string field, ...) are expected here;
  // protobuf's log line for each would drown the fuzzer's output.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const RequestInput in = DecodeRequestInput(data, size);
  const service::WeightDims dims{in.v, in.k, "'fuzz'"};
  absl::Status s;
  switch (in.call) {
    case Call::kRegisterWeight:
      s = RunRegisterWeight(in);
      break;
    case Call::kLogits:
      s = RunLogits(in, dims);
      break;
    case Call::kBackward:
      s = RunBackward(in, dims);
      break;
    case Call::kCast:
      s = RunCast(in);
      break;
    case Call::kCrossEntropy:
      s = RunCrossEntropy(in, dims);
      break;
  }
  if (!s.ok()) CheckRejection(s);
  return s;
}

}  // namespace logitd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)logitd::fuzz::RunRequest(data, size);
  return 0;
}
