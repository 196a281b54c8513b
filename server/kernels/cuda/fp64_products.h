// The references' fp64 products on the device (logitd/reference/
// fp64_products.h): cuBLAS DGEMM of the weight widened to fp64 once per
// engine, with the operands' magnitudes for the Σ|x·w| sums. The math mode
// is set to CUBLAS_DEFAULT_MATH explicitly, so no environment variable can
// turn on cuBLAS's fixed-point emulation of fp64: the sums are fp64 sums of
// exact products in some order, which is all the bounds assume.
#pragma once

#include <cublas_v2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "logitd/reference/fp64_products.h"
#include "server/kernels/cuda/cuda_handles.h"

namespace logitd::kernels::cuda {

struct JudgeCounts;     // judge_kernels.h
struct RowClassModels;  // judge_kernels.h

using CublasHandle = UniqueHandle<cublasHandle_t, &cublasDestroy>;

class CudaFp64Products final : public Fp64Products {
 public:
  // W [v, k] bf16 on `device` (a registered weight's memory, which the
  // caller keeps alive while the engine lives), widened into device memory
  // counted by `memory`: ResourceExhausted naming the bytes when it cannot
  // hold 16·V·K of them.
  static absl::StatusOr<std::unique_ptr<CudaFp64Products>> Create(
      const void* w, std::int64_t v, std::int64_t k, int device,
      const std::shared_ptr<DeviceMemory>& memory, std::string device_name);

  bool XWt(const double* x, std::int64_t m, double* y, double* y_abs) override;
  bool GW(const double* g, std::int64_t m, double* dx, double* dx_abs) override;
  bool JudgeXWt(const double* x, const std::int64_t* rows, std::int64_t m, const void* candidate,
                const void* own, const judgement::ProductRule& rule,
                CheckFigures* figures) override;
  bool JudgeGW(const double* g, const std::int64_t* rows, std::int64_t m, const void* candidate,
               const void* own, const judgement::ProductRule& rule, CheckFigures* figures) override;
  bool JudgeGWOfDy(const void* dy, bool dy_bf16, const std::int64_t* rows, std::int64_t m,
                   const void* candidate, const void* own, const judgement::ProductRule& rule,
                   CheckFigures* figures) override;
  bool JudgeGtX(const void* dy, bool dy_bf16, const Bf16Bits* x, std::int64_t m,
                const void* candidate, const void* own, const judgement::ProductRule& rule,
                CandidateCheck* check, const std::function<bool()>& stop) override;
  bool CeRowSums(const double* x, std::int64_t m, const std::int64_t* targets, double gamma,
                 double absolute, double cap, const std::uint8_t* class_rows,
                 judgement::CeRowSums* sums) override;
  bool LpRowSums(const double* x, std::int64_t m, const LpRowsRequest& request,
                 const LpRowsResult& result) override;
  std::int64_t JudgeBlockRows(std::int64_t cols) const override;
  bool WeightFinite() const override { return weight_finite_; }
  std::string error() const override;
  std::string name() const override { return "cuBLAS DGEMM on " + device_name_; }

