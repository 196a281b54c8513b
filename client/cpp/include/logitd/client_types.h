// The C++ client's options, arguments and results (logitd/client.h is the
// Client itself): retry policy, connection options, the server's and the
// weights' descriptions, each call's options and results, shared-memory
// slots and Verify's arguments and verdicts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/history_types.h"
#include "logitd/protocol.h"
#include "logitd/shared_region.h"
#include "logitd/tensor.h"

namespace logitd::client {

// Retrying calls that failed with UNAVAILABLE (server down, restarting or
// unreachable, connection lost mid-call). Off by default (max_attempts = 1):
// a caller that wants a job to ride over a server restart turns it on, e.g.
// `options.retry = RetryPolicy::Enabled();`. Only idempotent calls are ever
// retried, whatever the policy says:
//   retried: Info, ListWeights, LoadWeight, RegisterWeight, Logits,
//            CastToBf16, ZeroGradient, FetchGradient(zero_after_fetch=false),
//            Backward and CrossEntropy without accumulate_dw;
//   never:   ReleaseWeight, FetchGradient(zero_after_fetch=true), Backward and
//            CrossEntropy with accumulate_dw, Probe.
// RegisterWeight and LoadWeight are retried because the server keys weights by
// their content: a repeat gives the same handle. If an attempt reached the
// server but its answer was lost, the repeat adds one registration of the
// same bytes (WeightInfo::registrations), so the weight then needs one more
// ReleaseWeight (or force) to go.
// Status codes other than UNAVAILABLE are never retried. Attempts share the
// call's deadline (ClientOptions::timeout from the start of the call): the
// client does not sleep past it, and then returns the last UNAVAILABLE.
struct RetryPolicy {
  // Attempts in all, the first included: 1 = no retries; 0 = no limit but
  // the call's deadline.
  int max_attempts = 1;
  // Sleep before the first retry; each further retry sleeps `multiplier`
  // times longer, up to max_backoff. Each sleep is scaled by a uniform random
  // factor in [1 - jitter, 1 + jitter] so that many clients do not retry in
  // step.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  double multiplier = 2.0;
  absl::Duration max_backoff = absl::Seconds(5);
  double jitter = 0.2;

