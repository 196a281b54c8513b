#include "server/kernels/cuda/fp64_products.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/kernels/cuda/cast_kernels.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/judge_kernels.h"
#include "server/kernels/cuda/model_kernels.h"

namespace logitd::kernels::cuda {

absl::StatusOr<std::unique_ptr<CudaFp64Products>> CudaFp64Products::Create(
    const void* w, std::int64_t v, std::int64_t k, int device,
    const std::shared_ptr<DeviceMemory>& memory, std::string device_name) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device));
  std::unique_ptr<CudaFp64Products> e(
      new CudaFp64Products(v, k, device, memory, std::move(device_name)));
  absl::StatusOr<Stream> stream = CreateStream();
  if (!stream.ok()) return stream.status();
  e->stream_ = *std::move(stream);
  absl::StatusOr<Stream> copy_stream = CreateStream();
  if (!copy_stream.ok()) return copy_stream.status();
  e->copy_stream_ = *std::move(copy_stream);
  absl::StatusOr<Event> copied = CreateEvent(/*timing=*/false);
  if (!copied.ok()) return copied.status();
  e->copied_ = *std::move(copied);
  cublasHandle_t handle = nullptr;
  RETURN_IF_CUBLAS_ERROR(cublasCreate(&handle), "reference products: cublasCreate");
  e->handle_ = CublasHandle(handle);
  RETURN_IF_CUBLAS_ERROR(cublasSetStream(handle, e->stream_.get()),
                         "reference products: cublasSetStream");
  RETURN_IF_CUBLAS_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH),
                         "reference products: cublasSetMathMode");
  const std::int64_t n = v * k;
  const std::string what = absl::StrCat("reference products: weight [", v, ", ", k, "] as fp64");
  absl::StatusOr<DeviceBuffer> w64 = memory->Allocate(static_cast<std::size_t>(n) * 8, what);
  if (!w64.ok()) return w64.status();
  e->w_ = *std::move(w64);
  absl::StatusOr<DeviceBuffer> w64_abs =
      memory->Allocate(static_cast<std::size_t>(n) * 8, what + " magnitudes");
  if (!w64_abs.ok()) return w64_abs.status();
  e->w_abs_ = *std::move(w64_abs);
  absl::StatusOr<DeviceBuffer> flag = memory->Allocate(sizeof(unsigned int), what + " checked");
  if (!flag.ok()) return flag.status();
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(flag->get(), 0, sizeof(unsigned int), e->stream_.get()),
                       "reference products: widen the weight");
  RETURN_IF_CUDA_ERROR(
      LaunchWidenBf16(static_cast<const std::uint16_t*>(w), n, e->w_.as<double>(),
                      e->w_abs_.as<double>(), flag->as<unsigned int>(), e->stream_.get()),
      "reference products: widen the weight");
  unsigned int non_finite = 1;
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(&non_finite, flag->get(), sizeof non_finite,
                                       cudaMemcpyDeviceToHost, e->stream_.get()),
                       "reference products: widen the weight");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(e->stream_.get()),
                       "reference products: widen the weight");
  e->weight_finite_ = non_finite == 0;
  return e;
}

std::int64_t CudaFp64Products::JudgeBlockRows(std::int64_t cols) const {
  // kJudgeBlockElements doubles a product (256 MiB; twice that with the
  // magnitudes), in whole 128-row tiles of the DGEMM where there are that
  // many.
  const std::int64_t rows =
      std::max<std::int64_t>(1, kJudgeBlockElements / std::max<std::int64_t>(1, cols));
  return rows >= 128 ? rows / 128 * 128 : rows;
}

absl::Status CudaFp64Products::Reserve(DeviceBuffer* buffer, std::size_t bytes, const char* what) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  buffer->Reset();
  absl::StatusOr<DeviceBuffer> b =
      memory_->Allocate(bytes, absl::StrCat("reference products: ", what));
  if (!b.ok()) return b.status();
  *buffer = *std::move(b);
  return absl::OkStatus();
}

absl::Status CudaFp64Products::ReservePinned(PinnedBuffer* buffer, std::size_t bytes) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  *buffer = PinnedBuffer();
  absl::StatusOr<PinnedBuffer> b = PinnedBuffer::Allocate(bytes, "reference products: staging");
  if (!b.ok()) return b.status();
  *buffer = *std::move(b);
  return absl::OkStatus();
}