 private:
  CudaFp64Products(std::int64_t v, std::int64_t k, int device, std::shared_ptr<DeviceMemory> memory,
                   std::string device_name)
      : v_(v),
        k_(k),
        device_(device),
        memory_(std::move(memory)),
        device_name_(std::move(device_name)) {}
  // a [m, cols] to the device, out_ = a·Wᵀ (transposed: cols = K, out
  // [m, V]) or a·W (cols = V, out [m, K]), and when with_abs the same of
  // the magnitudes into out_abs_, queued on stream_.
  absl::Status FormOnDevice(bool transposed, const double* a, std::int64_t m, bool with_abs);
  // FormOnDevice, then both products to the host.
  absl::Status Product(bool transposed, const double* a, std::int64_t m, double* out,
                       double* out_abs);
  // The operands of a block's products for the precision-class test's
  // models (judge_kernels.h, LaunchModelSums): A(i, t) = a[i·sa_i + t·sa_t],
  // B(t, j) = b[t·sb_t + j·sb_j], n terms.
  struct ModelOperands {
    const DeviceBuffer* a = nullptr;
    std::int64_t sa_i = 0, sa_t = 0;
    const DeviceBuffer* b = nullptr;
    std::int64_t sb_t = 0, sb_j = 0;
    std::int64_t n = 0;
  };
  // seq_ and tc_ [m, cols]: the models of `model`'s operands (model_kernels.h),
  // queued on stream_. Each operand packed into its panel first; W's
  // panel is kept for the next block while its layout is the same.
  absl::Status Models(const ModelOperands& model, std::int64_t m, std::int64_t cols);
  // The candidate's and logitd's rows to the device, `form` (which queues
  // the block's products [m, cols] into out_ and out_abs_ on stream_), the
  // models of `model`'s operands, and the judgement of every element there
  // with each row's counts of the precision-class test (judge_kernels.h).
  absl::Status Judge(std::int64_t cols, const std::function<absl::Status()>& form,
                     const ModelOperands& model, const std::int64_t* rows, std::int64_t m,
                     const void* candidate, const void* own, const judgement::ProductRule& rule,
                     CheckFigures* figures);
  // Judge's steps: the rows to the device (on copy_stream_, copied_
  // recorded after them); the judgement and the class counts of the block
  // and their copies to the host (waits for them); the elements outside
  // either bound that are reported, when there are any.
  struct JudgeLayout;
  absl::Status CopyRows(const std::int64_t* rows, std::int64_t m, std::size_t row_bytes,
                        const void* candidate, const void* own);
  absl::Status CountOnDevice(const JudgeLayout& at, std::int64_t m, std::int64_t cols,
                             const judgement::ProductRule& rule);
  absl::Status CollectOutside(const JudgeLayout& at, const JudgeCounts& c, const std::int64_t* rows,
                              std::int64_t m, std::int64_t cols, const judgement::ProductRule& rule,
                              CheckFigures* figures);
  // JudgeGtX's walk over dW's rows in blocks: X widened once, then each
  // block's columns of dY rounded to G and widened, its two DGEMMs and its
  // judgement. *judged false (with an OK status) when a value of X or G is
  // not finite or `stop` said to stop.
  absl::Status GtX(const void* dy, bool dy_bf16, const Bf16Bits* x, std::int64_t m,
                   const void* candidate, const void* own, const judgement::ProductRule& rule,
                   CandidateCheck* check, const std::function<bool()>& stop, bool* judged);
  // JudgeGWOfDy's block: the rows of dY to the device, rounded to G and
  // widened, its two DGEMMs and its judgement. *judged false (with an OK
  // status) when a value of G is not finite.
  absl::Status GWOfDy(const void* dy, bool dy_bf16, const std::int64_t* rows, std::int64_t m,
                      const void* candidate, const void* own, const judgement::ProductRule& rule,
                      CheckFigures* figures, bool* judged);
  // Room for a block of G: dY's bytes as sent (staging_), G and its
  // magnitudes as doubles (a_, a_abs_), the two products (out_, out_abs_)
  // and the finiteness flag.
  absl::Status ReserveGBlock(std::size_t staging_bytes, std::int64_t g_elements,
                             std::int64_t out_elements);
  // staging_'s n values of dY rounded to G = bf16(dY) and widened into a_
  // (and their magnitudes into a_abs_): Aborted, with *non_finite set, when
  // one is a NaN or an infinity (waits to know).
  absl::Status RoundG(bool dy_bf16, std::int64_t n, bool* non_finite);
  // out_ [rows, cols] (column-major, leading dimension rows) = op(a)·op(b)
  // over `depth` terms, and out_abs_ the same of the magnitudes, queued on
  // stream_; `what` names the product in an error.
  absl::Status Dgemms(cublasOperation_t ta, cublasOperation_t tb, std::int64_t rows,
                      std::int64_t cols, std::int64_t depth, const DeviceBuffer& a,
                      const DeviceBuffer& a_abs, std::int64_t lda, const DeviceBuffer& b,
                      const DeviceBuffer& b_abs, std::int64_t ldb, const std::string& what);
  // Whether the widening kernels queued on stream_ since non_finite_ was
  // cleared saw a NaN or an infinity (waits for them).
  absl::Status NonFinite(bool* seen);
  // FormOnDevice, then the cross-entropy's row sums (judge_kernels.h).
  absl::Status RowSums(const double* x, std::int64_t m, const std::int64_t* targets, double gamma,
                       double absolute, double cap, const std::uint8_t* class_rows,
                       judgement::CeRowSums* sums);
  // The models of the logits [count, V] of the rows r of the m that
  // FormOnDevice left with class_rows[r] non-zero (none when class_rows is
  // null), queued on stream_, for the row kernels' precision-class sums:
  // those rows' operand gathered first when not all are, with the map from
  // a row to its models' row (RowClassModels::rows).
  absl::Status ClassModels(const std::uint8_t* class_rows, std::int64_t m, RowClassModels* models);
  // FormOnDevice, then LogProbs' row sums, order and ids' z (judge_kernels.h).
  absl::Status LpRows(const double* x, std::int64_t m, const LpRowsRequest& request,
                      const LpRowsResult& result);
  // The engine's answer for a call of Product, Judge or RowSums: true when it was
  // done here, else false with the first error kept.
  bool Done(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JudgeGWOfDy's and JudgeGtX's answer, once every copy of the caller's
  // memory (the candidate's and logitd's rows of `what`) has ended: Done's,
  // and `judged` when the judging went through.
  bool AfterCopies(const absl::Status& status, bool judged, const char* what);
  // Device buffers of at least these many bytes, kept between products.
  absl::Status Reserve(DeviceBuffer* buffer, std::size_t bytes, const char* what);
  // Page-locked host buffers the products are copied into before the
  // caller's memory (a copy from the device into pageable memory runs at a
  // fraction of the link's rate).
  absl::Status ReservePinned(PinnedBuffer* buffer, std::size_t bytes);

  std::int64_t v_;
  std::int64_t k_;
  int device_;
  std::shared_ptr<DeviceMemory> memory_;
  std::string device_name_;
  bool weight_finite_ = false;
  Stream stream_;
  // Judge's copies of the candidate's and logitd's rows, beside the DGEMMs.
  Stream copy_stream_;
  Event copied_;
  CublasHandle handle_;
  DeviceBuffer w_, w_abs_, a_, a_abs_, out_, out_abs_;
  // Judge's: the candidate's and logitd's rows, the counts, the elements
  // outside per row, the collected elements and their count.
  DeviceBuffer candidate_, own_, counts_, row_outside_, collected_, collected_count_;
  // Judge's models of the block and its rows' counts of the precision-class
  // test.
  DeviceBuffer seq_, tc_, class_rows_;
  // ClassModels': the rows of the operand it gathered, and each row's row
  // of the models (−1: none).
  DeviceBuffer a_class_, class_map_;
  // The models' panels: A's, and B's (W's, while weight_panel_ names the
  // layout it holds: B's strides, its columns and terms).
  DeviceBuffer a_panel_, b_panel_;
  std::array<std::int64_t, 4> weight_panel_ = {0, 0, 0, 0};
  // RowSums' and LpRows': the rows' targets and sums; LpRows' order, its z,
  // the ids asked for and their z.
  DeviceBuffer targets_, row_sums_, order_, order_z_, ids_, ids_z_;
  // GtX's: X widened with its magnitudes, X or dY's columns as sent, and
  // the widening's finiteness flag.
  DeviceBuffer x_, x_abs_, staging_, non_finite_;
  PinnedBuffer host_out_, host_out_abs_, host_counts_, host_flag_;
  // One product at a time: every buffer above belongs to the one under way.
  mutable absl::Mutex mu_;
  std::string error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::kernels::cuda
