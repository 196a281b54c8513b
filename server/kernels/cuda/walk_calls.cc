// The cuda backend's vocabulary walks: the fused cross-entropy (loss, lse,
// dX and dW from fp32 logits computed chunk by chunk, with the scratch plan
// shrunk until it fits) and LogProbs (the same walk without gradients).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logitd/bf16.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cross_entropy_kernels.h"
#include "server/kernels/cuda/cuda_backend_class.h"
#include "server/kernels/cuda/logprobs_kernels.h"

namespace logitd::kernels::cuda {

namespace {

class HostDwSink final : public CeDwSink {
 public:
  HostDwSink(Context& c, std::array<void*, 2> staging, float* host, std::int64_t v, std::int64_t k)
      : c_(c), staging_(staging), host_(host), v_(v), k_(k) {}

  absl::StatusOr<float*> Begin(std::int64_t /*c0*/, std::int64_t /*n*/) override {
    const std::size_t slot = count_ % 2;
    if (count_ >= 2) {
      // The slot's previous rows must have reached the host.
      RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(c_.compute.get(), c_.block_copied[slot].get(), 0),
                           "cross_entropy: cudaStreamWaitEvent");
    }
    return static_cast<float*>(staging_[slot]);
  }
  float beta() const override { return 0.0f; }
  absl::Status End(std::int64_t c0, std::int64_t n) override {
    const std::size_t slot = count_ % 2;
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c_.block_done[slot].get(), c_.compute.get()),
                         "cross_entropy: cudaEventRecord");
    RETURN_IF_ERROR_(Flush());
    pending_ = Pending{true, slot, c0, n};
    ++count_;
    return absl::OkStatus();
  }
  // Enqueues the copy still held back, if any.
  absl::Status Flush() {
    if (!pending_.valid) return absl::OkStatus();
    const Pending p = pending_;
    pending_.valid = false;
    cudaStream_t ss = c_.copy.get();
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(ss, c_.block_done[p.slot].get(), 0),
                         "cross_entropy: cudaStreamWaitEvent");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(host_ + p.c0 * k_, staging_[p.slot], static_cast<std::size_t>(p.n * k_) * 4,
                        cudaMemcpyDeviceToHost, ss),
        "cross_entropy: copy dw rows [", p.c0, ", ", p.c0 + p.n, ") of [", v_, ", ", k_,
        "] to the host");
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c_.block_copied[p.slot].get(), ss),
                         "cross_entropy: cudaEventRecord");
    return absl::OkStatus();
  }

 private:
  struct Pending {
    bool valid = false;
    std::size_t slot = 0;
    std::int64_t c0 = 0;
    std::int64_t n = 0;
  };
  Context& c_;
  std::array<void*, 2> staging_;
  float* host_;
  std::int64_t v_;
  std::int64_t k_;
  std::size_t count_ = 0;
  Pending pending_;
};

}  // namespace

// A cross-entropy's device scratch: the walk's buffers and the dW staging.
struct CeScratchSet {
  CeBuffers b;
  std::array<void*, 2> staging{};
  std::byte* row_base = nullptr;  // targets, loss and lse, then the row state
};

namespace {

// Byte offsets in a cross-entropy's rows buffer: the targets (int64), loss
// and lse, then the per-row state.
struct CeRowOffsets {
  std::size_t loss = 0;
  std::size_t lse = 0;
  std::size_t state = 0;
};
CeRowOffsets CeRows(std::int64_t m) {
  auto align = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t row_bytes = static_cast<std::size_t>(m) * 4;
  CeRowOffsets o;
  o.loss = align(static_cast<std::size_t>(m) * 8);
  o.lse = o.loss + align(row_bytes);
  o.state = o.lse + align(row_bytes);
  return o;
}

}  // namespace