namespace {

// memcpy on up to 8 threads for copies of 64 MiB and more.
void CopyOut(void* to, const void* from, std::size_t bytes) {
  constexpr std::size_t kPerThread = std::size_t{8} << 20;
  const std::size_t threads =
      std::min<std::size_t>({8, std::max(1u, std::thread::hardware_concurrency()),
                             std::max<std::size_t>(1, bytes / kPerThread)});
  if (threads <= 1) {
    std::memcpy(to, from, bytes);
    return;
  }
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const std::size_t a = bytes * t / threads, b = bytes * (t + 1) / threads;
      std::memcpy(static_cast<char*>(to) + a, static_cast<const char*>(from) + a, b - a);
    });
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace

absl::Status CudaFp64Products::FormOnDevice(bool transposed, const double* a, std::int64_t m,
                                            bool with_abs) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  const std::int64_t cols = transposed ? k_ : v_;
  const std::int64_t out_cols = transposed ? v_ : k_;
  const auto doubles = [](std::int64_t n) { return static_cast<std::size_t>(n) * 8; };
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&a_, doubles(m * cols), "operand"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&out_, doubles(m * out_cols), "product"));
  if (with_abs) {
    LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&a_abs_, doubles(m * cols), "operand magnitudes"));
    LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&out_abs_, doubles(m * out_cols), "product of magnitudes"));
  }
  cudaStream_t s = stream_.get();
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(a_.get(), a, doubles(m * cols), cudaMemcpyHostToDevice, s),
                       "reference products: copy the operand [", m, ", ", cols, "]");
  // Row-major out [m, out_cols] is column-major [out_cols, m]: W's
  // column-major view is [K, V] with leading dimension K, so out = a·Wᵀ is
  // Wᵀ(col)·a(col) and out = a·W is W(col)·a(col).
  const double one = 1.0, zero = 0.0;
  const auto gemm = [&](const double* w, const double* op, double* c) {
    return transposed ? cublasDgemm_64(handle_.get(), CUBLAS_OP_T, CUBLAS_OP_N, v_, m, k_, &one, w,
                                       k_, op, k_, &zero, c, v_)
                      : cublasDgemm_64(handle_.get(), CUBLAS_OP_N, CUBLAS_OP_N, k_, m, v_, &one, w,
                                       k_, op, v_, &zero, c, k_);
  };
  RETURN_IF_CUBLAS_ERROR(gemm(w_.as<double>(), a_.as<double>(), out_.as<double>()),
                         "reference products: DGEMM [", m, ", ", out_cols, "]");
  if (with_abs) {
    RETURN_IF_CUDA_ERROR(LaunchAbsDouble(a_.as<double>(), m * cols, a_abs_.as<double>(), s),
                         "reference products: magnitudes");
    RETURN_IF_CUBLAS_ERROR(gemm(w_abs_.as<double>(), a_abs_.as<double>(), out_abs_.as<double>()),
                           "reference products: DGEMM of magnitudes [", m, ", ", out_cols, "]");
  }
  return absl::OkStatus();
}

absl::Status CudaFp64Products::Product(bool transposed, const double* a, std::int64_t m,
                                       double* out, double* out_abs) {
  LOGITD_CUDA_RETURN_IF_ERROR(FormOnDevice(transposed, a, m, out_abs != nullptr));
  cudaStream_t s = stream_.get();
  const std::size_t out_bytes = static_cast<std::size_t>(m * (transposed ? v_ : k_)) * 8;
  LOGITD_CUDA_RETURN_IF_ERROR(ReservePinned(&host_out_, out_bytes));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host_out_.get(), out_.get(), out_bytes, cudaMemcpyDeviceToHost, s),
      "reference products: copy the product to the host");
  if (out_abs != nullptr) {
    LOGITD_CUDA_RETURN_IF_ERROR(ReservePinned(&host_out_abs_, out_bytes));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(host_out_abs_.get(), out_abs_.get(), out_bytes, cudaMemcpyDeviceToHost, s),
        "reference products: copy the product of magnitudes to the host");
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "reference products: DGEMM");
  CopyOut(out, host_out_.get(), out_bytes);
  if (out_abs != nullptr) CopyOut(out_abs, host_out_abs_.get(), out_bytes);
  return absl::OkStatus();
}