  // The policy above with retries on: 8 attempts (backoffs of about 0.1, 0.2,
  // 0.4, 0.8, 1.6, 3.2 and 5 s: some 11 s of outage covered).
  static RetryPolicy Enabled() {
    RetryPolicy p;
    p.max_attempts = 8;
    return p;
  }
};

// Counts over a Client's lifetime (all threads), for tests and monitoring.
struct CallStats {
  // Calls made through the client (each counted once, however many attempts).
  std::uint64_t calls = 0;
  // Attempts sent to the server: calls plus retries.
  std::uint64_t attempts = 0;
  // Attempts that were repeats of an attempt that failed with UNAVAILABLE.
  std::uint64_t retries = 0;
  // Calls that ended with UNAVAILABLE after retrying (attempts or deadline
  // used up).
  std::uint64_t exhausted = 0;
  // Calls that failed with UNAVAILABLE and were not retried because they are
  // not idempotent (counted whether retries are on or off).
  std::uint64_t not_retried = 0;
  // Calls that ended with DATA_LOSS (a response the client could not verify:
  // digest mismatch, truncated tensor). Never retried.
  std::uint64_t data_loss = 0;
};

struct ClientOptions {
  // Chunk size for tensors sent to the server, bytes.
  std::size_t chunk_bytes = kDefaultChunkBytes;
  // A tensor streamed to the server of this many bytes or more is announced
  // with xxh3 0 and its digest sent after its chunks, worked out on a thread
  // of its own while they travel, instead of before the call's header (a
  // 2 GB candidate of a Verify, a Backward's dY). Servers that say
  // ServerInfo.request_digest_last take it; 0 hashes every tensor first, as
  // older servers need.
  std::uint64_t digest_after_bytes = std::uint64_t{64} << 20;
  // Per-call deadline; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Minutes(10);
  // Sent as "authorization: Bearer <token>" with every call when non-empty
  // (servers started with --auth_tokens require it).
  std::string auth_token;
  // TLS. The three strings are PEM *contents* (not file paths): read the
  // files yourself. Plaintext when use_tls is false and root_ca_pem empty;
  // use_tls with an empty root_ca_pem trusts gRPC's default roots (the
  // system's). client_cert_pem and client_key_pem (both or neither) are the
  // client's identity for a server with --tls_client_ca (mutual TLS).
  bool use_tls = false;
  std::string root_ca_pem;
  std::string client_cert_pem;
  std::string client_key_pem;
  // Open a connection of this Client's own. By default gRPC lets channels to
  // the same target with the same settings share one connection, so several
  // Clients would multiplex their calls over a single TCP stream.
  bool own_connection = false;
  // gRPC load-balancing policy: "pick_first" (gRPC's default: every call on
  // one server) or "round_robin" (calls spread over every address the target
  // resolves to, e.g. "dns:///logitd.example:50051" or
  // "ipv4:10.0.0.1:50051,10.0.0.2:50051"). Weights are registered per
  // server, so round_robin suits calls that need none (Info, CastToBf16) or
  // weights registered on every server.
  std::string lb_policy = "pick_first";
  // Retries of idempotent calls on UNAVAILABLE; off unless set (see
  // RetryPolicy). When on, the channel also tries to reconnect at least every
  // max_backoff (gRPC's own reconnect backoff grows to 2 minutes), so that a
  // restarted server is found within the policy's backoffs.
  RetryPolicy retry;
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
  // The wire's limits: the largest message the server takes, the largest
  // request chunk, the largest message it sends (docs/PROTOCOL.md).
  std::uint64_t max_receive_message_bytes = 0;
  std::uint64_t max_request_chunk_bytes = 0;
  std::uint64_t max_send_message_bytes = 0;
  // Whether a streamed tensor's digest may follow its chunks
  // (ClientOptions::digest_after_bytes).
  bool request_digest_last = false;
  std::uint64_t device_bytes_in_use = 0;
  std::string split_k;
  // How long GEMM algorithm choices last: "fixed", "kept" (in
  // algo_cache_path) or "per_process" (a restart may give other bits).
  std::string algo_choices;
  std::string algo_cache_path;
  // Request memory (see docs/OPERATIONS.md): the budget, what calls hold
  // now and at most so far, calls holding it now, and the cap on them.
  std::uint64_t request_memory_bytes = 0;
  std::uint64_t request_bytes_in_flight = 0;
  std::uint64_t request_bytes_high_water = 0;
  std::uint32_t requests_in_flight = 0;
  std::uint32_t max_concurrent_requests = 0;
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
  // Rows at whose multiples a Logits call with fp32 (bf16) Y may be cut
  // without changing a bit (0: a server that does not say).
  std::int64_t logits_block_rows_fp32 = 0;
  std::int64_t logits_block_rows_bf16 = 0;
  // The same for a LogProbs call (every output of every row).
  std::int64_t logprobs_block_rows = 0;
};

// A call's "logitd-timing" trailing metadata (microseconds): the server's
// split of the whole call, including streaming the response out. A field is
// empty when the server did not measure it (h2d/d2h on the cpu backend, queue
// for calls that pass no admission).
struct TimingTrailer {
  std::optional<std::int64_t> queue_us;
  std::optional<std::int64_t> receive_us;
  std::optional<std::int64_t> h2d_us;
  std::optional<std::int64_t> compute_us;
  std::optional<std::int64_t> d2h_us;
  std::optional<std::int64_t> send_us;
  std::optional<std::int64_t> total_us;
  // Rows a block, for a call the server ran in row blocks (pipeline).
  std::optional<std::int64_t> pipeline_rows;
  // The GEMM configurations the server ran for the call, from its
  // "logitd-gemm" trailer ("shape: configuration" entries separated by "; ";
  // the cuda backend's cuBLASLt algorithms), empty when not sent. Two runs
  // that give different bits on one platform differ here.
  std::string gemms;
};

// Parses a "logitd-timing" value ("receive_us=12,compute_us=345,..."); keys it
// does not know are skipped. InvalidArgument for text that is not key=integer
// pairs separated by commas.
absl::StatusOr<TimingTrailer> ParseTimingTrailer(absl::string_view text);

// Server-side time split of one call, microseconds.
struct Timing {
  std::int64_t queue_us = 0;
  std::int64_t receive_us = 0;
  std::int64_t h2d_us = 0;
  std::int64_t compute_us = 0;
  std::int64_t d2h_us = 0;
  // The call's trailer, when the server sent one (it adds send_us and
  // total_us, and says which of the fields above were measured).
  std::optional<TimingTrailer> trailer;
};

struct LogitsOptions {
  DType out_dtype = DType::kFp32;
  float alpha = 1.0f;
  // Ask the server to start on X's first rows while the rest arrive and to
  // stream Y's rows as they are done (LogitsHeader.pipeline), X written on
  // a thread of its own meanwhile. Y's bits are the same either way; a
  // server that predates the field runs the call whole.
  bool pipeline = true;
  // Logits and LogitsInto: spread a call of many rows over this many
  // connections at once (1 to 64). X's rows are cut at multiples of the
  // weight's logits_block_rows, so that every row keeps the bits of the
  // call made whole; each part is a Logits call of its own on a connection
  // of its own (opened on first use and kept by the Client), received in
  // place into Y. One connection carries about one core's worth of bytes a
  // second; several carry more. 1 (the default): one call.
  int connections = 1;
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
// "none", "sum", "mean".
absl::string_view ReductionName(Reduction reduction);

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
  // Ask the server to start on the first rows while the rest arrive
  // (CrossEntropyHeader.pipeline), as LogitsOptions.pipeline: the targets go
  // first, X is written on a thread of its own, the bits are the same either
  // way. A call with dW runs whole.
  bool pipeline = true;
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
  // The server's time split (send and total) from the call's trailer.
  std::optional<TimingTrailer> trailer;
};

// A transport probe: the bytes of a tensor call over the same channel, with
// no tensors and no work on the server.
struct ProbeOptions {
  // Sent after the header in messages of ClientOptions::chunk_bytes.
  std::uint64_t request_bytes = 0;
  // Streamed back by the server in messages of chunk_bytes.
  std::uint64_t response_bytes = 0;
  // 0: the server's --chunk_bytes (what tensor responses use).
  std::uint64_t chunk_bytes = 0;
};

struct ProbeResult {
  std::uint64_t response_bytes = 0;
  std::optional<TimingTrailer> trailer;
};

// Same-host shared memory (server started with --allow_shm): a place in a
// SharedRegion registered with Client::RegisterShm.
struct ShmSlot {
  // What RegisterShm returned for `region`.
  std::string handle;
  // The region as mapped in this process: the client computes the input's
  // digest from, and checks the output's digest against, these bytes.
  const SharedRegion* region = nullptr;
  std::uint64_t offset = 0;
  // For an output slot: ask the server not to hash the output, and do not
  // check it (ShmRef.skip_digest). Saves a pass over the output on each
  // side; ShmOutput::xxh3 is then 0.
  bool skip_digest = false;
  // For an input slot: the xxh3-64 (seed 0) of its bytes, when the caller
  // has it (hashed as it wrote them, say). The client then sends it as the
  // input's digest instead of hashing the slot on every call; the server
  // checks the bytes it reads against it as always (DATA_LOSS when they
  // differ). Ignored on an output slot.
  std::optional<std::uint64_t> xxh3 = std::nullopt;
};

// An input of a tensor call: a tensor the client streams to the server, or
// a shared-memory slot the server reads it from (its dtype and shape given
// here, its bytes in place before the call; the client computes the digest
// from them). A Tensor converts to one: a named tensor is referred to (it
// must outlive the call), a temporary is moved in and kept (so that
// `args.x = MakeTensor();` stays valid until the call).
struct TensorInput {
  TensorInput() = default;
  TensorInput(const Tensor& t) : tensor(&t) {}  // NOLINT: streamed
  TensorInput(Tensor&& t)                       // NOLINT: streamed, kept
      : owned(std::make_shared<const Tensor>(std::move(t))), tensor(owned.get()) {}
  static TensorInput Shm(ShmSlot slot, DType dtype, std::vector<std::int64_t> shape) {
    TensorInput in;
    in.slot = std::move(slot);
    in.dtype = dtype;
    in.shape = std::move(shape);
    return in;
  }
  bool given() const { return tensor != nullptr || slot.has_value(); }

