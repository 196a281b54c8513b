// The engine's per-token part (fp64_products.h): a row's sums of the
// cross-entropy's and LogProbs' references formed where the row's logits
// are, so that the sums cross back instead of the logits.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/kernels/cuda/cuda_status.h"
#include "server/kernels/cuda/fp64_products.h"
#include "server/kernels/cuda/judge_kernels.h"

namespace logitd::kernels::cuda {

absl::Status CudaFp64Products::ClassModels(const std::uint8_t* class_rows, std::int64_t m,
                                           RowClassModels* models) {
  *models = RowClassModels();
  if (class_rows == nullptr) return absl::OkStatus();
  std::vector<std::int32_t> map(static_cast<std::size_t>(m), -1);
  std::int32_t count = 0;
  for (std::int64_t r = 0; r < m; ++r) {
    if (class_rows[r] != 0) map[static_cast<std::size_t>(r)] = count++;
  }
  if (count == 0) return absl::OkStatus();
  // The logits' models from the operands FormOnDevice left: A = X [m, K]
  // (a_, or the picked rows of it), B(t, j) = W[j, t] (w_).
  const DeviceBuffer* a = &a_;
  if (count < m) {
    cudaStream_t s = stream_.get();
    const std::size_t row_bytes = static_cast<std::size_t>(k_) * sizeof(double);
    LOGITD_CUDA_RETURN_IF_ERROR(
        Reserve(&a_class_, static_cast<std::size_t>(count) * row_bytes, "the class rows of X"));
    LOGITD_CUDA_RETURN_IF_ERROR(
        Reserve(&class_map_, map.size() * sizeof(std::int32_t), "the class rows' map"));
    // One copy per run of consecutive picked rows.
    for (std::int64_t r = 0; r < m;) {
      if (class_rows[r] == 0) {
        ++r;
        continue;
      }
      const std::int64_t first = r;
      while (r < m && class_rows[r] != 0) ++r;
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(a_class_.as<double>() + map[static_cast<std::size_t>(first)] * k_,
                          a_.as<double>() + first * k_,
                          static_cast<std::size_t>(r - first) * row_bytes, cudaMemcpyDeviceToDevice,
                          s),
          "verify: gather the class rows of X");
    }
    // (Pageable: the copy has left `map` when cudaMemcpyAsync returns.)
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(class_map_.get(), map.data(), map.size() * sizeof(std::int32_t),
                        cudaMemcpyHostToDevice, s),
        "verify: copy the class rows' map to the device");
    a = &a_class_;
    models->rows = class_map_.as<std::int32_t>();
  }
  LOGITD_CUDA_RETURN_IF_ERROR(Models(ModelOperands{a, k_, 1, &w_, 1, k_, k_}, count, v_));
  models->seq = seq_.as<float>();
  models->tc = tc_.as<double>();
  models->floor = judgement::ClassFloor(k_);
  return absl::OkStatus();
}

absl::Status CudaFp64Products::RowSums(const double* x, std::int64_t m, const std::int64_t* targets,
                                       double gamma, double absolute, double cap,
                                       const std::uint8_t* class_rows, judgement::CeRowSums* sums) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  cudaStream_t s = stream_.get();
  const std::size_t targets_bytes = static_cast<std::size_t>(m) * sizeof(std::int64_t);
  const std::size_t sums_bytes = static_cast<std::size_t>(m) * sizeof(judgement::CeRowSums);
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&targets_, targets_bytes, "the rows' targets"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&row_sums_, sums_bytes, "the rows' softmax sums"));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(targets_.get(), targets, targets_bytes, cudaMemcpyHostToDevice, s),
      "verify: copy the targets to the device");
  LOGITD_CUDA_RETURN_IF_ERROR(FormOnDevice(/*transposed=*/true, x, m, /*with_abs=*/true));
  RowClassModels models;
  LOGITD_CUDA_RETURN_IF_ERROR(ClassModels(class_rows, m, &models));
  RETURN_IF_CUDA_ERROR(
      LaunchCeRowSums(out_.as<double>(), out_abs_.as<double>(), m, v_, targets_.as<std::int64_t>(),
                      gamma, absolute, cap, logitd::Gamma(v_, kFp32StepError), models,
                      row_sums_.as<judgement::CeRowSums>(), s),
      "verify: the cross-entropy's softmax sums");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(sums, row_sums_.get(), sums_bytes, cudaMemcpyDeviceToHost, s),
      "verify: copy the softmax sums to the host");
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "verify: the cross-entropy's softmax sums");
  return absl::OkStatus();
}