// Where Judge's counts land on the host (host_counts_): the counts, the
// elements outside per row, the collected elements and their count, and
// the rows' class counts, one after the other.
struct CudaFp64Products::JudgeLayout {
  JudgeLayout(std::int64_t m, std::int64_t cols)
      : capacity(static_cast<std::size_t>(cols) + CandidateCheck::kReportedOutside + 1),
        rows_bytes(static_cast<std::size_t>(m) * sizeof(unsigned int)),
        collected_bytes(capacity * sizeof(JudgedElement)),
        class_bytes(static_cast<std::size_t>(m) * sizeof(judgement::ClassRow)),
        rows_at(sizeof(JudgeCounts)),
        collected_at((rows_at + rows_bytes + 63) / 64 * 64),
        count_at(collected_at + collected_bytes),
        class_at((count_at + sizeof(unsigned int) + 63) / 64 * 64) {}
  // Room for every element of the rows that hold the first
  // kReportedOutside outside ones: fewer than that before the last of those
  // rows, at most a row in it, and the first outside the proven bound.
  std::size_t capacity;
  std::size_t rows_bytes, collected_bytes, class_bytes;
  std::size_t rows_at, collected_at, count_at, class_at;
};

namespace {

double DoubleOfBits(unsigned long long bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

// The figures of a block of `elements` from its counts on the device.
void FiguresOfCounts(const JudgeCounts& c, std::int64_t elements, CheckFigures* figures) {
  *figures = CheckFigures();
  figures->elements = elements;
  figures->outside = static_cast<std::int64_t>(c.outside);
  figures->worst_fraction = DoubleOfBits(c.worst_fraction_bits);
  figures->outside_probabilistic = static_cast<std::int64_t>(c.outside_probabilistic);
  figures->worst_probabilistic_fraction = DoubleOfBits(c.worst_probabilistic_fraction_bits);
  figures->own_outside_probabilistic = static_cast<std::int64_t>(c.own_outside_probabilistic);
  figures->bitwise_equal = static_cast<std::int64_t>(c.bitwise_equal);
  figures->nan_inf_mismatches = static_cast<std::int64_t>(c.nan_inf_mismatches);
  figures->max_ulp = static_cast<std::int64_t>(c.max_ulp);
  for (std::size_t b = 0; b < figures->histogram.size(); ++b) {
    figures->histogram[b] = static_cast<std::int64_t>(c.histogram[b]);
  }
  for (std::size_t b = 0; b < figures->ulp_counts.size(); ++b) {
    figures->ulp_counts[b] = static_cast<std::int64_t>(c.ulp[b]);
    figures->ulp_exact_counts[b] = static_cast<std::int64_t>(c.ulp_exact[b]);
  }
  figures->ulp_exact_elements = elements;
  figures->max_ulp_exact = static_cast<std::int64_t>(c.max_ulp_exact);
}

// Each row's class counts under the call's row index, its largest
// element's position turned into the call's flat index.
void AddClassRows(const judgement::ClassRow* class_rows, const std::int64_t* rows, std::int64_t m,
                  std::int64_t cols, CheckFigures* figures) {
  for (std::int64_t r = 0; r < m; ++r) {
    judgement::ClassRow row = class_rows[r];
    if (row.n == 0) continue;
    row.top1_index = rows[r] * cols + row.top1_index % cols;
    judgement::MergeRows(&figures->class_rows[rows[r]], row);
  }
}

// The collected elements in the call's flat indices: the first
// kReportedOutside outside either bound, and the first outside the proven
// one. False when that one was to be found and was not.
bool AddCollected(std::vector<JudgedElement> found, const std::int64_t* rows, std::int64_t cols,
                  bool proven_wanted, CheckFigures* figures) {
  std::sort(found.begin(), found.end(),
            [](const JudgedElement& a, const JudgedElement& b) { return a.position < b.position; });
  bool proven_found = false;
  for (const JudgedElement& e : found) {
    const std::int64_t row = e.position / cols, col = e.position % cols;
    CheckedElement element{rows[row] * cols + col, e.candidate, e.reference, e.bound,
                           e.probabilistic_bound,  e.own};
    element.outside_bound = e.fraction > 1.0;
    if (e.fraction > 1.0 && !proven_found) {
      figures->first_proven_outside = element;
      proven_found = true;
    }
    if (e.probabilistic_fraction > 1.0 &&
        figures->first_outside.size() <
            static_cast<std::size_t>(CandidateCheck::kReportedOutside)) {
      figures->first_outside.push_back(element);
    }
  }
  return proven_found || !proven_wanted;
}

}  // namespace

absl::Status CudaFp64Products::CopyRows(const std::int64_t* rows, std::int64_t m,
                                        std::size_t row_bytes, const void* candidate,
                                        const void* own) {
  const std::size_t block_bytes = static_cast<std::size_t>(m) * row_bytes;
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&candidate_, block_bytes, "the candidate's rows"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&own_, block_bytes, "logitd's own rows"));
  // Runs of consecutive rows in one copy each, on their own stream while
  // the DGEMMs run.
  cudaStream_t copy = copy_stream_.get();
  for (std::int64_t r0 = 0; r0 < m;) {
    std::int64_t r1 = r0 + 1;
    while (r1 < m && rows[r1] == rows[r1 - 1] + 1) ++r1;
    const std::size_t at = static_cast<std::size_t>(r0) * row_bytes;
    const std::size_t from = static_cast<std::size_t>(rows[r0]) * row_bytes;
    const std::size_t bytes = static_cast<std::size_t>(r1 - r0) * row_bytes;
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(candidate_.as<std::byte>() + at,
                                         static_cast<const std::byte*>(candidate) + from, bytes,
                                         cudaMemcpyHostToDevice, copy),
                         "verify: copy the candidate's rows to the device");
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(own_.as<std::byte>() + at, static_cast<const std::byte*>(own) + from, bytes,
                        cudaMemcpyHostToDevice, copy),
        "verify: copy logitd's own rows to the device");
    r0 = r1;
  }
  RETURN_IF_CUDA_ERROR(cudaEventRecord(copied_.get(), copy), "verify: copy the rows");
  return absl::OkStatus();
}