absl::StatusOr<float*> CudaBackend::GradientBuffer(GradientState<DeviceBuffer>::Lock& gradient,
                                                   const CudaWeight& w, cudaStream_t cs,
                                                   const char* call) {
  absl::StatusOr<DeviceBuffer*> buffer =
      gradient.GetOrCreate([&]() -> absl::StatusOr<DeviceBuffer> {
        auto fresh = memory_->Allocate(
            static_cast<std::size_t>(w.v() * w.k()) * 4,
            absl::StrCat(call, ": gradient ", ShapeString({w.v(), w.k()}), " fp32"));
        if (!fresh.ok()) return fresh.status();
        RETURN_IF_CUDA_ERROR(cudaMemsetAsync(fresh->get(), 0, fresh->size(), cs), call,
                             ": zero the gradient buffer");
        RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), call, ": zero the gradient buffer");
        return fresh;
      });
  if (!buffer.ok()) return buffer.status();
  return (*buffer)->as<float>();
}

absl::Status CudaBackend::AllocateShrinking(Context& c, const CePlanRequest& request, CePlan* plan,
                                            std::initializer_list<Slot> slots,
                                            const std::function<absl::Status()>& allocate) {
  // Only when the device cannot hold the plan's scratch does an automatic
  // chunk shrink (ShrinkCePlan) until it fits.
  for (;;) {
    absl::Status allocated = allocate();
    if (allocated.ok()) return allocated;
    if (allocated.code() != absl::StatusCode::kResourceExhausted) return allocated;
    std::optional<CePlan> smaller = ShrinkCePlan(request, *plan);
    if (!smaller.has_value()) return allocated;
    // Nothing is enqueued yet: the context's buffers can go.
    for (Slot slot : slots) c.scratch[slot].Reset();
    *plan = *smaller;
  }
}

absl::Status CudaBackend::AllocateCrossEntropy(Context& c, const CudaWeight& w,
                                               const CrossEntropyArgs& args,
                                               const CePlanRequest& request, CePlan* plan,
                                               CeScratchSet* out) {
  const std::int64_t m = args.m;
  const std::int64_t v = w.v();
  const std::int64_t k = w.k();
  const bool staged_dw = request.want_dw && !request.accumulate_dw;
  const CeRowOffsets offsets = CeRows(m);
  auto allocate = [&]() -> absl::Status {
    const bool tokens = plan->walk == CeWalk::kTokens;
    const CeScratchSizes& sizes = plan->sizes;
    auto x = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "cross_entropy: device x");
    if (!x.ok()) return x.status();
    auto rows =
        Scratch(c, kRows, offsets.state + sizes.rows, "cross_entropy: device per-row state");
    if (!rows.ok()) return rows.status();
    auto logits = Scratch(c, kY0, sizes.logits, "cross_entropy: device logits chunk");
    if (!logits.ok()) return logits.status();
    *out = CeScratchSet{};
    CeBuffers& b = out->b;
    out->row_base = static_cast<std::byte*>(*rows);
    b.x = *x;
    b.w = w.data();
    b.targets = reinterpret_cast<const std::int64_t*>(out->row_base);
    b.loss = reinterpret_cast<float*>(out->row_base + offsets.loss);
    b.lse = args.lse != nullptr ? reinterpret_cast<float*>(out->row_base + offsets.lse) : nullptr;
    b.dx_bf16 = request.dx_bf16;
    b.logits = static_cast<float*>(*logits);
    b.rows = out->row_base + offsets.state;
    if (sizes.g > 0) {
      auto g = Scratch(c, kG, sizes.g, "cross_entropy: device G chunk");
      if (!g.ok()) return g.status();
      b.g = static_cast<std::uint16_t*>(*g);
    }
    if (request.dx_bf16) {
      auto acc = Scratch(c, kAcc, sizes.dx_acc, "cross_entropy: device fp32 dx staging");
      if (!acc.ok()) return acc.status();
      b.dx_acc = static_cast<float*>(*acc);
    }
    if (request.want_dx) {
      auto dx = Scratch(c, kDx, static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype),
                        "cross_entropy: device dx");
      if (!dx.ok()) return dx.status();
      b.dx = *dx;
    }
    // The token walk adds every chunk to all of dW: it is whole on the
    // device. The vocabulary walk stages dW rows on their way home.
    const std::size_t staging_bytes = static_cast<std::size_t>((tokens ? v : plan->chunk) * k) * 4;
    for (std::size_t i = 0; staged_dw && i < (tokens ? 1u : 2u); ++i) {
      auto buffer = Scratch(c, i == 0 ? kDw : kY1, staging_bytes, "cross_entropy: device dw");
      if (!buffer.ok()) return buffer.status();
      out->staging[i] = *buffer;
    }
    return absl::OkStatus();
  };
  return AllocateShrinking(c, request, plan, {kX, kRows, kY0, kG, kAcc, kDx, kDw, kY1}, allocate);
}

