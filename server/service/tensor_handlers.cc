// The tensor calls: Logits, Backward, FetchGradient, ZeroGradient, Cast and
// CrossEntropy. Each reads as validate -> declare slots -> receive ->
// backend -> send; how tensors travel (chunks or shared memory), admission,
// digests and timing are TensorCall's (tensor_call.h).
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "logitd/bf16.h"
#include "server/service/service.h"
#include "server/service/status.h"
#include "server/service/validation.h"

namespace logitd::service {
namespace {

WeightDims DimsOf(const WeightRecord& w) { return WeightDims{w.v, w.k, w.Label()}; }

// The weight a call names: a missing handle is InvalidArgument, an unknown
// one NotFound.
absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, const Tenant& tenant,
                                        absl::string_view handle) {
  LOGITD_RETURN_IF_ERROR(ValidateHandle(handle));
  return registry.Find(tenant, handle);
}

// CrossEntropy's slots: x and targets in; loss always out, lse, dX and dW
// as asked.
absl::Status CrossEntropySlots(const v1::CrossEntropyHeader& h, const CrossEntropyPlan& plan,
                               const WeightRecord& w, TensorCallBase* call) {
  const std::int64_t m = plan.m;
  LOGITD_RETURN_IF_ERROR(call->Input("x", h.x(), plan.x_bytes, ShmSlot(h.has_x_shm(), h.x_shm())));
  LOGITD_RETURN_IF_ERROR(call->Input("targets", h.targets(), plan.targets_bytes,
                                     ShmSlot(h.has_targets_shm(), h.targets_shm())));
  LOGITD_RETURN_IF_ERROR(call->Output("loss", DType::kFp32, plan.loss_shape, plan.loss_bytes,
                                      ShmSlot(h.has_loss_shm(), h.loss_shm())));
  if (plan.want_lse) {
    LOGITD_RETURN_IF_ERROR(call->Output("lse", DType::kFp32, {m}, plan.lse_bytes,
                                        ShmSlot(h.has_lse_shm(), h.lse_shm())));
  }
  if (plan.want_dx) {
    LOGITD_RETURN_IF_ERROR(call->Output("dx", plan.dx_dtype, {m, w.k}, plan.dx_bytes,
                                        ShmSlot(h.has_dx_shm(), h.dx_shm())));
  }
  if (plan.returns_dw()) {
    LOGITD_RETURN_IF_ERROR(call->Output("dw", DType::kFp32, {w.v, w.k}, plan.dw_bytes,
                                        ShmSlot(h.has_dw_shm(), h.dw_shm())));
  }
  return absl::OkStatus();
}

// LogProbs' slots: x and (optionally) targets in; the outputs asked for.
absl::Status LogProbsSlots(const v1::LogProbsHeader& h, const LogProbsPlan& plan,
                           TensorCallBase* call) {
  const std::int64_t m = plan.m;
  LOGITD_RETURN_IF_ERROR(call->Input("x", h.x(), plan.x_bytes, ShmSlot(h.has_x_shm(), h.x_shm())));
  if (plan.has_targets) {
    LOGITD_RETURN_IF_ERROR(call->Input("targets", h.targets(), plan.targets_bytes,
                                       ShmSlot(h.has_targets_shm(), h.targets_shm())));
    LOGITD_RETURN_IF_ERROR(call->Output("logprob", DType::kFp32, {m}, plan.logprob_bytes,
                                        ShmSlot(h.has_logprob_shm(), h.logprob_shm())));
  }
  if (plan.want_lse) {
    LOGITD_RETURN_IF_ERROR(call->Output("lse", DType::kFp32, {m}, plan.lse_bytes,
                                        ShmSlot(h.has_lse_shm(), h.lse_shm())));
  }
  if (plan.want_entropy) {
    LOGITD_RETURN_IF_ERROR(call->Output("entropy", DType::kFp32, {m}, plan.entropy_bytes,
                                        ShmSlot(h.has_entropy_shm(), h.entropy_shm())));
  }
  if (plan.top_k > 0) {
    LOGITD_RETURN_IF_ERROR(call->Output("topk_ids", DType::kInt32, {m, plan.top_k},
                                        plan.topk_ids_bytes,
                                        ShmSlot(h.has_topk_ids_shm(), h.topk_ids_shm())));
    LOGITD_RETURN_IF_ERROR(call->Output("topk_logprobs", DType::kFp32, {m, plan.top_k},
                                        plan.topk_logprobs_bytes,
                                        ShmSlot(h.has_topk_logprobs_shm(), h.topk_logprobs_shm())));
  }
  if (plan.want_rank) {
    LOGITD_RETURN_IF_ERROR(call->Output("rank", DType::kInt64, {m}, plan.rank_bytes,
                                        ShmSlot(h.has_rank_shm(), h.rank_shm())));
  }
  return absl::OkStatus();
}

}  // namespace

