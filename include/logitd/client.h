// C++ client for a logitd server: hides chunking and digests, returns host
// tensors as absl::StatusOr. One Client is safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "logitd/tensor.h"

namespace logitd::client {

struct ClientOptions {
  // Chunk size for tensors sent to the server, bytes.
  std::size_t chunk_bytes = 4u << 20;
  // Per-call deadline; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Minutes(10);
  // Sent as "authorization: Bearer <token>" when non-empty.
  std::string auth_token;
  // TLS: PEM contents. Plaintext when root_ca_pem is empty and use_tls false.
  bool use_tls = false;
  std::string root_ca_pem;
  std::string client_cert_pem;
  std::string client_key_pem;
};

struct ServerInfo {
  std::string version;
  std::string build_id;
  std::string backend;
  std::string device_name;
  std::string compute_capability;
  int multiprocessor_count = 0;
  std::string driver_version;
  std::string cuda_runtime_version;
  std::string cublaslt_version;
  std::string blas_version;
  std::uint64_t weight_budget_bytes = 0;
  std::uint64_t weight_bytes_in_use = 0;
  std::uint64_t max_request_bytes = 0;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t device_bytes_in_use = 0;
  std::string split_k;
};

struct WeightInfo {
  std::string handle;
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t xxh3 = 0;
  std::uint64_t bytes = 0;
  bool has_gradient = false;
  bool already_registered = false;
  // Outstanding registrations of these bytes; the weight goes when the last
  // is released.
  std::uint32_t registrations = 0;
  // LoadWeight only: "F32" or "F16" when the file's tensor was rounded to
  // bf16 (round to nearest even); empty when it was bf16 already.
  std::string converted_from;
};

// Server-side time split of one call, microseconds.
struct Timing {
  std::int64_t queue_us = 0;
  std::int64_t receive_us = 0;
  std::int64_t h2d_us = 0;
  std::int64_t compute_us = 0;
  std::int64_t d2h_us = 0;
};

struct LogitsOptions {
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
};

struct BackwardOptions {
  bool want_dx = true;
  bool want_dw = true;
  DType dx_dtype = DType::kBf16;
  DType dw_dtype = DType::kFp32;
  // Add dW into the server-held fp32 buffer instead of returning it.
  bool accumulate_dw = false;
};

struct BackwardResult {
  std::optional<Tensor> dx;
  std::optional<Tensor> dw;
  Timing timing;
};

enum class Reduction { kNone, kSum, kMean };

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  // Coefficient of z_loss * lse^2; 0 = off.
  float z_loss = 0.0f;
  // Tanh soft-capping of the logits; 0 = off.
  float logit_softcap = 0.0f;
  // Incoming gradient of the reduced loss (must not be 0: proto3 reads 0 as 1).
  float grad_scale = 1.0f;
  bool want_lse = false;
  bool want_dx = false;
  bool want_dw = false;
  DType dx_dtype = DType::kBf16;
  // Add dW into the server-held fp32 buffer instead of returning it.
  bool accumulate_dw = false;
};

struct CrossEntropyResult {
  // fp32: [M] for Reduction::kNone, else [1].
  Tensor loss;
  std::optional<Tensor> lse;  // fp32 [M]
  std::optional<Tensor> dx;   // [M, K]
  std::optional<Tensor> dw;   // fp32 [V, K]
  std::int64_t counted_tokens = 0;
  Timing timing;
};

struct GradientResult {
  Tensor dw;
  std::uint64_t accumulated_calls = 0;
};

class Client {
 public:
  // Connects lazily: the first call reports an unreachable server as
  // Unavailable. `address` is a gRPC target ("127.0.0.1:50051", "dns:///host:port").
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& address,
                                                        ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<ServerInfo> Info();

  // weight: bf16 [V, K].
  absl::StatusOr<WeightInfo> RegisterWeight(const Tensor& weight, const std::string& name);
  // Has the server read tensor `tensor` (rank 2; BF16, or F32/F16 rounded to
  // bf16) from the safetensors file `path`, relative to the server's
  // --weights_dir. An empty name means the tensor's name.
  absl::StatusOr<WeightInfo> LoadWeight(const std::string& path, const std::string& tensor,
                                        const std::string& name = "");
  absl::StatusOr<std::vector<WeightInfo>> ListWeights();
  // Releases one registration (every one with `force`). Returns the bytes
  // freed: 0 while other registrations of the same bytes remain.
  absl::StatusOr<std::uint64_t> ReleaseWeight(const std::string& handle, bool force = false);

  // x: bf16 [M, K]. Returns [M, V] in options.out_dtype.
  absl::StatusOr<Tensor> Logits(const Tensor& x, const std::string& handle,
                                const LogitsOptions& options = {}, Timing* timing = nullptr);

  // dy: fp32 or bf16 [M, V]; x: bf16 [M, K].
  absl::StatusOr<BackwardResult> Backward(const Tensor& dy, const Tensor& x,
                                          const std::string& handle,
                                          const BackwardOptions& options = {});

  absl::StatusOr<GradientResult> FetchGradient(const std::string& handle, bool zero_after_fetch);
  absl::Status ZeroGradient(const std::string& handle);

  // The server's fp32 -> bf16 cast of `input` (fp32, any shape).
  absl::StatusOr<Tensor> CastToBf16(const Tensor& input);

  // Fused cross-entropy of the logits X . W^T against `targets` (int32 or
  // int64 [M]) without the server materialising the logits.
  absl::StatusOr<CrossEntropyResult> CrossEntropy(const Tensor& x, const Tensor& targets,
                                                  const std::string& handle,
                                                  const CrossEntropyOptions& options = {});

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace logitd::client
