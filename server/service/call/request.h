// A tensor call as every front door hands it to the service, whatever its
// wire: logitd.v1's streaming RPCs and the Open Inference Protocol's
// ModelInfer both translate their request into one of these, then run the
// same validation (plans.h), admission and operation (ops.h). Nothing here
// knows a proto message.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/service/state/shm.h"

namespace logitd::service {

// Resolves a tensor's shared-memory slot once its byte count is known: the
// slice, checked against `bytes` (exactly, for an input; at least, for an
// output) and `align` (outputs). Each front door binds its own registry and
// reference (logitd.v1's RegisterShm handles, the OIP's named regions).
using ShmResolver = std::function<absl::StatusOr<ShmSlice>(
    absl::string_view what, std::uint64_t bytes, bool is_output, std::uint64_t align)>;

// An input tensor as the request describes it.
struct CallInput {
  // The request carries this tensor. A front door refuses a missing required
  // input in its own terms before translating; an optional one (targets of
  // LogProbs) is simply not given.
  bool given = false;
  // The name its bytes travel under (logitd.v1 chunks name their tensor).
  std::string name;
  // The element type as the request spells it, upper case: "BF16", "FP32",
  // "INT32", "INT64", or any other word the request used (refused, named).
  std::string dtype;
  std::vector<std::int64_t> shape;
  // The xxh3-64 of its bytes the request announces; nullopt where the wire
  // carries none (a whole tensor in one message).
  std::optional<std::uint64_t> xxh3;

  // Where its bytes are.
  enum class From {
    kStream,   // chunks that follow the request's first message
    kMessage,  // `message`, inside the request message itself
    kShm,      // a shared-memory slot, resolved by `shm`
  };
  From from = From::kStream;
  absl::string_view message;
  ShmResolver shm;
};

// Where an output goes when not the front door's default (streamed after the
// result, or inside the response message): a shared-memory slot.
struct CallOutput {
  ShmResolver shm;
};
// Outputs by name; an output named here is asked for in shared memory.
using CallOutputs = std::map<std::string, CallOutput>;

// Options spelt as the request gave them: an empty dtype or a zero scale is
// "unspecified" (the default), as logitd.v1's proto3 fields say it.
struct LogitsRequest {
  std::string weight_handle;
  CallInput x;
  std::string out_dtype;  // "", "FP32" or "BF16"
  float alpha = 0.0f;     // 0 means 1
  CallOutputs outputs;    // "y"
};

struct BackwardRequest {
  std::string weight_handle;
  CallInput dy;
  CallInput x;
  bool want_dx = false;
  bool want_dw = false;
  bool accumulate_dw = false;
  std::string dx_dtype;  // "", "BF16" or "FP32"
  std::string dw_dtype;  // "", "FP32" or "BF16"
  CallOutputs outputs;   // "dx", "dw"
};

struct CastRequest {
  CallInput input;
  CallOutputs outputs;  // "output"
};

enum class Reduction { kUnspecified, kNone, kSum, kMean };

struct CrossEntropyRequest {
  std::string weight_handle;
  CallInput x;
  CallInput targets;
  std::optional<std::int64_t> ignore_index;  // nullopt means -100
  Reduction reduction = Reduction::kUnspecified;
  // A reduction value the front door could not name (refused, with it).
  std::string reduction_unknown;
  float z_loss = 0.0f;
  float logit_softcap = 0.0f;
  float grad_scale = 0.0f;  // 0 means 1
  bool want_lse = false;
  bool want_dx = false;
  bool want_dw = false;
  bool accumulate_dw = false;
  std::string dx_dtype;  // "", "BF16" or "FP32"
  CallOutputs outputs;   // "loss", "lse", "dx", "dw"
};

struct LogProbsRequest {
  std::string weight_handle;
  CallInput x;
  CallInput targets;                         // optional
  std::optional<std::int64_t> ignore_index;  // nullopt means -100
  float temperature = 0.0f;                  // 0 means 1
  float logit_softcap = 0.0f;
  std::int64_t vocab_size = 0;  // 0 means the weight's V
  std::int64_t top_k = 0;
  bool want_entropy = false;
  bool want_lse = false;
  bool want_rank = false;
  CallOutputs outputs;  // "logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank"
};

// Verify: another implementation's outputs of one operation, with the
// operation's inputs (verify.h).
enum class VerifyOperation { kUnspecified, kLogits, kBackward, kCrossEntropy, kLogProbs, kUnknown };

struct VerifyRequest {
  VerifyOperation operation = VerifyOperation::kUnspecified;
  // How the request spelt the operation, for messages ("VERIFY_LOGITS", or
  // the number of one this build does not know).
  std::string operation_name;
  // The weight: a registered handle, or `w` streamed (exactly one).
  std::string weight_handle;
  CallInput w;
  CallInput x;
  CallInput dy;        // backward
  float alpha = 0.0f;  // logits; 0 means 1
  std::int64_t sample_rows = 0;
  // With sample_rows: 0 for evenly spaced rows, else the seed of a uniform
  // random sample of them.
  std::uint64_t sample_seed = 0;
  // Digest each candidate in blocks of rows (VerifiedCandidate::block_xxh3):
  // the run is recorded, and its history keeps them.
  bool block_digests = false;
  // Named as the operation names its outputs ("y"; "dx", "dw"; "loss",
  // "lse"; "logprob", "lse", "entropy").
  std::vector<CallInput> candidates;
  CallInput targets;  // cross entropy (required), log probs (optional)
  // The options of the cross-entropy and of LogProbs, as their own requests
  // carry them; their tensors, wants and outputs are not read.
  CrossEntropyRequest cross_entropy;
  LogProbsRequest logprobs;
};

}  // namespace logitd::service