absl::Status CudaFp64Products::CountOnDevice(const JudgeLayout& at, std::int64_t m,
                                             std::int64_t cols,
                                             const judgement::ProductRule& rule) {
  cudaStream_t s = stream_.get();
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&class_rows_, at.class_bytes, "the rows' class counts"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&counts_, sizeof(JudgeCounts), "the counts"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&row_outside_, at.rows_bytes, "outside elements per row"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&collected_, at.collected_bytes, "outside elements"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&collected_count_, sizeof(unsigned int), "their count"));
  LOGITD_CUDA_RETURN_IF_ERROR(ReservePinned(&host_counts_, at.class_at + at.class_bytes));
  std::byte* host = static_cast<std::byte*>(host_counts_.get());
  RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s, copied_.get(), 0), "verify: copy the rows");
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(counts_.get(), 0, sizeof(JudgeCounts), s),
                       "verify: clear the counts");
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(row_outside_.get(), 0, at.rows_bytes, s),
                       "verify: clear the counts");
  RETURN_IF_CUDA_ERROR(
      LaunchJudge(out_.as<double>(), out_abs_.as<double>(), candidate_.get(), own_.get(), m, cols,
                  rule, counts_.as<JudgeCounts>(), row_outside_.as<unsigned int>(), s),
      "verify: judge the elements");
  RETURN_IF_CUDA_ERROR(LaunchClassRows(out_.as<double>(), out_abs_.as<double>(), candidate_.get(),
                                       own_.get(), seq_.as<float>(), tc_.as<double>(), m, cols,
                                       rule, class_rows_.as<judgement::ClassRow>(), s),
                       "verify: the rows' precision-class counts");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host, counts_.get(), sizeof(JudgeCounts), cudaMemcpyDeviceToHost, s),
      "verify: copy the counts to the host");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + at.class_at, class_rows_.get(), at.class_bytes,
                                       cudaMemcpyDeviceToHost, s),
                       "verify: copy the rows' precision-class counts to the host");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + at.rows_at, row_outside_.get(), at.rows_bytes,
                                       cudaMemcpyDeviceToHost, s),
                       "verify: copy the counts to the host");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "verify: judge the elements");
  return absl::OkStatus();
}

