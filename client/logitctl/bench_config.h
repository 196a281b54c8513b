// What `logitctl bench` runs, read from its flags: the RPC, the shape, the
// load, the options of the benchmarked call and the bytes one request moves
// each way. The running and the measuring are bench.cc's.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::logitctl {

enum class BenchRpc {
  kLogits,
  kBackward,
  kCrossEntropy,
  kLogProbs,
  kFetchGradient,
  kBaseline,
  // Verify of logitd's own output of the operation (logits' Y, the
  // cross-entropy's mean loss and lse, LogProbs' log-prob, lse and
  // entropy), whose baseline is the operation.
  kVerifyLogits,
  kVerifyCrossEntropy,
  kVerifyLogProbs,
};

bool IsVerify(BenchRpc rpc);
// The --rpc spelling of `rpc`.
absl::string_view RpcName(BenchRpc rpc);

struct BenchConfig {
  BenchRpc rpc = BenchRpc::kLogits;
  std::int64_t m = 0;
  std::int64_t k = 0;
  std::int64_t v = 0;
  DType out_dtype = DType::kFp32;
  // Logits, LogProbs and CrossEntropy in row blocks (their options'
  // pipeline).
  bool pipeline = true;
  // Connections each Logits call is spread over (LogitsOptions.connections).
  int connections = 1;
  int concurrency = 1;
  int channels = 1;
  std::int64_t requests = 0;  // 0: run for `duration`
  absl::Duration duration;
  std::int64_t warmup = 0;
  bool baseline = true;
  std::uint64_t seed = 0;
  bool json = false;
  // X and Y through a same-host shared-memory region per worker (logits).
  bool shm = false;
  bool shm_skip_digest = false;
  bool shm_digest_once = false;
  std::int64_t sample_rows = 0;  // verify
  client::BackwardOptions backward;
  client::CrossEntropyOptions cross_entropy;
  client::LogProbsOptions logprobs;
  // Tensor bytes one request sends and receives.
  std::uint64_t up_bytes = 0;
  std::uint64_t down_bytes = 0;
};

// The benchmarked RPC's own flags into `config`, and the payload bytes of
// one call each way (what the Probe baseline moves), for config->rpc.
absl::Status ReadRpcOptions(BenchConfig* config);
// The bench's flags, checked: InvalidArgument naming the flag otherwise.
absl::StatusOr<BenchConfig> ReadConfig();

}  // namespace logitd::logitctl
