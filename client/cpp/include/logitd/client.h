// C++ client for a logitd server: hides chunking and digests, returns host
// tensors as absl::StatusOr. One Client is safe to share between threads.
// Its options, arguments and results are in logitd/client_types.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "logitd/client_types.h"
#include "logitd/tensor.h"

namespace logitd::client {

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
  // given back to the budget: 0 while other registrations of the same bytes
  // remain (freed now, or when calls still using the weight end).
  absl::StatusOr<std::uint64_t> ReleaseWeight(const std::string& handle, bool force = false);

  // x: bf16 [M, K]. Returns [M, V] in options.out_dtype.
  absl::StatusOr<Tensor> Logits(const Tensor& x, const std::string& handle,
                                const LogitsOptions& options = {}, Timing* timing = nullptr);
  // The same call, receiving Y into *y: when *y already has Y's dtype and
  // shape (the previous call's result, say) its memory is reused, else it is
  // replaced by a new tensor. For callers that repeat a call and want no
  // fresh allocation (and page faults) per result. On error *y is left empty
  // or as it was.
  absl::Status LogitsInto(const Tensor& x, const std::string& handle, Tensor* y,
                          const LogitsOptions& options = {}, Timing* timing = nullptr);

  // dy: fp32 or bf16 [M, V]; x: bf16 [M, K].
  absl::StatusOr<BackwardResult> Backward(const Tensor& dy, const Tensor& x,
                                          const std::string& handle,
                                          const BackwardOptions& options = {});

  // The accumulated fp32 dW [V, K] (and the buffer zeroed after it with
  // zero_after_fetch).
  absl::StatusOr<GradientResult> FetchGradient(const std::string& handle, bool zero_after_fetch);
  // The same call, receiving dW into *dw (the result's dw is left empty): its
  // memory is reused when it already has dW's dtype and shape, as LogitsInto
  // does, so that a caller fetching every step faults no fresh pages in.
  absl::StatusOr<GradientResult> FetchGradientInto(const std::string& handle, bool zero_after_fetch,
                                                   Tensor* dw);
  absl::Status ZeroGradient(const std::string& handle);

  // The server's fp32 -> bf16 cast of `input` (fp32, any shape).
  absl::StatusOr<Tensor> CastToBf16(const Tensor& input);

  // Fused cross-entropy of the logits X . W^T against `targets` (int32 or
  // int64 [M]) without the server materialising the logits.
  absl::StatusOr<CrossEntropyResult> CrossEntropy(const Tensor& x, const Tensor& targets,
                                                  const std::string& handle,
                                                  const CrossEntropyOptions& options = {});

  // Sends options.request_bytes and reads options.response_bytes back through
  // the Probe RPC; DataLoss when the server returns another byte count.
  absl::StatusOr<ProbeResult> Probe(const ProbeOptions& options);

  // Has the server map the shared-memory object `name` of `bytes` bytes
  // (server --allow_shm, same host, same user) and returns its region handle.
  // Never retried: a lost answer would leave a second mapping behind.
  absl::StatusOr<std::string> RegisterShm(const std::string& name, std::uint64_t bytes);
  absl::StatusOr<std::string> RegisterShm(const SharedRegion& region) {
    return RegisterShm(region.name(), region.size());
  }
  // Has the server unmap the region; release before the SharedRegion goes.
  absl::Status ReleaseShm(const std::string& handle);

  // Y = alpha * X . W^T with X and/or Y in shared memory (see LogitsShmArgs).
  // InvalidArgument (before any call) for a slot outside its region; DataLoss
  // when Y's bytes in the region do not match the digest the server sent.
  absl::StatusOr<LogitsShmResult> LogitsShm(const LogitsShmArgs& args, const std::string& handle,
                                            const LogitsOptions& options = {});
  // Backward with dY, X, dX and/or dW in shared memory (see BackwardShmArgs);
  // errors as LogitsShm.
  absl::StatusOr<BackwardShmResult> BackwardShm(const BackwardShmArgs& args,
                                                const std::string& handle,
                                                const BackwardOptions& options = {});