absl::Status CudaFp64Products::CollectOutside(const JudgeLayout& at, const JudgeCounts& c,
                                              const std::int64_t* rows, std::int64_t m,
                                              std::int64_t cols, const judgement::ProductRule& rule,
                                              CheckFigures* figures) {
  cudaStream_t s = stream_.get();
  std::byte* host = static_cast<std::byte*>(host_counts_.get());
  // The rows up to the one where the kReportedOutside-th outside element
  // lies, collected whole; and the first outside the proven bound when it
  // lies past them.
  const auto* per_row = reinterpret_cast<const unsigned int*>(host + at.rows_at);
  std::int64_t last_row = m - 1;
  std::uint64_t seen = 0;
  for (std::int64_t r = 0; r < m; ++r) {
    seen += per_row[r];
    if (seen >= static_cast<std::uint64_t>(CandidateCheck::kReportedOutside)) {
      last_row = r;
      break;
    }
  }
  const std::int64_t prefix_end = (last_row + 1) * cols;
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(collected_count_.get(), 0, sizeof(unsigned int), s),
                       "verify: clear the counts");
  const auto collect = [&](std::int64_t first, std::int64_t last) {
    return LaunchCollectOutside(out_.as<double>(), out_abs_.as<double>(), candidate_.get(),
                                own_.get(), first, last, rule, collected_.as<JudgedElement>(),
                                collected_count_.as<unsigned int>(),
                                static_cast<unsigned int>(at.capacity), s);
  };
  RETURN_IF_CUDA_ERROR(collect(0, prefix_end), "verify: collect the outside elements");
  const std::int64_t first_proven = static_cast<std::int64_t>(~c.first_proven_complement);
  if (c.outside > 0 && first_proven >= prefix_end) {
    RETURN_IF_CUDA_ERROR(collect(first_proven, first_proven + 1),
                         "verify: collect the outside elements");
  }
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + at.count_at, collected_count_.get(),
                                       sizeof(unsigned int), cudaMemcpyDeviceToHost, s),
                       "verify: copy the outside elements to the host");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + at.collected_at, collected_.get(), at.collected_bytes,
                                       cudaMemcpyDeviceToHost, s),
                       "verify: copy the outside elements to the host");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "verify: collect the outside elements");
  unsigned int count = 0;
  std::memcpy(&count, host + at.count_at, sizeof count);
  if (count > at.capacity) {
    return absl::InternalError(absl::StrCat(
        "verify: ", count, " outside elements collected, more than the room for ", at.capacity));
  }
  std::vector<JudgedElement> found(count);
  std::memcpy(found.data(), host + at.collected_at, count * sizeof(JudgedElement));
  if (!AddCollected(std::move(found), rows, cols, c.outside > 0, figures)) {
    return absl::InternalError("verify: the first element outside its proven bound was not found");
  }
  return absl::OkStatus();
}

absl::Status CudaFp64Products::Judge(std::int64_t cols, const std::function<absl::Status()>& form,
                                     const ModelOperands& model, const std::int64_t* rows,
                                     std::int64_t m, const void* candidate, const void* own,
                                     const judgement::ProductRule& rule, CheckFigures* figures) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * (rule.bf16 ? 2 : 4);
  LOGITD_CUDA_RETURN_IF_ERROR(CopyRows(rows, m, row_bytes, candidate, own));
  LOGITD_CUDA_RETURN_IF_ERROR(form());
  // The models, from the operands `form` left on the device.
  LOGITD_CUDA_RETURN_IF_ERROR(Models(model, m, cols));
  const JudgeLayout at(m, cols);
  LOGITD_CUDA_RETURN_IF_ERROR(CountOnDevice(at, m, cols, rule));
  const std::byte* host = static_cast<const std::byte*>(host_counts_.get());
  JudgeCounts c;
  std::memcpy(&c, host, sizeof c);
  FiguresOfCounts(c, m * cols, figures);
  AddClassRows(reinterpret_cast<const judgement::ClassRow*>(host + at.class_at), rows, m, cols,
               figures);
  if (c.outside == 0 && c.outside_probabilistic == 0) return absl::OkStatus();
  return CollectOutside(at, c, rows, m, cols, rule, figures);
}

absl::Status CudaFp64Products::NonFinite(bool* seen) {
  cudaStream_t s = stream_.get();
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host_flag_.get(), non_finite_.get(), sizeof(unsigned int),
                                       cudaMemcpyDeviceToHost, s),
                       "verify: copy the operands' finiteness to the host");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "verify: widen the operands");
  unsigned int flag = 0;
  std::memcpy(&flag, host_flag_.get(), sizeof flag);
  *seen = flag != 0;
  return absl::OkStatus();
}

absl::Status CudaFp64Products::ReserveGBlock(std::size_t staging_bytes, std::int64_t g_elements,
                                             std::int64_t out_elements) {
  const auto doubles = [](std::int64_t n) { return static_cast<std::size_t>(n) * 8; };
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&staging_, staging_bytes, "the operands as sent"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&a_, doubles(g_elements), "G as fp64"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&a_abs_, doubles(g_elements), "G's magnitudes"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&out_, doubles(out_elements), "product"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&out_abs_, doubles(out_elements), "product of magnitudes"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&non_finite_, sizeof(unsigned int), "finiteness"));
  return ReservePinned(&host_flag_, sizeof(unsigned int));
}

