#include "client/logitctl/bench_config.h"

#include <string>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/logitctl/common.h"
#include "logitd/status_macros.h"

ABSL_FLAG(
    std::string, rpc, "logits",
    "bench: logits, backward, cross-entropy, logprobs, fetch-gradient (the fp32 dW [V, K] of a "
    "weight that one accumulating backward call gave a gradient), or baseline (the Probe "
    "RPC moving the bytes of the logits call of this shape)");
ABSL_FLAG(std::int64_t, m, 16, "bench: rows M of X (tokens per request)");
ABSL_FLAG(std::int64_t, k, 4096, "bench: hidden size K");
ABSL_FLAG(std::int64_t, v, 32768, "bench: vocabulary size V (rows of the weight)");
ABSL_FLAG(std::int32_t, concurrency, 1, "bench: worker threads, each with one call in flight");
ABSL_FLAG(std::int32_t, channels, 1,
          "bench: connections the workers share round-robin (each its own Client)");
ABSL_FLAG(double, duration, 0, "bench: seconds to measure (10 when --requests is not given)");
ABSL_FLAG(std::int64_t, requests, 0, "bench: requests to measure, over all workers");
ABSL_FLAG(std::int64_t, warmup, 1,
          "bench: requests each client runs and discards before each measurement");
ABSL_FLAG(bool, baseline, true,
          "bench: after a tensor RPC, measure the Probe RPC with the same bytes per request "
          "(--nobaseline skips it)");
ABSL_FLAG(std::int64_t, sample_rows, 0,
          "bench --rpc=verify-*: rows of M the server checks, evenly spaced; 0 for every row");
ABSL_FLAG(std::uint64_t, seed, 1234, "bench: seed of the random weight and inputs");
ABSL_FLAG(bool, shm_skip_digest, false,
          "bench --shm: ask the server not to hash Y in the region, and do not check it "
          "(ShmRef.skip_digest): one pass over Y fewer on each side");
ABSL_FLAG(bool, shm_digest_once, false,
          "bench --shm: hash X once, as it is written to the region, and send that digest with "
          "every call (ShmSlot.xxh3) instead of hashing the region each call; the server checks "
          "X against it as always");

ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(bool, shm);
ABSL_DECLARE_FLAG(std::string, out_dtype);
ABSL_DECLARE_FLAG(bool, pipeline);
ABSL_DECLARE_FLAG(std::int32_t, connections);
ABSL_DECLARE_FLAG(bool, no_dx);
ABSL_DECLARE_FLAG(bool, no_dw);
ABSL_DECLARE_FLAG(bool, accumulate);
ABSL_DECLARE_FLAG(bool, dx);
ABSL_DECLARE_FLAG(bool, dw);
ABSL_DECLARE_FLAG(std::int64_t, top_k);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(bool, lse);
ABSL_DECLARE_FLAG(bool, entropy);
ABSL_DECLARE_FLAG(bool, rank);
ABSL_DECLARE_FLAG(std::string, reduction);