absl::Status CudaBackend::EnqueueCrossEntropy(Context& c, const CrossEntropyArgs& args,
                                              const CeProblem& p, const CeScratchSet& scratch,
                                              float* gradient_buffer, const StreamTimer& timer,
                                              Timing* timing) {
  const std::int64_t m = p.m;
  const std::int64_t v = p.v;
  const std::int64_t k = p.k;
  const CeBuffers& b = scratch.b;
  cudaStream_t cs = c.compute.get();
  cudaStream_t ss = c.copy.get();
  const bool staged_dw = args.dw != nullptr && !args.accumulate_dw;
  const bool tokens = p.walk == CeWalk::kTokens;
  const std::size_t row_bytes = static_cast<std::size_t>(m) * 4;
  const std::size_t dx_bytes = static_cast<std::size_t>(m * k) * ElementSize(args.dx_dtype);
  const std::string shape =
      absl::StrCat("M=", m, ",V=", v, ",K=", k, ",", CeWalkName(p.walk), " chunk=", p.chunk);

  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(const_cast<void*>(b.x), args.x, static_cast<std::size_t>(m * k) * 2,
                      cudaMemcpyHostToDevice, cs),
      "cross_entropy: copy x [", m, ", ", k, "] to the device");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(scratch.row_base, args.targets,
                                       static_cast<std::size_t>(m) * 8, cudaMemcpyHostToDevice, cs),
                       "cross_entropy: copy targets [", m, "] to the device");
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));

  HostDwSink host_sink(c, scratch.staging, args.dw, v, k);
  std::optional<DeviceDwSink> device_sink;
  CeDwSink* sink = nullptr;
  if (args.accumulate_dw) {
    device_sink.emplace(gradient_buffer, k, 1.0f);  // under the gradient's lock
    sink = &*device_sink;
  } else if (staged_dw && tokens) {
    device_sink.emplace(static_cast<float*>(scratch.staging[0]), k, 0.0f);
    sink = &*device_sink;
  } else if (staged_dw) {
    sink = &host_sink;
  }
  RETURN_IF_ERROR_(RunCrossEntropy(engine_, c.gemm(GemmRecord(timing)), p, b, sink));
  RETURN_IF_ERROR_(host_sink.Flush());
  if (staged_dw && tokens) {
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(args.dw, scratch.staging[0], static_cast<std::size_t>(v * k) * 4,
                        cudaMemcpyDeviceToHost, cs),
        "cross_entropy: copy dw [", v, ", ", k, "] to the host");
  }
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));

  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.loss, b.loss, row_bytes, cudaMemcpyDeviceToHost, cs),
                       "cross_entropy: copy loss [", m, "] to the host");
  if (args.lse != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.lse, b.lse, row_bytes, cudaMemcpyDeviceToHost, cs),
                         "cross_entropy: copy lse [", m, "] to the host");
  }
  if (args.dx != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.dx, b.dx, dx_bytes, cudaMemcpyDeviceToHost, cs),
                         "cross_entropy: copy dx [", m, ", ", k, "] to the host");
  }
  // The end is when both streams are done.
  RETURN_IF_ERROR_(timer.EndOfBothStreams(absl::StrCat("cross_entropy(", shape, ")")));
  // A failed kernel surfaces here if not before.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "cross_entropy(", shape, ")");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(ss), "cross_entropy(", shape, ")");
  return absl::OkStatus();
}