absl::Status CudaFp64Products::RoundG(bool dy_bf16, std::int64_t n, bool* non_finite) {
  cudaStream_t s = stream_.get();
  RETURN_IF_CUDA_ERROR(
      dy_bf16 ? LaunchWidenBf16(staging_.as<std::uint16_t>(), n, a_.as<double>(),
                                a_abs_.as<double>(), non_finite_.as<unsigned int>(), s)
              : LaunchRoundWidenFp32(staging_.as<float>(), n, a_.as<double>(), a_abs_.as<double>(),
                                     non_finite_.as<unsigned int>(), s),
      "verify: G = bf16(dY)");
  LOGITD_CUDA_RETURN_IF_ERROR(NonFinite(non_finite));
  if (*non_finite) return absl::AbortedError("verify: G has a NaN or an infinity");
  return absl::OkStatus();
}

absl::Status CudaFp64Products::Dgemms(cublasOperation_t ta, cublasOperation_t tb, std::int64_t rows,
                                      std::int64_t cols, std::int64_t depth, const DeviceBuffer& a,
                                      const DeviceBuffer& a_abs, std::int64_t lda,
                                      const DeviceBuffer& b, const DeviceBuffer& b_abs,
                                      std::int64_t ldb, const std::string& what) {
  const double one = 1.0, zero = 0.0;
  RETURN_IF_CUBLAS_ERROR(
      cublasDgemm_64(handle_.get(), ta, tb, rows, cols, depth, &one, a.as<double>(), lda,
                     b.as<double>(), ldb, &zero, out_.as<double>(), rows),
      "reference products: DGEMM ", what);
  RETURN_IF_CUBLAS_ERROR(
      cublasDgemm_64(handle_.get(), ta, tb, rows, cols, depth, &one, a_abs.as<double>(), lda,
                     b_abs.as<double>(), ldb, &zero, out_abs_.as<double>(), rows),
      "reference products: DGEMM of magnitudes ", what);
  return absl::OkStatus();
}

absl::Status CudaFp64Products::GtX(const void* dy, bool dy_bf16, const Bf16Bits* x, std::int64_t m,
                                   const void* candidate, const void* own,
                                   const judgement::ProductRule& rule, CandidateCheck* check,
                                   const std::function<bool()>& stop, bool* judged) {
  *judged = false;
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  cudaStream_t s = stream_.get();
  const auto doubles = [](std::int64_t n) { return static_cast<std::size_t>(n) * 8; };
  // Rows of dW a block: its product [block, K] and G's columns [m, block]
  // within kJudgeBlockElements each.
  const std::int64_t block = std::min(v_, JudgeBlockRows(std::max(m, k_)));
  const std::size_t dy_size = dy_bf16 ? 2 : 4;
  const std::size_t staging =
      std::max(static_cast<std::size_t>(m * k_) * 2, static_cast<std::size_t>(m * block) * dy_size);
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&x_, doubles(m * k_), "X as fp64"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&x_abs_, doubles(m * k_), "X's magnitudes"));
  LOGITD_CUDA_RETURN_IF_ERROR(ReserveGBlock(staging, m * block, block * k_));
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(non_finite_.get(), 0, sizeof(unsigned int), s),
                       "verify: widen X");
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(staging_.get(), x, static_cast<std::size_t>(m * k_) * 2,
                                       cudaMemcpyHostToDevice, s),
                       "verify: copy X [", m, ", ", k_, "] to the device");
  RETURN_IF_CUDA_ERROR(LaunchWidenBf16(staging_.as<std::uint16_t>(), m * k_, x_.as<double>(),
                                       x_abs_.as<double>(), non_finite_.as<unsigned int>(), s),
                       "verify: widen X");
  bool non_finite = false;
  LOGITD_CUDA_RETURN_IF_ERROR(NonFinite(&non_finite));
  if (non_finite) return absl::OkStatus();

  std::vector<std::int64_t> rows(static_cast<std::size_t>(block));
  for (std::int64_t j0 = 0; j0 < v_; j0 += block) {
    if (stop && stop()) return absl::OkStatus();
    const std::int64_t n = std::min(block, v_ - j0);
    for (std::int64_t r = 0; r < n; ++r) rows[static_cast<std::size_t>(r)] = j0 + r;
    // G's columns [j0, j0 + n) of every row, rounded and widened; their
    // finiteness known before the products. Row-major dW [n, K] is
    // column-major [K, n] = Xᵀ·G_cols: X's column-major view is [K, m]
    // (leading dimension K), G_cols' is [n, m] (leading dimension n), taken
    // transposed.
    const auto form = [&]() -> absl::Status {
      RETURN_IF_CUDA_ERROR(
          cudaMemcpy2DAsync(
              staging_.get(), static_cast<std::size_t>(n) * dy_size,
              static_cast<const std::byte*>(dy) + static_cast<std::size_t>(j0) * dy_size,
              static_cast<std::size_t>(v_) * dy_size, static_cast<std::size_t>(n) * dy_size,
              static_cast<std::size_t>(m), cudaMemcpyHostToDevice, s),
          "verify: copy dY's columns [", j0, ", ", j0 + n, ") to the device");
      LOGITD_CUDA_RETURN_IF_ERROR(RoundG(dy_bf16, m * n, &non_finite));
      return Dgemms(CUBLAS_OP_N, CUBLAS_OP_T, k_, n, m, x_, x_abs_, k_, a_, a_abs_, n,
                    absl::StrCat("[", n, ", ", k_, "] of dW"));
    };
    // dW's row jj sums G[i, j0 + jj]·X[i, c] over the rows i of M.
    const ModelOperands model{&a_, 1, n, &x_, k_, 1, m};
    CheckFigures figures;
    const absl::Status status =
        Judge(k_, form, model, rows.data(), n, candidate, own, rule, &figures);
    if (non_finite) return absl::OkStatus();
    LOGITD_CUDA_RETURN_IF_ERROR(status);
    check->AddCounted(figures);
  }
  *judged = true;
  return absl::OkStatus();
}