TensorCallEnv LogitdService::tensor_env() {
  TensorCallEnv env;
  env.backend = backend_.get();
  env.admission = &admission_;
  env.shm = &shm_;
  env.sending = &sending_;
  env.faults = faults_.get();
  env.max_request_bytes = options_.max_request_bytes;
  env.chunk_bytes = options_.chunk_bytes;
  return env;
}

template <typename Request, typename Response>
RawHandler LogitdService::TensorCallHandler(absl::string_view method,
                                            TensorHandler<TensorCall<Request, Response>> handler) {
  return [this, method, handler](grpc::CallbackServerContext* context, RawStream* raw) {
    MessageStream<Response, Request> stream(raw, options_.max_receive_message_bytes);
    return runner_.Run(method, context, [&](CallStats* stats) {
      TensorCall<Request, Response> call(tensor_env(), method, context, &stream, stats);
      return (this->*handler)(&call);
    });
  };
}

RawBidiReactor* LogitdService::Logits(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Logits", &LogitdService::DoLogits));
}

absl::Status LogitdService::DoLogits(LogitsCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  const v1::LogitsHeader& header = call->header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, call->tenant(), header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const LogitsPlan plan,
                          ValidateLogits(header, DimsOf(w), options_.max_request_bytes));
  LOGITD_RETURN_IF_ERROR(
      call->Input("x", header.x(), plan.x_bytes, ShmSlot(header.has_x_shm(), header.x_shm())));
  LOGITD_RETURN_IF_ERROR(call->Output("y", plan.out_dtype, {plan.m, w.v}, plan.y_bytes,
                                      ShmSlot(header.has_y_shm(), header.y_shm())));
  LOGITD_RETURN_IF_ERROR(call->Receive("logits"));

  kernels::LogitsArgs args;
  args.x = call->in<Bf16Bits>("x");
  args.m = plan.m;
  args.alpha = plan.alpha;
  args.out_dtype = plan.out_dtype;
  args.y = call->out("y");
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->Logits(*w.weight, args, &timing));
  call->ReleaseInputs();

  v1::LogitsResponse head;
  call->Timed(timing, head.mutable_result()->mutable_timing());
  return call->Send(&head, head.mutable_result(), header.digest_last());
}

RawBidiReactor* LogitdService::Backward(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Backward", &LogitdService::DoBackward));
}

absl::Status LogitdService::DoBackward(BackwardCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  const v1::BackwardHeader& header = call->header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, call->tenant(), header.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const BackwardPlan plan,
                          ValidateBackward(header, DimsOf(w), options_.max_request_bytes));
  // The gradient buffer is charged to the budget before the backend may
  // create it, and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, registry_.BeginAccumulate(call->tenant(), w.handle));
  }
  LOGITD_RETURN_IF_ERROR(
      call->Input("dy", header.dy(), plan.dy_bytes, ShmSlot(header.has_dy_shm(), header.dy_shm())));
  LOGITD_RETURN_IF_ERROR(
      call->Input("x", header.x(), plan.x_bytes, ShmSlot(header.has_x_shm(), header.x_shm())));
  if (plan.want_dx) {
    LOGITD_RETURN_IF_ERROR(call->Output("dx", plan.dx_dtype, {plan.m, w.k}, plan.dx_bytes,
                                        ShmSlot(header.has_dx_shm(), header.dx_shm())));
  }
  if (plan.returns_dw()) {
    LOGITD_RETURN_IF_ERROR(call->Output("dw", plan.dw_dtype, {w.v, w.k}, plan.dw_bytes,
                                        ShmSlot(header.has_dw_shm(), header.dw_shm())));
  }
  LOGITD_RETURN_IF_ERROR(call->Receive("backward"));

  kernels::BackwardArgs args;
  args.dy = call->in("dy");
  args.dy_dtype = plan.dy_dtype;
  args.x = call->in<Bf16Bits>("x");
  args.m = plan.m;
  args.dx = call->out("dx");
  args.dx_dtype = plan.dx_dtype;
  args.dw = call->out("dw");
  args.dw_dtype = plan.dw_dtype;
  args.accumulate_dw = plan.accumulate_dw;
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->Backward(*w.weight, args, &timing));
  call->ReleaseInputs();

  v1::BackwardResponse head;
  call->Timed(timing, head.mutable_result()->mutable_timing());
  return call->Send(&head, head.mutable_result(), header.digest_last());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* LogitdService::FetchGradient(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return ServeServerStreaming(context, request, &threads_,
                              TensorCallHandler("FetchGradient", &LogitdService::DoFetchGradient));
}

