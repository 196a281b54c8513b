// The tensor calls of logitd::client::Client: Logits, Backward,
// FetchGradient, ZeroGradient, Cast and CrossEntropy, each with its tensors
// streamed or in shared memory. One implementation per RPC (the *Shm
// methods); the plain methods are those calls without slots. How tensors
// travel and are checked is call_tensors.h's.
#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/call_tensors.h"
#include "client/cpp/client_impl.h"
#include "logitd/client.h"
#include "logitd/protocol.h"
#include "logitd/wire/wire.h"

namespace logitd::client {

absl::StatusOr<Tensor> Client::Logits(const Tensor& x, const std::string& handle,
                                      const LogitsOptions& options, Timing* timing) {
  Tensor y;
  if (absl::Status s = LogitsInto(x, handle, &y, options, timing); !s.ok()) return s;
  return y;
}

absl::Status Client::LogitsInto(const Tensor& x, const std::string& handle, Tensor* y,
                                const LogitsOptions& options, Timing* timing) {
  if (y == nullptr) return absl::InvalidArgumentError("y: expected a tensor to receive into");
  if (options.connections != 1) return LogitsSpread(x, handle, y, options, timing);
  // LogitsShm without slots streams X up and Y back.
  LogitsShmArgs args;
  args.x = x;
  args.y = TensorOutput::Into(y);
  absl::StatusOr<LogitsShmResult> r = LogitsShm(args, handle, options);
  if (!r.ok()) return r.status();
  if (timing != nullptr) *timing = std::move(r->timing);
  return absl::OkStatus();
}

namespace {

// Most connections one call is spread over.
constexpr int kMaxConnections = 64;

absl::Status CheckConnections(int connections) {
  if (connections < 1 || connections > kMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections: expected 1 to ", kMaxConnections, ", got ", connections));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<WeightInfo>> Client::SpreadWeight(const std::string& handle) {
  {
    absl::MutexLock lock(&impl_->spread_mu);
    if (auto it = impl_->weights_seen.find(handle); it != impl_->weights_seen.end()) {
      return it->second;
    }
  }
  absl::StatusOr<std::vector<WeightInfo>> listed = ListWeights();
  if (!listed.ok()) return listed.status();
  absl::MutexLock lock(&impl_->spread_mu);
  for (WeightInfo& info : *listed) impl_->weights_seen[info.handle] = info;
  if (auto it = impl_->weights_seen.find(handle); it != impl_->weights_seen.end()) {
    return it->second;
  }
  return std::nullopt;
}

absl::Status Client::RunSpread(
    std::int64_t m, std::int64_t block, int connections,
    const std::function<absl::Status(Client&, std::int64_t, std::int64_t, std::int64_t)>& part) {
  const std::int64_t blocks = (m + block - 1) / block;
  // Whole blocks a part, as even as they come, the last part taking the
  // rest: 5 blocks over 4 connections are 2 + 2 + 1 blocks.
  const std::int64_t wanted = std::min<std::int64_t>(connections, blocks);
  const std::int64_t blocks_per_part = (blocks + wanted - 1) / wanted;
  const std::int64_t parts = (blocks + blocks_per_part - 1) / blocks_per_part;
  const std::int64_t part_rows = blocks_per_part * block;
  // The further connections' Clients: the same options, each its own
  // connection.
  std::vector<Client*> clients = {this};
  {
    absl::MutexLock lock(&impl_->spread_mu);
    while (static_cast<std::int64_t>(impl_->spread.size()) < parts - 1) {
      ClientOptions own = impl_->options;
      own.own_connection = true;
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(impl_->address, own);
      if (!c.ok()) return c.status();
      impl_->spread.push_back(*std::move(c));
    }
    for (std::int64_t i = 0; i + 1 < parts; ++i) {
      clients.push_back(impl_->spread[static_cast<std::size_t>(i)].get());
    }
  }
  // The first part to fail cancels the others (they would only run to their
  // end for nothing) and its status is the call's: the others' CANCELLED
  // follows from it.
  CallGroup group;
  // The first part's failure; failed_mu guards it while the parts run.
  absl::Mutex failed_mu;
  absl::Status failed;
  std::vector<std::thread> threads;
  for (std::int64_t i = 0; i < parts; ++i) {
    const std::int64_t r0 = i * part_rows;
    const std::int64_t rows = i + 1 == parts ? m - r0 : part_rows;
    threads.emplace_back([&, i, r0, rows] {
      ScopedCallGroup in_group(&group);
      const absl::Status s = part(*clients[static_cast<std::size_t>(i)], r0, rows, i);
      if (s.ok()) return;
      {
        absl::MutexLock lock(&failed_mu);
        if (!failed.ok()) return;  // cancelled by the first to fail, or failed after it
        failed =
            absl::Status(s.code(), absl::StrCat("rows [", r0, ", ", r0 + rows, ") of ", m,
                                                " (a part on its own connection): ", s.message()));
      }
      group.Cancel();
    });
  }
  for (std::thread& t : threads) t.join();
  return failed;
}

absl::Status Client::LogitsSpread(const Tensor& x, const std::string& handle, Tensor* y,
                                  const LogitsOptions& options, Timing* timing) {
  if (absl::Status s = CheckConnections(options.connections); !s.ok()) return s;
  LogitsOptions one = options;
  one.connections = 1;
  // What the server would refuse, it refuses for the whole call.
  if (x.dtype() != DType::kBf16 || x.rank() != 2 || x.dim(0) < 2) {
    return LogitsInto(x, handle, y, one, timing);
  }
  absl::StatusOr<std::optional<WeightInfo>> w = SpreadWeight(handle);
  if (!w.ok()) return w.status();
  const std::int64_t block = !w->has_value()                     ? 0
                             : options.out_dtype == DType::kFp32 ? (*w)->logits_block_rows_fp32
                                                                 : (*w)->logits_block_rows_bf16;
  const std::int64_t m = x.dim(0);
  // An unknown handle, a server that does not say, or a call of one block:
  // one call (whose status is the server's).
  if (!w->has_value() || (*w)->shape.size() != 2 || block <= 0 || m <= block) {
    return LogitsInto(x, handle, y, one, timing);
  }
  const std::int64_t v = (*w)->shape[0];
  if (y->dtype() != options.out_dtype || y->shape() != std::vector<std::int64_t>{m, v}) {
    absl::StatusOr<Tensor> fresh = Tensor::CreateUninitialized(options.out_dtype, {m, v});
    if (!fresh.ok()) return fresh.status();
    *y = *std::move(fresh);
  }
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(v) * ElementSize(options.out_dtype);
  return RunSpread(m, block, options.connections,
                   [&](Client& c, std::int64_t r0, std::int64_t rows, std::int64_t i) {
                     return c.LogitsPart(x, r0, rows, handle,
                                         y->bytes() + static_cast<std::uint64_t>(r0) * row_bytes,
                                         static_cast<std::uint64_t>(rows) * row_bytes, one,
                                         i == 0 ? timing : nullptr);
                   });
}

absl::Status Client::LogitsPart(const Tensor& x, std::int64_t r0, std::int64_t rows,
                                const std::string& handle, std::byte* y, std::uint64_t y_bytes,
                                const LogitsOptions& options, Timing* timing) {
  const std::int64_t k = x.dim(1);
  CallTensors slots(impl_->options.digest_after_bytes);
  absl::Status s = slots.InputBytes("x", x.bytes() + static_cast<std::uint64_t>(r0 * k) * 2,
                                    DType::kBf16, {rows, k});
  if (!s.ok()) return s;
  slots.OutputBytes("y", y, y_bytes);
  v1::LogitsRequest request;
  v1::LogitsHeader* h = request.mutable_header();
  h->set_weight_handle(handle);
  h->set_out_dtype(wire::ToProto(options.out_dtype));
  h->set_alpha(options.alpha);
  h->set_digest_last(true);
  h->set_pipeline(options.pipeline);
  slots.FillHeader(h);
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::Status {
    v1::LogitsResult result;
    ResponseTensors tensors;
    absl::Status st = RunTensorCall<v1::LogitsRequest, v1::LogitsResponse>(
        *impl_->generic, "Logits", context, impl_->options.chunk_bytes, request, slots, &result,
        &tensors);
    if (!st.ok()) return st;
    if (result.y().shape_size() != 2 || result.y().shape(0) != rows ||
        result.y().dtype() != wire::ToProto(options.out_dtype)) {
      return absl::DataLossError(absl::StrCat("response from server: rows ", r0, "+", rows,
                                              " of the logits came back as another shape"));
    }
    if (timing != nullptr) *timing = TimingOf(result.timing(), context);
    return absl::OkStatus();
  });
}

absl::StatusOr<BackwardResult> Client::Backward(const Tensor& dy, const Tensor& x,
                                                const std::string& handle,
                                                const BackwardOptions& options) {
  // BackwardShm without slots streams every tensor both ways.
  BackwardShmArgs args;
  args.dy = dy;
  args.x = x;
  absl::StatusOr<BackwardShmResult> r = BackwardShm(args, handle, options);
  if (!r.ok()) return r.status();
  BackwardResult out;
  out.dx = std::move(r->dx);
  out.dw = std::move(r->dw);
  out.timing = std::move(r->timing);
  return out;
}

absl::StatusOr<GradientResult> Client::FetchGradient(const std::string& handle,
                                                     bool zero_after_fetch) {
  Tensor dw;
  absl::StatusOr<GradientResult> r = FetchGradientInto(handle, zero_after_fetch, &dw);
  if (r.ok()) r->dw = std::move(dw);
  return r;
}

absl::StatusOr<GradientResult> Client::FetchGradientInto(const std::string& handle,
                                                         bool zero_after_fetch, Tensor* into) {
  if (into == nullptr) return absl::InvalidArgumentError("dw: expected a tensor to receive into");
  CallTensors slots(impl_->options.digest_after_bytes);
  if (absl::Status s = slots.Output("dw", std::nullopt, into); !s.ok()) return s;
  v1::FetchGradientRequest request;
  request.set_weight_handle(handle);
  request.set_zero_after_fetch(zero_after_fetch);
  request.set_digest_last(true);  // dW hashed while it travels
  return impl_->Call(
      !zero_after_fetch, [&](grpc::ClientContext& context) -> absl::StatusOr<GradientResult> {
        v1::FetchGradientResult result;
        ResponseTensors tensors;
        absl::Status s = RunTensorCall<v1::FetchGradientRequest, v1::FetchGradientResponse>(
            *impl_->generic, "FetchGradient", context, impl_->options.chunk_bytes, request, slots,
            &result, &tensors);
        if (!s.ok()) return s;
        absl::StatusOr<CallTensors::Received> dw = slots.Take("dw", result, &tensors);
        if (!dw.ok()) return dw.status();
        if (!dw->present()) {
          return absl::DataLossError("response from server: the gradient result has no dW");
        }
        GradientResult out;
        out.accumulated_calls = result.accumulated_calls();
        out.trailer = TrailerOf(context);
        return out;
      });
}

absl::Status Client::ZeroGradient(const std::string& handle) {
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::Status {
    v1::ZeroGradientRequest request;
    request.set_weight_handle(handle);
    v1::ZeroGradientResponse response;
    return FromGrpc(impl_->stub->ZeroGradient(&context, request, &response));
  });
}

absl::StatusOr<Tensor> Client::CastToBf16(const Tensor& input) {
  CastShmArgs args;
  args.input = input;
  absl::StatusOr<CastShmResult> r = CastShm(args);
  if (!r.ok()) return r.status();
  return *std::move(r->output);
}

absl::StatusOr<CrossEntropyResult> Client::CrossEntropy(const Tensor& x, const Tensor& targets,
                                                        const std::string& handle,
                                                        const CrossEntropyOptions& options) {
  // CrossEntropyShm without slots streams every tensor both ways.
  CrossEntropyShmArgs args;
  args.x = x;
  args.targets = targets;
  absl::StatusOr<CrossEntropyShmResult> r = CrossEntropyShm(args, handle, options);
  if (!r.ok()) return r.status();
  CrossEntropyResult out;
  out.loss = *std::move(r->loss);
  out.lse = std::move(r->lse);
  out.dx = std::move(r->dx);
  out.dw = std::move(r->dw);
  out.counted_tokens = r->counted_tokens;
  out.timing = std::move(r->timing);
  return out;
}

namespace {

// X is bf16 whatever the caller's TensorInput says of a slot's dtype.
TensorInput Bf16(TensorInput x) {
  x.dtype = DType::kBf16;
  return x;
}

// Output `name` as it came back, into whichever of *tensor and *shm it came as.
absl::Status TakeOutput(const CallTensors& slots, absl::string_view name,
                        const google::protobuf::Message& result, ResponseTensors* tensors,
                        std::optional<Tensor>* tensor, std::optional<ShmOutput>* shm) {
  absl::StatusOr<CallTensors::Received> got = slots.Take(name, result, tensors);
  if (!got.ok()) return got.status();
  *tensor = std::move(got->tensor);
  *shm = std::move(got->shm);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LogitsShmResult> Client::LogitsShm(const LogitsShmArgs& args,
                                                  const std::string& handle,
                                                  const LogitsOptions& options) {
  if (options.alpha == 0.0f) {
    return absl::InvalidArgumentError(
        "alpha: expected a non-zero scale (0 on the wire means the default 1), got 0");
  }
  CallTensors slots(impl_->options.digest_after_bytes);
  for (absl::Status s : {slots.Input("x", Bf16(args.x)), slots.Output("y", args.y)}) {
    if (!s.ok()) return s;
  }
  v1::LogitsRequest request;
  v1::LogitsHeader* h = request.mutable_header();
  h->set_weight_handle(handle);
  h->set_out_dtype(wire::ToProto(options.out_dtype));
  h->set_alpha(options.alpha);
  h->set_digest_last(true);  // a streamed Y is hashed while its chunks travel
  h->set_pipeline(options.pipeline);
  slots.FillHeader(h);

  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<LogitsShmResult> {
    v1::LogitsResult result;
    ResponseTensors tensors;
    absl::Status s = RunTensorCall<v1::LogitsRequest, v1::LogitsResponse>(
        *impl_->generic, "Logits", context, impl_->options.chunk_bytes, request, slots, &result,
        &tensors);
    if (!s.ok()) return s;
    LogitsShmResult out;
    out.timing = TimingOf(result.timing(), context);
    if (s = TakeOutput(slots, "y", result, &tensors, &out.y, &out.y_shm); !s.ok()) return s;
    if (args.y.into != nullptr) out.y.reset();
    if (!out.y && !out.y_shm && args.y.into == nullptr) {
      return absl::DataLossError("response from server: the logits result has no Y");
    }
    return out;
  });
}

absl::StatusOr<BackwardShmResult> Client::BackwardShm(const BackwardShmArgs& args,
                                                      const std::string& handle,
                                                      const BackwardOptions& options) {
  CallTensors slots(impl_->options.digest_after_bytes);
  for (absl::Status s : {slots.Input("dy", args.dy), slots.Input("x", Bf16(args.x)),
                         slots.Output("dx", args.dx), slots.Output("dw", args.dw)}) {
    if (!s.ok()) return s;
  }
  v1::BackwardRequest request;
  v1::BackwardHeader* h = request.mutable_header();
  h->set_weight_handle(handle);
  h->set_want_dx(options.want_dx);
  h->set_want_dw(options.want_dw);
  h->set_dx_dtype(wire::ToProto(options.dx_dtype));
  h->set_dw_dtype(wire::ToProto(options.dw_dtype));
  h->set_accumulate_dw(options.accumulate_dw);
  h->set_digest_last(true);  // streamed outputs hashed while they travel
  slots.FillHeader(h);

  return impl_->Call(
      !options.accumulate_dw,
      [&](grpc::ClientContext& context) -> absl::StatusOr<BackwardShmResult> {
        v1::BackwardResult result;
        ResponseTensors tensors;
        absl::Status s = RunTensorCall<v1::BackwardRequest, v1::BackwardResponse>(
            *impl_->generic, "Backward", context, impl_->options.chunk_bytes, request, slots,
            &result, &tensors);
        if (!s.ok()) return s;
        BackwardShmResult out;
        out.timing = TimingOf(result.timing(), context);
        if (s = TakeOutput(slots, "dx", result, &tensors, &out.dx, &out.dx_shm); !s.ok()) return s;
        if (s = TakeOutput(slots, "dw", result, &tensors, &out.dw, &out.dw_shm); !s.ok()) return s;
        return out;
      });
}

absl::StatusOr<CastShmResult> Client::CastShm(const CastShmArgs& args) {
  CallTensors slots(impl_->options.digest_after_bytes);
  for (absl::Status s : {slots.Input("input", args.input), slots.Output("output", args.output)}) {
    if (!s.ok()) return s;
  }
  v1::CastRequest request;
  request.mutable_header()->set_digest_last(true);  // the output hashed while it travels
  slots.FillHeader(request.mutable_header());

  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<CastShmResult> {
    v1::CastResult result;
    ResponseTensors tensors;
    absl::Status s = RunTensorCall<v1::CastRequest, v1::CastResponse>(
        *impl_->generic, "Cast", context, impl_->options.chunk_bytes, request, slots, &result,
        &tensors);
    if (!s.ok()) return s;
    CastShmResult out;
    out.timing = TimingOf(result.timing(), context);
    s = TakeOutput(slots, "output", result, &tensors, &out.output, &out.output_shm);
    if (!s.ok()) return s;
    if (!out.output && !out.output_shm) {
      return absl::DataLossError("response from server: the cast result has no output");
    }
    return out;
  });
}

absl::StatusOr<CrossEntropyShmResult> Client::CrossEntropyShm(const CrossEntropyShmArgs& args,
                                                              const std::string& handle,
                                                              const CrossEntropyOptions& options) {
  // As for alpha: proto3 reads 0 as "unset", which the server takes as 1.
  if (options.grad_scale == 0.0f) {
    return absl::InvalidArgumentError(
        "grad_scale: expected a non-zero loss gradient (0 on the wire means the default 1), "
        "got 0");
  }
  CallTensors slots(impl_->options.digest_after_bytes);
  // The targets before X: in row blocks the server waits for all of them
  // before the first block.
  for (absl::Status s : {slots.Input("targets", args.targets), slots.Input("x", Bf16(args.x)),
                         slots.Output("loss", args.loss), slots.Output("lse", args.lse),
                         slots.Output("dx", args.dx), slots.Output("dw", args.dw)}) {
    if (!s.ok()) return s;
  }
  v1::CrossEntropyRequest request;
  v1::CrossEntropyHeader* h = request.mutable_header();
  h->set_weight_handle(handle);
  SetCrossEntropyOptions(options, h);
  h->set_want_lse(options.want_lse);
  h->set_want_dx(options.want_dx);
  h->set_want_dw(options.want_dw);
  h->set_dx_dtype(wire::ToProto(options.dx_dtype));
  h->set_accumulate_dw(options.accumulate_dw);
  h->set_digest_last(true);  // streamed outputs hashed while they travel
  h->set_pipeline(options.pipeline);
  slots.FillHeader(h);

  return impl_->Call(
      !options.accumulate_dw,
      [&](grpc::ClientContext& context) -> absl::StatusOr<CrossEntropyShmResult> {
        v1::CrossEntropyResult result;
        ResponseTensors tensors;
        absl::Status s = RunTensorCall<v1::CrossEntropyRequest, v1::CrossEntropyResponse>(
            *impl_->generic, "CrossEntropy", context, impl_->options.chunk_bytes, request, slots,
            &result, &tensors);
        if (!s.ok()) return s;
        CrossEntropyShmResult out;
        out.counted_tokens = result.counted_tokens();
        out.timing = TimingOf(result.timing(), context);
        for (auto [name, tensor, shm] : {std::make_tuple("loss", &out.loss, &out.loss_shm),
                                         std::make_tuple("lse", &out.lse, &out.lse_shm),
                                         std::make_tuple("dx", &out.dx, &out.dx_shm),
                                         std::make_tuple("dw", &out.dw, &out.dw_shm)}) {
          if (s = TakeOutput(slots, name, result, &tensors, tensor, shm); !s.ok()) return s;
        }
        if (!out.loss && !out.loss_shm) {
          return absl::DataLossError("response from server: the cross-entropy result has no loss");
        }
        return out;
      });
}

void SetCrossEntropyOptions(const CrossEntropyOptions& options, v1::CrossEntropyHeader* h) {
  h->set_ignore_index(options.ignore_index);
  h->set_reduction(options.reduction == Reduction::kNone  ? v1::REDUCTION_NONE
                   : options.reduction == Reduction::kSum ? v1::REDUCTION_SUM
                                                          : v1::REDUCTION_MEAN);
  h->set_z_loss(options.z_loss);
  h->set_logit_softcap(options.logit_softcap);
  h->set_grad_scale(options.grad_scale);
}

void SetLogProbsOptions(const LogProbsOptions& options, v1::LogProbsHeader* h) {
  h->set_ignore_index(options.ignore_index);
  h->set_temperature(options.temperature);
  h->set_logit_softcap(options.logit_softcap);
  h->set_vocab_size(options.vocab_size);
}

namespace {

// A LogProbs header's options besides its tensors' specs.
void FillLogProbsHeader(const std::string& handle, const LogProbsOptions& options,
                        v1::LogProbsHeader* h) {
  h->set_weight_handle(handle);
  SetLogProbsOptions(options, h);
  h->set_top_k(static_cast<std::uint32_t>(options.top_k));
  h->set_want_entropy(options.want_entropy);
  h->set_want_lse(options.want_lse);
  h->set_want_rank(options.want_rank);
  h->set_digest_last(true);  // streamed outputs hashed while they travel
  h->set_pipeline(options.pipeline);
}

// The spec of LogProbs' output `name` in its result.
const v1::TensorSpec& LogProbsOutputSpec(const v1::LogProbsResult& r, absl::string_view name) {
  if (name == "logprob") return r.logprob();
  if (name == "lse") return r.lse();
  if (name == "entropy") return r.entropy();
  if (name == "topk_ids") return r.topk_ids();
  if (name == "topk_logprobs") return r.topk_logprobs();
  return r.rank();
}

}  // namespace

absl::StatusOr<LogProbsResult> Client::LogProbs(const Tensor& x, const Tensor* targets,
                                                const std::string& handle,
                                                const LogProbsOptions& options) {
  if (options.connections != 1) return LogProbsSpread(x, targets, handle, options);
  LogProbsShmArgs args;
  args.x = x;
  if (targets != nullptr) args.targets = *targets;
  return LogProbsShm(args, handle, options);
}

absl::StatusOr<LogProbsResult> Client::LogProbsShm(const LogProbsShmArgs& args,
                                                   const std::string& handle,
                                                   const LogProbsOptions& options) {
  // As for alpha: proto3 reads 0 as "unset", which the server takes as 1.
  if (options.temperature == 0.0f) {
    return absl::InvalidArgumentError(
        "temperature: expected a temperature > 0 (0 on the wire means the default 1), got 0");
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k: expected 0 to 64, got ", options.top_k));
  }
  CallTensors slots(impl_->options.digest_after_bytes);
  // The targets before X: in row blocks a block waits for its rows of both,
  // and X's rows are then what it waits for.
  if (args.targets.given()) {
    if (absl::Status s = slots.Input("targets", args.targets); !s.ok()) return s;
  }
  if (absl::Status s = slots.Input("x", Bf16(args.x)); !s.ok()) return s;
  for (absl::Status s :
       {slots.Output("logprob", args.logprob), slots.Output("lse", args.lse),
        slots.Output("entropy", args.entropy), slots.Output("topk_ids", args.topk_ids),
        slots.Output("topk_logprobs", args.topk_logprobs), slots.Output("rank", args.rank)}) {
    if (!s.ok()) return s;
  }
  v1::LogProbsRequest request;
  v1::LogProbsHeader* h = request.mutable_header();
  FillLogProbsHeader(handle, options, h);
  slots.FillHeader(h);

  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<LogProbsResult> {
    v1::LogProbsResult result;
    ResponseTensors tensors;
    absl::Status s = RunTensorCall<v1::LogProbsRequest, v1::LogProbsResponse>(
        *impl_->generic, "LogProbs", context, impl_->options.chunk_bytes, request, slots, &result,
        &tensors);
    if (!s.ok()) return s;
    LogProbsResult out;
    out.timing = TimingOf(result.timing(), context);
    for (auto [name, tensor, shm] :
         {std::make_tuple("logprob", &out.logprob, &out.logprob_shm),
          std::make_tuple("lse", &out.lse, &out.lse_shm),
          std::make_tuple("entropy", &out.entropy, &out.entropy_shm),
          std::make_tuple("topk_ids", &out.topk_ids, &out.topk_ids_shm),
          std::make_tuple("topk_logprobs", &out.topk_logprobs, &out.topk_logprobs_shm),
          std::make_tuple("rank", &out.rank, &out.rank_shm)}) {
      if (s = TakeOutput(slots, name, result, &tensors, tensor, shm); !s.ok()) return s;
    }
    return out;
  });
}