namespace {

// Runs block(r0, rows, timing) for the blocks of `block_rows` rows of a call
// of m rows (the last one what is left), in order, and sums their times into
// `timing` (fresh); `call` names the call in errors. Blocks start at the
// multiples of block_rows, so a call cut anywhere at those multiples (the
// service's BlockRowsAt, a client's parts) runs the same blocks.
absl::Status InRowBlocks(
    const char* call, std::int64_t m, std::int64_t block_rows, Timing* timing,
    const std::function<absl::Status(std::int64_t, std::int64_t, Timing*)>& block) {
  if (block_rows >= m) return block(0, m, timing);
  std::int64_t blocks = 0;
  std::string plan;
  for (std::int64_t r0 = 0; r0 < m; ++blocks) {
    const std::int64_t rows = std::min(block_rows, m - r0);
    Timing t;
    const absl::Status done = block(r0, rows, timing != nullptr ? &t : nullptr);
    if (!done.ok()) {
      return absl::Status(done.code(), absl::StrCat(done.message(), " (", call, ", rows [", r0,
                                                    ", ", r0 + rows, ") of ", m, ")"));
    }
    if (timing != nullptr) {
      timing->h2d_us += t.h2d_us;
      timing->compute_us += t.compute_us;
      timing->d2h_us += t.d2h_us;
      timing->transfers_measured = t.transfers_measured;
      for (std::string& gemm : t.gemms) {
        if (std::find(timing->gemms.begin(), timing->gemms.end(), gemm) == timing->gemms.end()) {
          timing->gemms.push_back(std::move(gemm));
        }
      }
      if (plan.empty()) plan = t.plan;
    }
    r0 += rows;
  }
  if (timing != nullptr) {
    timing->plan = absl::StrCat(plan, "; in ", blocks, " row blocks of ", block_rows);
  }
  return absl::OkStatus();
}

}  // namespace

std::int64_t CudaBackend::CrossEntropyBlockRows(const Weight& /*w*/, std::int64_t m) const {
  return std::min(m, kWalkBlockRows);
}

std::int64_t CudaBackend::LogProbsBlockRows(const Weight& /*w*/, std::int64_t m) const {
  return std::min(m, kWalkBlockRows);
}

// Without dW every row's outputs depend on its own row alone: the walk goes
// in row blocks (kWalkBlockRows). dW sums over every row: one walk.
absl::Status CudaBackend::CrossEntropyCall(const CrossEntropyArgs& args, Timing* timing) {
  auto* w = dynamic_cast<CudaWeight*>(args.weight);
  if (w == nullptr) return ForeignWeightError("cross entropy", "cuda", *args.weight);
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(lease,
                     absl::StrCat("cross_entropy(M=", args.m, ",V=", w->v(), ",K=", w->k(), ")"));
  Context& c = *lease;
  if (args.dw != nullptr || args.accumulate_dw) return CrossEntropyRows(c, *w, args, timing);
  return InRowBlocks("cross_entropy", args.m, CrossEntropyBlockRows(*w, args.m), timing,
                     [&](std::int64_t r0, std::int64_t rows, Timing* t) {
                       return CrossEntropyRows(c, *w, CrossEntropyRowsOf(args, w->k(), r0, rows),
                                               t);
                     });
}