absl::Status LogitdService::DoFetchGradient(FetchGradientCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadRequest());
  const v1::FetchGradientRequest& request = call->request();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, call->tenant(), request.weight_handle()));
  // Not admitted nor held to --max_request_bytes: the buffer already counts
  // against the weight budget, and refusing here would strand an
  // accumulated gradient.
  const std::uint64_t bytes = WeightRegistry::GradientBytes(w.v, w.k);
  LOGITD_RETURN_IF_ERROR(call->Output("dw", DType::kFp32, {w.v, w.k}, bytes));
  LOGITD_RETURN_IF_ERROR(call->AllocateOutputs());
  const absl::Time fetch_start = absl::Now();
  LOGITD_ASSIGN_OR_RETURN(
      const std::uint64_t calls,
      backend_->FetchGradient(*w.weight, call->out<float>("dw"), request.zero_after_fetch()));
  // The copy out of the gradient buffer (device to host on cuda): the
  // trailer's d2h.
  call->stats()->d2h_us = Micros(absl::Now() - fetch_start);

  v1::FetchGradientResponse head;
  head.mutable_result()->set_accumulated_calls(calls);
  return call->Send(&head, head.mutable_result(), request.digest_last());
}

grpc::Status LogitdService::ZeroGradient(grpc::ServerContext* context,
                                         const v1::ZeroGradientRequest* request,
                                         v1::ZeroGradientResponse* /*response*/) {
  return runner_.Run("ZeroGradient", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                            FindWeight(registry_, stats->tenant, request->weight_handle()));
    return backend_->ZeroGradient(*w.weight);
  });
}

RawBidiReactor* LogitdService::Cast(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("Cast", &LogitdService::DoCast));
}

absl::Status LogitdService::DoCast(CastCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  const v1::CastHeader& header = call->header();
  LOGITD_ASSIGN_OR_RETURN(const CastPlan plan, ValidateCast(header, options_.max_request_bytes));
  LOGITD_RETURN_IF_ERROR(call->Input("input", header.input(), plan.in_bytes,
                                     ShmSlot(header.has_input_shm(), header.input_shm())));
  LOGITD_RETURN_IF_ERROR(call->Output("output", DType::kBf16, plan.shape, plan.out_bytes,
                                      ShmSlot(header.has_output_shm(), header.output_shm())));
  LOGITD_RETURN_IF_ERROR(call->Receive("cast"));

  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->CastToBf16(call->in<float>("input"), plan.n,
                                              call->out<Bf16Bits>("output"), &timing));
  call->ReleaseInputs();

  v1::CastResponse head;
  call->Timed(timing, head.mutable_result()->mutable_timing());
  return call->Send(&head, head.mutable_result(), header.digest_last());
}

RawBidiReactor* LogitdService::CrossEntropy(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_,
                   TensorCallHandler("CrossEntropy", &LogitdService::DoCrossEntropy));
}