absl::Status CudaFp64Products::GWOfDy(const void* dy, bool dy_bf16, const std::int64_t* rows,
                                      std::int64_t m, const void* candidate, const void* own,
                                      const judgement::ProductRule& rule, CheckFigures* figures,
                                      bool* judged) {
  *judged = false;
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  cudaStream_t s = stream_.get();
  const std::size_t dy_size = dy_bf16 ? 2 : 4;
  const std::size_t row_bytes = static_cast<std::size_t>(v_) * dy_size;
  LOGITD_CUDA_RETURN_IF_ERROR(
      ReserveGBlock(static_cast<std::size_t>(m) * row_bytes, m * v_, m * k_));
  bool non_finite = false;
  // dY's rows (runs of consecutive ones in one copy each) rounded to G and
  // widened, their finiteness known before the products. Row-major
  // dX [m, K] is column-major [K, m] = W(col)·G(col): W's column-major view
  // is [K, V] (leading dimension K), G's is [V, m] (leading dimension V).
  const auto form = [&]() -> absl::Status {
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(non_finite_.get(), 0, sizeof(unsigned int), s),
                         "verify: G = bf16(dY)");
    for (std::int64_t r0 = 0; r0 < m;) {
      std::int64_t r1 = r0 + 1;
      while (r1 < m && rows[r1] == rows[r1 - 1] + 1) ++r1;
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(
              staging_.as<std::byte>() + static_cast<std::size_t>(r0) * row_bytes,
              static_cast<const std::byte*>(dy) + static_cast<std::size_t>(rows[r0]) * row_bytes,
              static_cast<std::size_t>(r1 - r0) * row_bytes, cudaMemcpyHostToDevice, s),
          "verify: copy dY's rows to the device");
      r0 = r1;
    }
    LOGITD_CUDA_RETURN_IF_ERROR(RoundG(dy_bf16, m * v_, &non_finite));
    return Dgemms(CUBLAS_OP_N, CUBLAS_OP_N, k_, m, v_, w_, w_abs_, k_, a_, a_abs_, v_,
                  absl::StrCat("[", m, ", ", k_, "] of dX"));
  };
  const absl::Status status = Judge(k_, form, ModelOperands{&a_, v_, 1, &w_, k_, 1, v_}, rows, m,
                                    candidate, own, rule, figures);
  if (non_finite) return absl::OkStatus();
  LOGITD_CUDA_RETURN_IF_ERROR(status);
  *judged = true;
  return absl::OkStatus();
}