absl::Status CudaBackend::CrossEntropyRows(Context& c, CudaWeight& w, const CrossEntropyArgs& args,
                                           Timing* timing) {
  const std::int64_t m = args.m;
  cudaStream_t cs = c.compute.get();

  // Accumulations into the weight's buffer go one at a time. The lock is
  // taken before any scratch, so that the buffer's first allocation is not
  // crowded out by this call's own workspace, and held until the call's work
  // has left the streams, on failure too.
  std::optional<GradientState<DeviceBuffer>::Lock> gradient;
  float* gradient_buffer = nullptr;
  if (args.accumulate_dw) {
    gradient.emplace(w.gradient().Acquire());
    absl::StatusOr<float*> buffer = GradientBuffer(*gradient, w, cs, "cross_entropy");
    if (!buffer.ok()) return buffer.status();
    gradient_buffer = *buffer;
  }

  // The walk and its chunk (see PlanCrossEntropy), a pure function of the
  // request and the configured memory, so the same request gets the same
  // chunk unless the device cannot hold it.
  CePlanRequest request;
  request.m = m;
  request.v = w.v();
  request.k = w.k();
  request.want_dx = args.dx != nullptr;
  request.dx_bf16 = request.want_dx && args.dx_dtype == DType::kBf16;
  request.want_dw = args.accumulate_dw || args.dw != nullptr;
  request.accumulate_dw = args.accumulate_dw;
  request.vocab_chunk = args.vocab_chunk;
  request.workspace_bytes = options_.ce_workspace_bytes;
  request.device_memory_budget = options_.device_memory_budget;
  CePlan plan = PlanCrossEntropy(request);
  CeScratchSet scratch;
  RETURN_IF_ERROR_(AllocateCrossEntropy(c, w, args, request, &plan, &scratch));

  CeProblem p;
  p.m = m;
  p.v = w.v();
  p.k = w.k();
  p.walk = plan.walk;
  p.chunk = plan.chunk;
  p.ignore_index = args.ignore_index;
  p.z_loss = args.z_loss;
  p.logit_softcap = args.logit_softcap;
  p.grad_scale = args.grad_scale;
  const StreamTimer timer(c, "cross_entropy");
  absl::Status status = EnqueueCrossEntropy(c, args, p, scratch, gradient_buffer, timer, timing);
  if (!status.ok()) {
    // Nothing of this call may still write the gradient once the lock goes.
    for (cudaStream_t stream : {cs, c.copy.get()}) {
      if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();
    }
    return status;
  }
  if (args.accumulate_dw) gradient->CountCall();
  if (timing != nullptr) {
    timer.Fill(timing);
    timing->plan = absl::StrCat(CeWalkName(plan.walk), " walk, chunk ", plan.chunk);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateLogProbs(Context& c, std::int64_t m, std::int64_t k, int top_k,
                                           std::int64_t chunk, LpBuffers* b) {
  const LpScratchSizes sizes = LpScratch(m, chunk, top_k);
  auto x = Scratch(c, kX, static_cast<std::size_t>(m * k) * 2, "log probs: device x");
  if (!x.ok()) return x.status();
  auto logits = Scratch(c, kY0, sizes.logits, "log probs: device logits chunk");
  if (!logits.ok()) return logits.status();
  auto rows = Scratch(c, kRows, sizes.rows, "log probs: device per-row state");
  if (!rows.ok()) return rows.status();
  b->x = *x;
  b->logits = static_cast<float*>(*logits);
  b->rows = *rows;
  b->lists = nullptr;
  if (sizes.lists > 0) {
    auto lists = Scratch(c, kG, sizes.lists, "log probs: device top-k lists");
    if (!lists.ok()) return lists.status();
    b->lists = *lists;
  }
  return absl::OkStatus();
}

namespace {

absl::Status CopyLogProbsHome(const LogProbsArgs& args, const LpRowsIo& io, cudaStream_t cs) {
  const auto home = [&](void* to, const void* from, std::size_t bytes,
                        const char* name) -> absl::Status {
    if (to == nullptr) return absl::OkStatus();
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, cs),
                         "log probs: copy ", name, " [", args.m, "] to the host");
    return absl::OkStatus();
  };
  const std::size_t rows = static_cast<std::size_t>(args.m);
  const std::size_t topk = rows * static_cast<std::size_t>(args.top_k);
  RETURN_IF_ERROR_(home(args.logprob, io.logprob, rows * 4, "logprob"));
  RETURN_IF_ERROR_(home(args.lse, io.lse, rows * 4, "lse"));
  RETURN_IF_ERROR_(home(args.entropy, io.entropy, rows * 4, "entropy"));
  RETURN_IF_ERROR_(home(args.rank, io.rank, rows * 8, "rank"));
  if (topk == 0) return absl::OkStatus();
  RETURN_IF_ERROR_(home(args.topk_ids, io.topk_ids, topk * 4, "topk_ids"));
  return home(args.topk_logprobs, io.topk_logprobs, topk * 4, "topk_logprobs");
}

}  // namespace