  // Cast with its input and/or output in shared memory (see CastShmArgs);
  // errors as LogitsShm.
  absl::StatusOr<CastShmResult> CastShm(const CastShmArgs& args);
  // CrossEntropy with any of its tensors in shared memory (see
  // CrossEntropyShmArgs); errors as LogitsShm.
  absl::StatusOr<CrossEntropyShmResult> CrossEntropyShm(const CrossEntropyShmArgs& args,
                                                        const std::string& handle,
                                                        const CrossEntropyOptions& options = {});

  // Per-token log-probabilities of the fp32 logits X . W^T against
  // `targets` (int32 or int64 [M]; null for none), with the entropy, lse,
  // top-k and rank as `options` ask, without the logits leaving the server.
  absl::StatusOr<LogProbsResult> LogProbs(const Tensor& x, const Tensor* targets,
                                          const std::string& handle,
                                          const LogProbsOptions& options = {});
  // The same with any tensor in shared memory (see LogProbsShmArgs).
  absl::StatusOr<LogProbsResult> LogProbsShm(const LogProbsShmArgs& args, const std::string& handle,
                                             const LogProbsOptions& options = {});

  // Judges another implementation's outputs (args.candidates) of one
  // operation against the contract: each element against the fp64
  // reference of its inputs and the proven bound, and against logitd's own
  // output. A verdict of "outside_bounds" is a result, not an error; bad
  // input is InvalidArgument, as for the operation's own call.
  absl::StatusOr<VerifyResult> Verify(const VerifyArgs& args);

  // The runs Verify recorded for this caller's tenant, newest first
  // (history_types.h). FailedPrecondition from a server that keeps no
  // history.
  absl::StatusOr<ListRunsResult> ListRuns(const ListRunsArgs& args);
  // This caller's projects, and the cases of one, by name.
  absl::StatusOr<std::vector<ProjectSummary>> ListProjects();
  absl::StatusOr<std::vector<CaseSummary>> ListCases(const std::string& project);
  // Names the recorded run `run_id` a baseline of its project and case
  // (BaselineSelector::name); retention never prunes it.
  absl::Status PromoteRun(std::int64_t run_id, const std::string& name);
  // Replaces this tenant's rules of `project` (at most 100), which every
  // run recorded in it from then on is checked against
  // (VerifyResult::alerts); ListRules reads them back.
  absl::Status SetRules(const std::string& project, const std::vector<HistoryRule>& rules);
  absl::StatusOr<std::vector<HistoryRule>> ListRules(const std::string& project);
  // Removes this tenant's project from the history (its runs, baselines and
  // rules); the runs removed. NotFound when it has none.
  absl::StatusOr<std::int64_t> DeleteProject(const std::string& project);
  // Records golden cases this client judged as runs of its history (one a
  // case, compared with args.compare and checked against the project's
  // rules); the cases as recorded, in order.
  absl::StatusOr<std::vector<RecordedCase>> RecordValidation(const RecordValidationArgs& args);

  // Calls, attempts and retries so far (see CallStats).
  CallStats call_stats() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  // A call spread over connections (LogitsOptions.connections,
  // LogProbsOptions.connections): the weight's WeightInfo (from ListWeights
  // the first time; nullopt for a handle the server does not list).
  absl::StatusOr<std::optional<WeightInfo>> SpreadWeight(const std::string& handle);
  // The parts of a call of m rows cut at multiples of `block` over at most
  // `connections` connections, each run by part(client, r0, rows, index) on
  // a thread of its own (index 0 on this Client); the first error.
  absl::Status RunSpread(
      std::int64_t m, std::int64_t block, int connections,
      const std::function<absl::Status(Client&, std::int64_t, std::int64_t, std::int64_t)>& part);
  absl::Status LogitsSpread(const Tensor& x, const std::string& handle, Tensor* y,
                            const LogitsOptions& options, Timing* timing);
  // One part: X's rows [r0, r0 + rows) to Y's same rows at `y` (`y_bytes`).
  absl::Status LogitsPart(const Tensor& x, std::int64_t r0, std::int64_t rows,
                          const std::string& handle, std::byte* y, std::uint64_t y_bytes,
                          const LogitsOptions& options, Timing* timing);
  absl::StatusOr<LogProbsResult> LogProbsSpread(const Tensor& x, const Tensor* targets,
                                                const std::string& handle,
                                                const LogProbsOptions& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace logitd::client