absl::Status CudaFp64Products::LpRows(const double* x, std::int64_t m, const LpRowsRequest& request,
                                      const LpRowsResult& result) {
  LOGITD_CUDA_RETURN_IF_ERROR(UseDevice(device_));
  cudaStream_t s = stream_.get();
  const std::size_t rows = static_cast<std::size_t>(m);
  const std::size_t targets_bytes = rows * sizeof(std::int64_t);
  const std::size_t sums_bytes = rows * sizeof(judgement::LpRowSums);
  const std::size_t order_n = rows * static_cast<std::size_t>(request.order_cols);
  const std::size_t ids_n =
      request.ids != nullptr ? rows * static_cast<std::size_t>(request.ids_k) : 0;
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&targets_, targets_bytes, "the rows' targets"));
  LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&row_sums_, sums_bytes, "the rows' sums"));
  LOGITD_CUDA_RETURN_IF_ERROR(
      Reserve(&order_, std::max<std::size_t>(order_n, 1) * sizeof(std::int64_t), "the order"));
  LOGITD_CUDA_RETURN_IF_ERROR(
      Reserve(&order_z_, std::max<std::size_t>(order_n, 1) * sizeof(double), "the order's z"));
  if (ids_n > 0) {
    LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&ids_, ids_n * sizeof(std::int64_t), "the top-k ids"));
    LOGITD_CUDA_RETURN_IF_ERROR(Reserve(&ids_z_, ids_n * sizeof(double), "the top-k ids' z"));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(ids_.get(), request.ids, ids_n * sizeof(std::int64_t),
                                         cudaMemcpyHostToDevice, s),
                         "verify: copy the top-k ids to the device");
  }
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(targets_.get(), request.targets, targets_bytes, cudaMemcpyHostToDevice, s),
      "verify: copy the targets to the device");
  LOGITD_CUDA_RETURN_IF_ERROR(FormOnDevice(/*transposed=*/true, x, m, /*with_abs=*/true));
  RowClassModels models;
  LOGITD_CUDA_RETURN_IF_ERROR(ClassModels(request.class_rows, m, &models));
  LpRowSumsArgs a;
  a.sum = out_.as<double>();
  a.abs_sum = out_abs_.as<double>();
  a.rows = m;
  a.cols = v_;
  a.vocab = request.vocab;
  a.targets = targets_.as<std::int64_t>();
  a.gamma = request.gamma;
  a.absolute = request.absolute;
  a.cap = request.cap;
  a.temperature = request.temperature;
  a.gamma_sum = logitd::Gamma(request.vocab, kFp32StepError);
  a.order_cols = request.order_cols;
  a.ids = ids_n > 0 ? ids_.as<std::int64_t>() : nullptr;
  a.ids_k = request.ids_k;
  a.models = models;
  a.sums = row_sums_.as<judgement::LpRowSums>();
  a.order = order_.as<std::int64_t>();
  a.order_z = order_z_.as<double>();
  a.ids_z = ids_n > 0 ? ids_z_.as<double>() : nullptr;
  RETURN_IF_CUDA_ERROR(LaunchLpRowSums(a, s), "verify: LogProbs' row sums");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(result.sums, row_sums_.get(), sums_bytes, cudaMemcpyDeviceToHost, s),
      "verify: copy LogProbs' row sums to the host");
  if (order_n > 0) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(result.order, order_.get(), order_n * sizeof(std::int64_t),
                                         cudaMemcpyDeviceToHost, s),
                         "verify: copy the order to the host");
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(result.order_z, order_z_.get(), order_n * sizeof(double),
                                         cudaMemcpyDeviceToHost, s),
                         "verify: copy the order's z to the host");
  }
  if (ids_n > 0) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(result.ids_z, ids_z_.get(), ids_n * sizeof(double),
                                         cudaMemcpyDeviceToHost, s),
                         "verify: copy the top-k ids' z to the host");
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s), "verify: LogProbs' row sums");
  return absl::OkStatus();
}

bool CudaFp64Products::CeRowSums(const double* x, std::int64_t m, const std::int64_t* targets,
                                 double gamma, double absolute, double cap,
                                 const std::uint8_t* class_rows, judgement::CeRowSums* sums) {
  absl::MutexLock lock(&mu_);
  return Done(RowSums(x, m, targets, gamma, absolute, cap, class_rows, sums));
}

bool CudaFp64Products::LpRowSums(const double* x, std::int64_t m, const LpRowsRequest& request,
                                 const LpRowsResult& result) {
  absl::MutexLock lock(&mu_);
  return Done(LpRows(x, m, request, result));
}

}  // namespace logitd::kernels::cuda