namespace logitd::logitctl {
namespace {

using Rpc = BenchRpc;
using Config = BenchConfig;

absl::Status PositiveDim(absl::string_view flag, std::int64_t value) {
  if (value >= 1 && value <= (std::int64_t{1} << 31)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected 1 to 2^31, got ", value));
}

// The cross-entropy's loss: one per token without a reduction, else one.
std::uint64_t LossBytes(const Config& c) {
  return c.cross_entropy.reduction == client::Reduction::kNone ? static_cast<std::uint64_t>(c.m) * 4
                                                               : 4;
}

absl::StatusOr<Rpc> ParseRpc(const std::string& rpc) {
  if (rpc == "logits") return Rpc::kLogits;
  if (rpc == "backward") return Rpc::kBackward;
  if (rpc == "cross-entropy" || rpc == "cross_entropy") return Rpc::kCrossEntropy;
  if (rpc == "logprobs") return Rpc::kLogProbs;
  if (rpc == "fetch-gradient" || rpc == "fetch_gradient") return Rpc::kFetchGradient;
  if (rpc == "baseline") return Rpc::kBaseline;
  if (rpc == "verify-logits") return Rpc::kVerifyLogits;
  if (rpc == "verify-cross-entropy") return Rpc::kVerifyCrossEntropy;
  if (rpc == "verify-logprobs") return Rpc::kVerifyLogProbs;
  return absl::InvalidArgumentError(absl::StrCat(
      "--rpc: expected logits, backward, cross-entropy, logprobs, fetch-gradient, baseline, "
      "verify-logits, verify-cross-entropy or verify-logprobs, got '",
      rpc, "'"));
}

// The load: --concurrency, --channels, --requests or --duration, --warmup.
absl::Status ReadLoad(Config* c) {
  c->concurrency = absl::GetFlag(FLAGS_concurrency);
  if (c->concurrency < 1 || c->concurrency > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrency: expected 1 to 1024, got ", c->concurrency));
  }
  c->channels = absl::GetFlag(FLAGS_channels);
  if (c->channels < 1 || c->channels > c->concurrency) {
    return absl::InvalidArgumentError(absl::StrCat("--channels: expected 1 to --concurrency (",
                                                   c->concurrency, "), got ", c->channels));
  }
  c->requests = absl::GetFlag(FLAGS_requests);
  const double duration = absl::GetFlag(FLAGS_duration);
  if (c->requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--requests: expected a count >= 1, got ", c->requests));
  }
  if (!(duration >= 0) || duration > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("--duration: expected 0 to 86400 seconds, got ", duration));
  }
  if (c->requests > 0 && duration > 0) {
    return absl::InvalidArgumentError("--requests and --duration: give one of them, not both");
  }
  c->duration = absl::Seconds(c->requests == 0 && duration == 0 ? 10.0 : duration);
  c->warmup = absl::GetFlag(FLAGS_warmup);
  if (c->warmup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup: expected a count >= 0, got ", c->warmup));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsVerify(BenchRpc rpc) {
  return rpc == Rpc::kVerifyLogits || rpc == Rpc::kVerifyCrossEntropy ||
         rpc == Rpc::kVerifyLogProbs;
}

absl::string_view RpcName(BenchRpc rpc) {
  switch (rpc) {
    case Rpc::kLogits:
      return "logits";
    case Rpc::kBackward:
      return "backward";
    case Rpc::kCrossEntropy:
      return "cross-entropy";
    case Rpc::kLogProbs:
      return "logprobs";
    case Rpc::kFetchGradient:
      return "fetch-gradient";
    case Rpc::kBaseline:
      return "baseline";
    case Rpc::kVerifyLogits:
      return "verify-logits";
    case Rpc::kVerifyCrossEntropy:
      return "verify-cross-entropy";
    case Rpc::kVerifyLogProbs:
      return "verify-logprobs";
  }
  return "?";
}

absl::Status ReadRpcOptions(BenchConfig* config) {
  Config& c = *config;
  const std::uint64_t m = static_cast<std::uint64_t>(c.m);
  const std::uint64_t k = static_cast<std::uint64_t>(c.k);
  const std::uint64_t v = static_cast<std::uint64_t>(c.v);
  const std::uint64_t out_size = c.out_dtype == DType::kFp32 ? 4 : 2;
  switch (c.rpc) {
    case Rpc::kLogits:
    case Rpc::kBaseline:
      c.up_bytes = m * k * 2;
      c.down_bytes = m * v * out_size;
      break;
    case Rpc::kBackward:
      // dY in the logits' dtype, as training hands it back.
      c.backward.want_dx = !absl::GetFlag(FLAGS_no_dx);
      c.backward.want_dw = !absl::GetFlag(FLAGS_no_dw);
      c.backward.accumulate_dw = absl::GetFlag(FLAGS_accumulate);
      if (!c.backward.want_dx && !c.backward.want_dw) {
        return absl::InvalidArgumentError("--no_dx and --no_dw: nothing left to compute");
      }
      c.up_bytes = m * v * out_size + m * k * 2;
      c.down_bytes = (c.backward.want_dx ? m * k * 2 : 0) +
                     (c.backward.want_dw && !c.backward.accumulate_dw ? v * k * 4 : 0);
      break;
    case Rpc::kCrossEntropy: {
      c.cross_entropy.want_dx = absl::GetFlag(FLAGS_dx);
      c.cross_entropy.want_dw = absl::GetFlag(FLAGS_dw);
      c.cross_entropy.accumulate_dw = absl::GetFlag(FLAGS_accumulate);
      LOGITD_ASSIGN_OR_RETURN(c.cross_entropy.reduction,
                              ParseReduction(absl::GetFlag(FLAGS_reduction)));
      // x, then int64 targets; the loss (per token or reduced), dX and dW
      // back.
      c.up_bytes = m * k * 2 + m * 8;
      c.down_bytes = LossBytes(c) + (c.cross_entropy.want_dx ? m * k * 2 : 0) +
                     (c.cross_entropy.want_dw && !c.cross_entropy.accumulate_dw ? v * k * 4 : 0);
      break;
    }
    case Rpc::kLogProbs:
      // x, then int64 targets; per token the log-prob, lse, entropy and
      // rank as asked, and the top-k ids and log-probs.
      c.logprobs.top_k = absl::GetFlag(FLAGS_top_k);
      c.logprobs.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
      c.logprobs.want_lse = absl::GetFlag(FLAGS_lse);
      c.logprobs.want_entropy = absl::GetFlag(FLAGS_entropy);
      c.logprobs.want_rank = absl::GetFlag(FLAGS_rank);
      c.up_bytes = m * k * 2 + m * 8;
      c.down_bytes =
          m * 4 * (1 + (c.logprobs.want_lse ? 1 : 0) + (c.logprobs.want_entropy ? 1 : 0)) +
          (c.logprobs.want_rank ? m * 8 : 0) + m * static_cast<std::uint64_t>(c.logprobs.top_k) * 8;
      break;
    case Rpc::kFetchGradient:
      // A request of a few bytes (a handle); dW back.
      c.up_bytes = 0;
      c.down_bytes = v * k * 4;
      break;
    case Rpc::kVerifyLogits:
      // X and the candidate Y up; the verdicts back.
      c.up_bytes = m * k * 2 + m * v * out_size;
      c.down_bytes = 0;
      break;
    case Rpc::kVerifyCrossEntropy: {
      // X, int64 targets, the loss (per token or reduced) and lse [M] up.
      c.cross_entropy.want_lse = true;
      LOGITD_ASSIGN_OR_RETURN(c.cross_entropy.reduction,
                              ParseReduction(absl::GetFlag(FLAGS_reduction)));
      c.up_bytes = m * k * 2 + m * 8 + LossBytes(c) + m * 4;
      c.down_bytes = 0;
      break;
    }
    case Rpc::kVerifyLogProbs:
      // X, int64 targets, the log-prob, lse and entropy [M] up (no top-k).
      c.logprobs.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
      c.logprobs.want_lse = true;
      c.logprobs.want_entropy = true;
      c.up_bytes = m * k * 2 + m * 8 + 3 * m * 4;
      c.down_bytes = 0;
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<BenchConfig> ReadConfig() {
  Config c;
  absl::StatusOr<Rpc> rpc = ParseRpc(absl::GetFlag(FLAGS_rpc));
  if (!rpc.ok()) return rpc.status();
  c.rpc = *rpc;
  c.m = absl::GetFlag(FLAGS_m);
  c.k = absl::GetFlag(FLAGS_k);
  c.v = absl::GetFlag(FLAGS_v);
  for (const auto& [flag, value] :
       {std::pair<absl::string_view, std::int64_t>{"m", c.m}, {"k", c.k}, {"v", c.v}}) {
    if (absl::Status s = PositiveDim(flag, value); !s.ok()) return s;
  }
  const std::string out = absl::GetFlag(FLAGS_out_dtype);
  if (out == "fp32") {
    c.out_dtype = DType::kFp32;
  } else if (out == "bf16") {
    c.out_dtype = DType::kBf16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--out_dtype: expected fp32 or bf16, got '", out, "'"));
  }
  c.pipeline = absl::GetFlag(FLAGS_pipeline);
  c.logprobs.pipeline = c.pipeline;
  c.cross_entropy.pipeline = c.pipeline;
  c.connections = absl::GetFlag(FLAGS_connections);
  if (c.connections < 1 || c.connections > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--connections: expected 1 to 64, got ", c.connections));
  }
  c.logprobs.connections = c.connections;
  if (absl::Status s = ReadLoad(&c); !s.ok()) return s;
  c.baseline = absl::GetFlag(FLAGS_baseline);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.json = absl::GetFlag(FLAGS_json);
  c.shm = absl::GetFlag(FLAGS_shm);
  c.shm_skip_digest = absl::GetFlag(FLAGS_shm_skip_digest);
  c.shm_digest_once = absl::GetFlag(FLAGS_shm_digest_once);
  c.sample_rows = absl::GetFlag(FLAGS_sample_rows);
  if (c.sample_rows < 0 || (c.sample_rows > 0 && !IsVerify(c.rpc))) {
    return absl::InvalidArgumentError(
        "--sample_rows: a count of rows >= 0, with --rpc=verify-logits, verify-cross-entropy or "
        "verify-logprobs");
  }
  if (c.shm_digest_once && !c.shm) {
    return absl::InvalidArgumentError("--shm_digest_once: only with --shm");
  }
  if (c.shm_skip_digest && !c.shm) {
    return absl::InvalidArgumentError("--shm_skip_digest: only with --shm");
  }
  if (c.shm && c.rpc != Rpc::kLogits && c.rpc != Rpc::kLogProbs) {
    return absl::InvalidArgumentError(
        "--shm: only --rpc=logits and --rpc=logprobs use shared memory so far");
  }

  if (c.connections > 1 && (c.shm || (c.rpc != Rpc::kLogits && c.rpc != Rpc::kLogProbs))) {
    return absl::InvalidArgumentError(
        "--connections: only --rpc=logits and --rpc=logprobs spread a call, and not with --shm");
  }
  if (absl::Status s = ReadRpcOptions(&c); !s.ok()) return s;
  return c;
}

}  // namespace logitd::logitctl