  // A temporary moved in; `tensor` points to it.
  std::shared_ptr<const Tensor> owned;
  const Tensor* tensor = nullptr;
  std::optional<ShmSlot> slot;
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
};

// Where an output of a tensor call goes: streamed back into a new tensor
// (the default), into a caller's tensor (its memory reused when dtype and
// shape fit), or written by the server into a shared-memory slot (its
// offset a multiple of the element size; only for outputs the call makes).
struct TensorOutput {
  static TensorOutput Into(Tensor* t) {
    TensorOutput out;
    out.into = t;
    return out;
  }
  static TensorOutput Shm(ShmSlot slot) {
    TensorOutput out;
    out.slot = std::move(slot);
    return out;
  }

  Tensor* into = nullptr;
  std::optional<ShmSlot> slot;
};

// An output written into shared memory: its dtype, shape and xxh3 (checked
// by the client against the region's bytes) and where it lies.
struct ShmOutput {
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
  std::uint64_t xxh3 = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

// The tensors of each call, by name, for the calls' *Shm methods; the
// plain methods stream every tensor.
struct LogitsShmArgs {
  TensorInput x;  // bf16 [M, K]
  TensorOutput y;
};

struct LogitsShmResult {
  // Y streamed back (unless into the caller's tensor), or in shared memory.
  std::optional<Tensor> y;
  std::optional<ShmOutput> y_shm;
  Timing timing;
};

struct BackwardShmArgs {
  TensorInput dy;  // fp32 or bf16 [M, V]
  TensorInput x;   // bf16 [M, K]
  TensorOutput dx;
  TensorOutput dw;
};

struct BackwardShmResult {
  // Outputs streamed back (asked for, no slot), and those written into
  // shared memory.
  std::optional<Tensor> dx;
  std::optional<Tensor> dw;
  std::optional<ShmOutput> dx_shm;
  std::optional<ShmOutput> dw_shm;
  Timing timing;
};

struct CastShmArgs {
  TensorInput input;  // fp32
  TensorOutput output;
};

struct CastShmResult {
  std::optional<Tensor> output;
  std::optional<ShmOutput> output_shm;
  Timing timing;
};

struct CrossEntropyShmArgs {
  TensorInput x;        // bf16 [M, K]
  TensorInput targets;  // int32 or int64 [M]
  TensorOutput loss;
  TensorOutput lse;
  TensorOutput dx;
  TensorOutput dw;
};

struct CrossEntropyShmResult {
  std::optional<Tensor> loss;
  std::optional<Tensor> lse;
  std::optional<Tensor> dx;
  std::optional<Tensor> dw;
  std::optional<ShmOutput> loss_shm;
  std::optional<ShmOutput> lse_shm;
  std::optional<ShmOutput> dx_shm;
  std::optional<ShmOutput> dw_shm;
  std::int64_t counted_tokens = 0;
  Timing timing;
};

// LogProbs: per-token log-probabilities of the fp32 logits (see
// logitd.v1.LogProbsHeader for the formulas).
struct LogProbsOptions {
  std::int64_t ignore_index = -100;
  // Logits are divided by it before the softmax (> 0).
  float temperature = 1.0f;
  // Tanh soft-capping before the temperature; 0 = off.
  float logit_softcap = 0.0f;
  // 0 to 64 most likely tokens per position.
  std::int64_t top_k = 0;
  bool want_entropy = false;
  bool want_lse = false;
  // The rank of each target (needs targets).
  bool want_rank = false;
  // Vocabulary entries that count (padded vocabularies); 0 means all of V.
  std::int64_t vocab_size = 0;
  // Ask the server to start on the first rows while the rest arrive
  // (LogProbsHeader.pipeline), as LogitsOptions.pipeline: the targets go
  // first, X is written on a thread of its own, the outputs' bits are the
  // same either way.
  bool pipeline = true;
  // LogProbs (not LogProbsShm): spread a call of many rows over this many
  // connections at once (1 to 64), as LogitsOptions.connections: X's and
  // the targets' rows cut at multiples of the weight's logprobs_block_rows,
  // each part a LogProbs call of its own on a connection of its own, its
  // outputs received in place. The same bits. 1 (the default): one call.
  int connections = 1;
};

struct LogProbsShmArgs {
  TensorInput x;        // bf16 [M, K]
  TensorInput targets;  // int32 or int64 [M], optional
  TensorOutput logprob;
  TensorOutput lse;
  TensorOutput entropy;
  TensorOutput topk_ids;
  TensorOutput topk_logprobs;
  TensorOutput rank;
};

struct LogProbsResult {
  // Outputs streamed back: logprob fp32 [M] (with targets), lse and entropy
  // fp32 [M], topk_ids int32 and topk_logprobs fp32 [M, top_k], rank int64 [M].
  std::optional<Tensor> logprob;
  std::optional<Tensor> lse;
  std::optional<Tensor> entropy;
  std::optional<Tensor> topk_ids;
  std::optional<Tensor> topk_logprobs;
  std::optional<Tensor> rank;
  // Outputs written into shared memory.
  std::optional<ShmOutput> logprob_shm;
  std::optional<ShmOutput> lse_shm;
  std::optional<ShmOutput> entropy_shm;
  std::optional<ShmOutput> topk_ids_shm;
  std::optional<ShmOutput> topk_logprobs_shm;
  std::optional<ShmOutput> rank_shm;
  Timing timing;
};

// Verify: another implementation's outputs of one operation, judged against
// logitd's contract (see logitd.proto, VerifyHeader).
enum class VerifyOperation { kLogits, kBackward, kCrossEntropy, kLogProbs };

struct VerifyArgs {
  VerifyOperation operation = VerifyOperation::kLogits;
  // The weight: a registered handle, or w bf16 [V, K] streamed for this
  // call only. Exactly one.
  std::string weight_handle;
  TensorInput w;
  TensorInput x;       // bf16 [M, K]
  TensorInput dy;      // fp32 or bf16 [M, V]; backward only
  float alpha = 1.0f;  // logits only
  // The candidates, by the operation's output names ("y"; "dx", "dw";
  // "loss", "lse"; "logprob", "lse", "entropy"), of its shapes, fp32 or
  // bf16 (the cross-entropy's and LogProbs' fp32 only).
  std::map<std::string, TensorInput> candidates;
  // 0 checks every row of M; else this many (all of them when it is M or
  // more): evenly spaced with the first and the last always included when
  // sample_seed is 0, else drawn uniformly by sample_seed, which finds a bug
  // off the evenly spaced lattice too. dW, the cross-entropy's reduced loss
  // and LogProbs' top-k and ranks need every row: InvalidArgument with them,
  // and with a sample_seed but no sample_rows.
  std::int64_t sample_rows = 0;
  std::uint64_t sample_seed = 0;
  // kCrossEntropy and kLogProbs: int32 or int64 [M] (LogProbs: needed for a
  // logprob candidate), and the operation's options (ignore_index,
  // reduction, z_loss, logit_softcap, grad_scale; ignore_index,
  // temperature, logit_softcap, vocab_size; the rest is not read).
  TensorInput targets;
  CrossEntropyOptions cross_entropy;
  LogProbsOptions logprobs;
  // Set: the server records the run in its history (VerifyResult::run_id);
  // FailedPrecondition from a server that keeps none.
  std::optional<RunLabels> record;
  // With record: compare the candidates with this recorded run of the same
  // project and case (VerifyResult::comparison); NotFound when none.
  std::optional<BaselineSelector> compare;
};

struct VerifyElement {
  std::vector<std::int64_t> index;
  double candidate = 0;
  double reference = 0;
  double bound = 0;                // proven
  double probabilistic_bound = 0;  // never above `bound`; a figure only
  double logitd = 0;               // logitd's own output there
  // Outside the proven bound (wrong for certain); else listed by the
  // precision-class test or the probabilistic figure.
  bool outside_bound = false;
  // Found by the precision-class test: the largest |candidate - reference|
  // a conforming implementation reaches there (0 otherwise).
  double class_threshold = 0;
};

// One row of a candidate in the precision-class test (see logitd.proto,
// RowPrecision).
struct RowPrecision {
  std::int64_t row = 0;
  std::int64_t elements = 0;
  double effective_bits = 0;
  double class_bits = 0;
  double rms_ratio = 0;
  double threshold = 0;
  bool outside = false;
};

// The precision-class test of a candidate (see logitd.proto,
// PrecisionClass): are its errors those of fp32 accumulation?
struct PrecisionClass {
  // False when the test does not apply (integer outputs, a reduced loss:
  // `reason` says why), or for a server that has no such test.
  bool tested = false;
  std::string reason;
  bool outside = false;
  // The bound on the probability that a conforming candidate is found
  // outside.
  double alpha = 0;
  // The candidate's effective precision in bits (24 for fp32's own), and
  // the least a conforming implementation reaches on these inputs.
  double effective_bits = 0;
  double class_bits = 0;
  // The whole tensor's RMS error over the conforming envelope's, and the
  // most a conforming candidate reaches.
  double rms_ratio = 0;
  double threshold = 0;
  std::int64_t elements = 0;
  std::int64_t rows = 0;
  std::int64_t rows_outside = 0;
  std::int64_t elements_outside = 0;
  // The per-token outputs' test on a draw of at most 512 tokens: how many
  // it was drawn from (0: every token tested).
  std::int64_t drawn_from = 0;
  std::vector<RowPrecision> worst_rows;  // at most 8, worst first
  std::string envelope;                  // the implementations it was formed from
};

// "within_bounds", "bitwise_equal_to_logitd" and their "_sampled" forms:
// the verdicts that pass. Decided from the word, not the server's `passed`
// field, which servers before the precision-class test do not set.
inline bool VerdictPassed(absl::string_view verdict) {
  return verdict == "within_bounds" || verdict == "bitwise_equal_to_logitd" ||
         verdict == "within_bounds_sampled" || verdict == "bitwise_equal_to_logitd_sampled";
}

struct CandidateVerdict {
  std::string name;
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
  std::uint64_t xxh3 = 0;
  std::int64_t elements = 0;
  // Outside the proven bound: wrong for certain.
  std::int64_t outside_bound = 0;
  double worst_bound_fraction = 0;
  // Outside the probabilistic bound, and logitd's own output outside it:
  // figures kept for comparison, which decide no verdict (see
  // logitd.proto).
  std::int64_t outside_probabilistic_bound = 0;
  double worst_probabilistic_fraction = 0;
  std::int64_t logitd_outside_probabilistic_bound = 0;
  // At most 32: those outside the proven bound first, then those the
  // precision-class test found, then those outside the probabilistic
  // figure.
  std::vector<VerifyElement> first_outside;
  PrecisionClass precision_class;
  std::int64_t nan_inf_mismatches = 0;
  double bitwise_equal_fraction = 0;
  // ULP distance from logitd's own output.
  std::int64_t max_ulp = 0;
  std::int64_t p99_ulp = 0;
  std::int64_t p50_ulp = 0;
  // ULP distance from the exact value correctly rounded to the dtype; -1
  // for integer outputs and from servers that do not report it.
  std::int64_t max_ulp_exact = -1;
  std::int64_t p99_ulp_exact = -1;
  std::int64_t p50_ulp_exact = -1;
  // |candidate - reference| / bound in ten bins (see logitd.proto).
  std::vector<std::int64_t> error_histogram;
  // Worst first: "outside_bounds" (wrong for certain),
  // "outside_precision_class" (inside the proven bound, but the errors are
  // not those of fp32 accumulation), "within_bounds",
  // "bitwise_equal_to_logitd"; with sampled rows the passing two end in
  // "_sampled". (Servers before the precision-class test said
  // "outside_probabilistic_bounds" where this says
  // "outside_precision_class".)
  std::string verdict;
  bool passed() const { return VerdictPassed(verdict); }
};

struct VerifyResult {
  std::vector<CandidateVerdict> candidates;
  std::string verdict;  // the worst of the candidates'
  // With sample_rows: the rows of M checked, of rows_total (0 from servers
  // that do not report it), and the sample's seed (0: evenly spaced).
  std::vector<std::int64_t> rows_checked;
  std::int64_t rows_total = 0;
  std::uint64_t sample_seed = 0;
  std::uint64_t inputs_xxh3 = 0;
  Timing timing;  // receiving, and logitd's own outputs
  std::int64_t reference_us = 0;
  // Where the fp64 products were formed ("cuBLAS DGEMM on ...", "OpenBLAS
  // dgemm on the host").
  std::string reference_engine;
  // The recorded run's id (VerifyArgs::record); 0 when not recorded.
  std::int64_t run_id = 0;
  std::optional<RunComparison> comparison;  // with VerifyArgs::compare
  std::vector<Alert> alerts;                // the project's rules it broke (history_types.h)
  std::string record_error;                 // why a run asked to be recorded was not ("": it was)
  bool passed() const { return VerdictPassed(verdict); }
  const CandidateVerdict* Find(const std::string& name) const {
    for (const CandidateVerdict& c : candidates) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }
};

}  // namespace logitd::client