absl::Status LogitdService::DoCrossEntropy(CrossEntropyCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  const v1::CrossEntropyHeader& h = call->header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, call->tenant(), h.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const CrossEntropyPlan plan,
                          ValidateCrossEntropy(h, DimsOf(w), options_.max_request_bytes));
  // As in Backward: the buffer is charged before the backend may create it
  // and before any of the request's bytes are received.
  GradientTicket gradient;
  if (plan.accumulate_dw) {
    LOGITD_ASSIGN_OR_RETURN(gradient, registry_.BeginAccumulate(call->tenant(), w.handle));
  }
  const std::int64_t m = plan.m;
  LOGITD_RETURN_IF_ERROR(CrossEntropySlots(h, plan, w, call));
  // Besides the slots: the targets widened to int64 and the per-token losses
  // the backend always writes (a reduced loss is formed from them here).
  const bool per_token = plan.reduction == v1::REDUCTION_NONE;
  call->Scratch(static_cast<std::uint64_t>(m) * (sizeof(std::int64_t) + sizeof(float)));
  LOGITD_RETURN_IF_ERROR(call->Receive("cross entropy"));
  std::vector<std::int64_t> targets;
  LOGITD_ASSIGN_OR_RETURN(
      const std::int64_t counted,
      ConvertTargets(plan.targets_dtype, call->in("targets"), m, w.v, plan.ignore_index, &targets));
  kernels::HostBuffer token_loss;
  if (!per_token) {
    LOGITD_ASSIGN_OR_RETURN(token_loss, backend_->AllocateHost(m * sizeof(float)));
  }

  kernels::CrossEntropyArgs args;
  args.x = call->in<Bf16Bits>("x");
  args.m = m;
  args.targets = targets.data();
  args.ignore_index = plan.ignore_index;
  args.z_loss = plan.z_loss;
  args.logit_softcap = plan.logit_softcap;
  args.grad_scale = CrossEntropyGradScale(plan, counted);
  args.loss = per_token ? call->out<float>("loss") : token_loss.as<float>();
  args.lse = call->out<float>("lse");
  args.dx = call->out("dx");
  args.dx_dtype = plan.dx_dtype;
  args.dw = call->out<float>("dw");
  args.accumulate_dw = plan.accumulate_dw;
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->CrossEntropy(*w.weight, args, &timing));
  call->ReleaseInputs();
  if (!per_token) {
    const float reduced = ReduceLoss(plan, token_loss.as<float>(), m, counted);
    std::memcpy(call->out("loss"), &reduced, sizeof(float));
  }

  v1::CrossEntropyResponse head;
  head.mutable_result()->set_counted_tokens(counted);
  call->Timed(timing, head.mutable_result()->mutable_timing());
  return call->Send(&head, head.mutable_result(), h.digest_last());
}

RawBidiReactor* LogitdService::LogProbs(grpc::CallbackServerContext* context) {
  return ServeBidi(context, &threads_, TensorCallHandler("LogProbs", &LogitdService::DoLogProbs));
}

absl::Status LogitdService::DoLogProbs(LogProbsCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  const v1::LogProbsHeader& h = call->header();
  LOGITD_ASSIGN_OR_RETURN(const WeightRecord w,
                          FindWeight(registry_, call->tenant(), h.weight_handle()));
  LOGITD_ASSIGN_OR_RETURN(const LogProbsPlan plan,
                          ValidateLogProbs(h, DimsOf(w), options_.max_request_bytes));
  LOGITD_RETURN_IF_ERROR(LogProbsSlots(h, plan, call));
  // Besides the slots: the targets widened to int64.
  if (plan.has_targets) call->Scratch(static_cast<std::uint64_t>(plan.m) * sizeof(std::int64_t));
  LOGITD_RETURN_IF_ERROR(call->Receive("log probs"));
  std::vector<std::int64_t> targets;
  if (plan.has_targets) {
    LOGITD_RETURN_IF_ERROR(ConvertTargets(plan.targets_dtype, call->in("targets"), plan.m,
                                          plan.vocab, plan.ignore_index, &targets)
                               .status());
  }

  kernels::LogProbsArgs args;
  args.x = call->in<Bf16Bits>("x");
  args.m = plan.m;
  args.targets = plan.has_targets ? targets.data() : nullptr;
  args.ignore_index = plan.ignore_index;
  args.temperature = plan.temperature;
  args.logit_softcap = plan.logit_softcap;
  args.vocab = plan.vocab;
  args.logprob = call->out<float>("logprob");
  args.lse = call->out<float>("lse");
  args.entropy = call->out<float>("entropy");
  args.top_k = plan.top_k;
  args.topk_ids = call->out<std::int32_t>("topk_ids");
  args.topk_logprobs = call->out<float>("topk_logprobs");
  args.rank = call->out<std::int64_t>("rank");
  kernels::Timing timing;
  LOGITD_RETURN_IF_ERROR(backend_->LogProbs(*w.weight, args, &timing));
  call->ReleaseInputs();

  v1::LogProbsResponse head;
  call->Timed(timing, head.mutable_result()->mutable_timing());
  return call->Send(&head, head.mutable_result(), h.digest_last());
}

}  // namespace logitd::service