absl::Status CudaFp64Products::Models(const ModelOperands& model, std::int64_t m,
                                      std::int64_t cols) {
  cudaStream_t s = stream_.get();
  const std::size_t elements = static_cast<std::size_t>(m) * static_cast<std::size_t>(cols);
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&seq_, elements * sizeof(float), "the sequential model"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&tc_, elements * sizeof(double), "the tensor-core model"));
  const ModelPanelShape shape = ModelPanelShapeOf(m, cols, model.n);
  LOGITD_CUDA_RETURN_IF_ERROR(
      Reserve(&a_panel_, shape.a_floats() * sizeof(float), "the models' panel of A"));
  RETURN_IF_CUDA_ERROR(
      LaunchPackModelPanel(model.a->as<double>(), model.sa_i, model.sa_t, m, model.n, shape.rows,
                           shape.terms, a_panel_.as<float>(), s),
      "verify: the models' panel of A [", m, ", ", model.n, "]");
  // W's panel stays for the next block of the same product; another
  // operand's (dW's X) is packed each time.
  const std::array<std::int64_t, 4> layout = {model.sb_t, model.sb_j, cols, model.n};
  if (model.b != &w_ || weight_panel_ != layout) {
    weight_panel_ = {0, 0, 0, 0};
    LOGITD_CUDA_RETURN_IF_ERROR(
        Reserve(&b_panel_, shape.b_floats() * sizeof(float), "the models' panel of B"));
    RETURN_IF_CUDA_ERROR(
        LaunchPackModelPanel(model.b->as<double>(), model.sb_j, model.sb_t, cols, model.n,
                             shape.cols, shape.terms, b_panel_.as<float>(), s),
        "verify: the models' panel of B [", model.n, ", ", cols, "]");
    if (model.b == &w_) weight_panel_ = layout;
  }
  RETURN_IF_CUDA_ERROR(LaunchModelSums(a_panel_.as<float>(), b_panel_.as<float>(), shape, m, cols,
                                       model.n, seq_.as<float>(), tc_.as<double>(), s),
                       "verify: the precision-class models [", m, ", ", cols, "] of ", model.n,
                       " terms");
  return absl::OkStatus();
}

bool CudaFp64Products::AfterCopies(const absl::Status& status, bool judged, const char* what) {
  // No copy of the caller's memory may outlive the call, whatever ended it.
  const cudaError_t copies = cudaStreamSynchronize(copy_stream_.get());
  if (!Done(status)) return false;
  if (copies != cudaSuccess) {
    return Done(absl::InternalError(
        absl::StrCat("verify: copy the rows of ", what, ": ", cudaGetErrorString(copies))));
  }
  return judged;
}

bool CudaFp64Products::Done(const absl::Status& status) {
  if (!status.ok() && error_.empty()) error_ = std::string(status.message());
  return status.ok();
}

bool CudaFp64Products::XWt(const double* x, std::int64_t m, double* y, double* y_abs) {
  absl::MutexLock lock(&mu_);
  return Done(Product(/*transposed=*/true, x, m, y, y_abs));
}

bool CudaFp64Products::GW(const double* g, std::int64_t m, double* dx, double* dx_abs) {
  absl::MutexLock lock(&mu_);
  return Done(Product(/*transposed=*/false, g, m, dx, dx_abs));
}

bool CudaFp64Products::JudgeXWt(const double* x, const std::int64_t* rows, std::int64_t m,
                                const void* candidate, const void* own,
                                const judgement::ProductRule& rule, CheckFigures* figures) {
  absl::MutexLock lock(&mu_);
  return Done(Judge(
      v_, [&] { return FormOnDevice(/*transposed=*/true, x, m, /*with_abs=*/true); },
      ModelOperands{&a_, k_, 1, &w_, 1, k_, k_}, rows, m, candidate, own, rule, figures));
}

bool CudaFp64Products::JudgeGW(const double* g, const std::int64_t* rows, std::int64_t m,
                               const void* candidate, const void* own,
                               const judgement::ProductRule& rule, CheckFigures* figures) {
  absl::MutexLock lock(&mu_);
  return Done(Judge(
      k_, [&] { return FormOnDevice(/*transposed=*/false, g, m, /*with_abs=*/true); },
      ModelOperands{&a_, v_, 1, &w_, k_, 1, v_}, rows, m, candidate, own, rule, figures));
}

bool CudaFp64Products::JudgeGWOfDy(const void* dy, bool dy_bf16, const std::int64_t* rows,
                                   std::int64_t m, const void* candidate, const void* own,
                                   const judgement::ProductRule& rule, CheckFigures* figures) {
  absl::MutexLock lock(&mu_);
  bool judged = false;
  const absl::Status status = GWOfDy(dy, dy_bf16, rows, m, candidate, own, rule, figures, &judged);
  return AfterCopies(status, judged, "dX");
}

bool CudaFp64Products::JudgeGtX(const void* dy, bool dy_bf16, const Bf16Bits* x, std::int64_t m,
                                const void* candidate, const void* own,
                                const judgement::ProductRule& rule, CandidateCheck* check,
                                const std::function<bool()>& stop) {
  absl::MutexLock lock(&mu_);
  bool judged = false;
  const absl::Status status = GtX(dy, dy_bf16, x, m, candidate, own, rule, check, stop, &judged);
  return AfterCopies(status, judged, "dW");
}

std::string CudaFp64Products::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

}  // namespace logitd::kernels::cuda