// The outputs are allocated whole and each part's rows received in place;
// the first part's timing is the call's.
namespace {

// An output of a LogProbs call spread over connections, with the
// elements of one of its rows, allocated whole for the blocks to land in.
struct SpreadOutput {
  const char* name;
  std::optional<Tensor>* tensor;
  DType dtype;
  std::int64_t per_row;
};

// Every output the call returns, allocated in *out for M rows.
absl::StatusOr<std::vector<SpreadOutput>> LogProbsOutputs(const LogProbsOptions& options,
                                                          bool targets, std::int64_t m,
                                                          LogProbsResult* out) {
  std::vector<SpreadOutput> outs;
  if (targets) outs.push_back({"logprob", &out->logprob, DType::kFp32, 1});
  if (options.want_lse) outs.push_back({"lse", &out->lse, DType::kFp32, 1});
  if (options.want_entropy) outs.push_back({"entropy", &out->entropy, DType::kFp32, 1});
  if (options.top_k > 0) {
    outs.push_back({"topk_ids", &out->topk_ids, DType::kInt32, options.top_k});
    outs.push_back({"topk_logprobs", &out->topk_logprobs, DType::kFp32, options.top_k});
  }
  if (options.want_rank) outs.push_back({"rank", &out->rank, DType::kInt64, 1});
  for (const SpreadOutput& o : outs) {
    const std::vector<std::int64_t> shape =
        o.per_row == 1 ? std::vector<std::int64_t>{m} : std::vector<std::int64_t>{m, o.per_row};
    absl::StatusOr<Tensor> fresh = Tensor::CreateUninitialized(o.dtype, shape);
    if (!fresh.ok()) return fresh.status();
    *o.tensor = *std::move(fresh);
  }
  return outs;
}

// DataLoss unless every output of one block's result has its rows.
absl::Status CheckSpreadRows(const v1::LogProbsResult& result,
                             const std::vector<SpreadOutput>& outs, std::int64_t r0,
                             std::int64_t rows) {
  for (const SpreadOutput& o : outs) {
    const v1::TensorSpec& spec = LogProbsOutputSpec(result, o.name);
    if (spec.shape_size() < 1 || spec.shape(0) != rows || spec.dtype() != wire::ToProto(o.dtype)) {
      return absl::DataLossError(absl::StrCat("response from server: rows ", r0, "+", rows, " of ",
                                              o.name, " came back as another shape"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LogProbsResult> Client::LogProbsSpread(const Tensor& x, const Tensor* targets,
                                                      const std::string& handle,
                                                      const LogProbsOptions& options) {
  if (absl::Status s = CheckConnections(options.connections); !s.ok()) return s;
  LogProbsOptions one = options;
  one.connections = 1;
  const auto whole = [&] { return LogProbs(x, targets, handle, one); };
  // What the server (or LogProbsShm) would refuse, it refuses for the
  // whole call.
  const bool targets_fit =
      targets == nullptr ||
      (targets->rank() == 1 && x.rank() == 2 && targets->dim(0) == x.dim(0) &&
       (targets->dtype() == DType::kInt32 || targets->dtype() == DType::kInt64));
  if (x.dtype() != DType::kBf16 || x.rank() != 2 || x.dim(0) < 2 || !targets_fit ||
      options.temperature == 0.0f || options.top_k < 0 || options.top_k > kMaxTopK ||
      (options.want_rank && targets == nullptr)) {
    return whole();
  }
  absl::StatusOr<std::optional<WeightInfo>> w = SpreadWeight(handle);
  if (!w.ok()) return w.status();
  const std::int64_t block = w->has_value() ? (*w)->logprobs_block_rows : 0;
  const std::int64_t m = x.dim(0);
  const std::int64_t k = x.dim(1);
  if (!w->has_value() || block <= 0 || m <= block) return whole();

  LogProbsResult out;
  absl::StatusOr<std::vector<SpreadOutput>> made =
      LogProbsOutputs(options, targets != nullptr, m, &out);
  if (!made.ok()) return made.status();
  const std::vector<SpreadOutput>& outs = *made;
  v1::LogProbsHeader header;
  FillLogProbsHeader(handle, one, &header);
  absl::Status spread = RunSpread(
      m, block, options.connections,
      [&](Client& c, std::int64_t r0, std::int64_t rows, std::int64_t i) {
        CallTensors slots(c.impl_->options.digest_after_bytes);
        if (targets != nullptr) {
          const std::uint64_t t_row = ElementSize(targets->dtype());
          absl::Status s =
              slots.InputBytes("targets", targets->bytes() + r0 * t_row, targets->dtype(), {rows});
          if (!s.ok()) return s;
        }
        absl::Status s = slots.InputBytes("x", x.bytes() + static_cast<std::uint64_t>(r0 * k) * 2,
                                          DType::kBf16, {rows, k});
        if (!s.ok()) return s;
        for (const SpreadOutput& o : outs) {
          const std::uint64_t row_bytes =
              static_cast<std::uint64_t>(o.per_row) * ElementSize(o.dtype);
          slots.OutputBytes(o.name,
                            (*o.tensor)->bytes() + static_cast<std::uint64_t>(r0) * row_bytes,
                            static_cast<std::uint64_t>(rows) * row_bytes);
        }
        v1::LogProbsRequest request;
        *request.mutable_header() = header;
        slots.FillHeader(request.mutable_header());
        return c.impl_->Call(true, [&](grpc::ClientContext& context) -> absl::Status {
          v1::LogProbsResult result;
          ResponseTensors tensors;
          absl::Status st = RunTensorCall<v1::LogProbsRequest, v1::LogProbsResponse>(
              *c.impl_->generic, "LogProbs", context, c.impl_->options.chunk_bytes, request, slots,
              &result, &tensors);
          if (!st.ok()) return st;
          if (absl::Status rows_ok = CheckSpreadRows(result, outs, r0, rows); !rows_ok.ok()) {
            return rows_ok;
          }
          if (i == 0) out.timing = TimingOf(result.timing(), context);
          return absl::OkStatus();
        });
      });
  if (!spread.ok()) return spread;
  return out;
}

}  // namespace logitd::client