absl::Status CudaBackend::LogProbsCall(const LogProbsArgs& args, Timing* timing) {
  const auto* w = dynamic_cast<const CudaWeight*>(args.weight);
  if (w == nullptr) return ForeignWeightError("log probs", "cuda", *args.weight);
  RETURN_IF_ERROR_(UseDevice(options_.device));
  ACQUIRE_OR_RETURN_(lease,
                     absl::StrCat("log_probs(M=", args.m, ",V=", args.vocab, ",K=", w->k(), ")"));
  Context& c = *lease;
  const std::int64_t block_rows = LogProbsBlockRows(*w, args.m);
  const std::size_t row_bytes = static_cast<std::size_t>(w->k()) * 2;
  XPrefetch prefetch;
  const absl::Status status = InRowBlocks(
      "log_probs", args.m, block_rows, timing, [&](std::int64_t r0, std::int64_t rows, Timing* t) {
        const std::int64_t next = r0 + rows;
        prefetch.next = next < args.m ? args.x + next * w->k() : nullptr;
        prefetch.next_bytes =
            static_cast<std::size_t>(std::min(block_rows, args.m - next)) * row_bytes;
        return LogProbsRows(c, *w, LogProbsRowsOf(args, w->k(), r0, rows), t, &prefetch);
      });
  // A block that failed may leave the next one's upload queued: it reads
  // the caller's X, which must not outlive the call.
  if (cudaStreamSynchronize(c.copy.get()) != cudaSuccess && status.ok()) {
    RETURN_IF_CUDA_ERROR(cudaGetLastError(), "log_probs: the next row block's upload");
  }
  return status;
}

namespace {

// LogProbs' problem for RunLogProbs: the call's options and the outputs it
// asks for, over a walk of `chunk` columns at a time.
LpProblem LpProblemOf(const LogProbsArgs& args, std::int64_t k, std::int64_t chunk) {
  LpProblem p;
  p.m = args.m;
  p.v = args.vocab;
  p.k = k;
  p.chunk = chunk;
  p.has_targets = args.targets != nullptr;
  p.ignore_index = args.ignore_index;
  p.temperature = args.temperature;
  p.logit_softcap = args.logit_softcap;
  p.top_k = static_cast<int>(args.top_k);
  p.want_logprob = args.logprob != nullptr;
  p.want_rank = args.rank != nullptr;
  p.want_lse = args.lse != nullptr;
  p.want_entropy = args.entropy != nullptr;
  return p;
}

}  // namespace

absl::Status CudaBackend::LpBlockX(Context& c, XPrefetch* prefetch, void* staging, bool stage_next,
                                   const void* x, void* dst, std::int64_t m, std::int64_t k) {
  cudaStream_t cs = c.compute.get();
  const std::size_t x_bytes = static_cast<std::size_t>(m * k) * 2;
  if (prefetch != nullptr && prefetch->staged) {
    // Uploaded while the block before computed (block_copied[1]).
    prefetch->staged = false;
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(cs, c.block_copied[1].get(), 0),
                         "log probs: wait for x");
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, staging, x_bytes, cudaMemcpyDeviceToDevice, cs),
                         "log probs: x [", m, ", ", k, "] from its staging");
  } else {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, x, x_bytes, cudaMemcpyHostToDevice, cs),
                         "log probs: copy x [", m, ", ", k, "] to the device");
  }
  if (stage_next) {
    // The staging slot is free again from here on.
    RETURN_IF_CUDA_ERROR(cudaEventRecord(c.block_done[1].get(), cs), "log probs: stage x");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::LpStageNextX(Context& c, XPrefetch* prefetch, void* staging) {
  // The next block's X beside this block's walk, queued after it so that
  // a copy from pageable memory, which may hold this thread, holds no
  // kernel back.
  cudaStream_t copy = c.copy.get();
  RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(copy, c.block_done[1].get(), 0), "log probs: stage x");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(staging, prefetch->next, prefetch->next_bytes, cudaMemcpyHostToDevice, copy),
      "log probs: copy the next row block's x to the device");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(c.block_copied[1].get(), copy), "log probs: stage x");
  prefetch->staged = true;
  return absl::OkStatus();
}

absl::Status CudaBackend::LogProbsRows(Context& c, const CudaWeight& w, const LogProbsArgs& args,
                                       Timing* timing, XPrefetch* prefetch) {
  const std::int64_t m = args.m;
  const std::int64_t v = args.vocab;
  const std::int64_t k = w.k();
  const int top_k = static_cast<int>(args.top_k);
  cudaStream_t cs = c.compute.get();

  // The cross-entropy's chunk without gradients, so that the same request
  // walks the same GEMM shapes and lse and logprob are bitwise
  // CrossEntropy's; shrunk as it is when the device cannot hold the scratch.
  CePlanRequest request;
  request.m = m;
  request.v = v;
  request.k = k;
  request.vocab_chunk = args.vocab_chunk;
  request.workspace_bytes = options_.ce_workspace_bytes;
  request.device_memory_budget = options_.device_memory_budget;
  CePlan plan = PlanCrossEntropy(request);
  LpBuffers b;
  b.w = w.data();
  RETURN_IF_ERROR_(AllocateShrinking(c, request, &plan, {kX, kY0, kRows, kG}, [&]() {
    return AllocateLogProbs(c, m, k, top_k, plan.chunk, &b);
  }));

  const LpProblem p = LpProblemOf(args, k, plan.chunk);
  const LpRowsIo io = LpIo(b.rows, m, plan.chunk, top_k);
  const std::string shape = absl::StrCat("M=", m, ",V=", v, ",K=", k, ",chunk=", plan.chunk);
  const StreamTimer timer(c, "log_probs");
  // The staging slot: this block's X when the block before staged it, and
  // the next block's once this block has taken its own. Taken before
  // anything is queued, and grown only then (a slot that grows frees its
  // old memory); without it the next block uploads its own.
  void* staging = nullptr;
  if (prefetch != nullptr && prefetch->staged) {
    staging = c.scratch[kStaging].get();
    if (c.scratch[kStaging].size() < prefetch->next_bytes) prefetch->next = nullptr;
  } else if (prefetch != nullptr && prefetch->next != nullptr) {
    absl::StatusOr<void*> slot = Scratch(c, kStaging, prefetch->next_bytes, "log probs: next x");
    if (slot.ok()) staging = *slot;
  }
  const bool stage_next = staging != nullptr && prefetch->next != nullptr;
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kStart, cs));
  RETURN_IF_ERROR_(
      LpBlockX(c, prefetch, staging, stage_next, args.x, const_cast<void*>(b.x), m, k));
  if (args.targets != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(io.targets, args.targets, static_cast<std::size_t>(m) * 8,
                                         cudaMemcpyHostToDevice, cs),
                         "log probs: copy targets [", m, "] to the device");
  }
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kInputs, cs));
  RETURN_IF_ERROR_(RunLogProbs(engine_, c.gemm(GemmRecord(timing)), p, b));
  if (stage_next) RETURN_IF_ERROR_(LpStageNextX(c, prefetch, staging));
  RETURN_IF_ERROR_(timer.Record(StreamTimer::kComputed, cs));
  RETURN_IF_ERROR_(CopyLogProbsHome(args, io, cs));
  RETURN_IF_ERROR_(timer.End(cs, absl::StrCat("log_probs(", shape, ")")));
  // A failed kernel surfaces here if not before.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cs), "log_probs(", shape, ")");
  if (timing != nullptr) {
    timer.Fill(timing);
    timing->plan = absl::StrCat("vocabulary walk, chunk ", plan.chunk,
                                p.want_rank ? ", logits twice for the rank" : "");
  }
  return absl::OkStatus();
}

}  // namespace logitd::kernels::cuda

namespace logitd::kernels {

template <>
struct KernelOf<cuda::CudaBackend, LogProbsArgs> {
  static absl::Status Run(cuda::CudaBackend& backend, const LogProbsArgs& args, Timing* timing) {
    return backend.LogProbsCall(args, timing);
  }
};

template <>
struct KernelOf<cuda::CudaBackend, CrossEntropyArgs> {
  static absl::Status Run(cuda::CudaBackend& backend, const CrossEntropyArgs& args,
                          Timing* timing) {
    return backend.CrossEntropyCall(args, timing);
  }
};

using cuda::CudaBackend;
LOGITD_KERNEL(CudaBackend, LogProbsArgs);
LOGITD_KERNEL(CudaBackend, CrossEntropyArgs);

}  // namespace logitd::kernels
