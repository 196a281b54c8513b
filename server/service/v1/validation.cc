#include "server/service/v1/validation.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "logitd/status_macros.h"
#include "server/service/call/ops.h"
#include "server/service/v1/requests.h"

namespace logitd::service {
namespace {

std::vector<std::int64_t> ShapeOf(const v1::TensorSpec& spec) {
  return {spec.shape().begin(), spec.shape().end()};
}

}  // namespace

absl::StatusOr<std::filesystem::path> ResolveWeightPath(const std::filesystem::path& dir,
                                                        absl::string_view relative) {
  namespace fs = std::filesystem;
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "this server was started without --weights_dir, so it loads no weights from files");
  }
  if (relative.empty()) {
    return absl::InvalidArgumentError(
        "path: expected a file relative to the server's --weights_dir, got an empty path");
  }
  if (relative.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path: expected a file name, got one with a NUL byte");
  }
  const fs::path rel{std::string(relative)};
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    return absl::PermissionDeniedError(
        absl::StrCat("path '", relative,
                     "': expected a path relative to the server's --weights_dir, got an "
                     "absolute one"));
  }
  for (const fs::path& part : rel) {
    if (part == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("path '", relative,
                       "': expected a path inside the server's --weights_dir, got one "
                       "with a '..' component"));
    }
  }
  std::error_code ec;
  // Messages name only what the caller sent: the server's own paths are
  // the operator's business (its log has them).
  const fs::path root = fs::canonical(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("the server's --weights_dir cannot be resolved (", ec.message(),
                     "); its operator must fix it"));
  }
  const fs::path resolved = fs::weakly_canonical(root / rel, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("path '", relative, "' cannot be resolved: ", ec.message()));
  }
  // Inside means: every component of root, then at least one more.
  auto r = root.begin();
  auto p = resolved.begin();
  for (; r != root.end() && p != resolved.end(); ++r, ++p) {
    if (*r != *p) break;
  }
  if (r != root.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "path '", relative, "' leads outside the server's --weights_dir (symbolic links count)"));
  }
  if (p == resolved.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path '", relative, "' names the --weights_dir itself; expected a file in it"));
  }
  const fs::file_status status = fs::status(resolved, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat("path '", relative, "': no such file in the server's --weights_dir"));
  }
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path '", relative, "': expected a safetensors file, got a directory or special file"));
  }
  return resolved;
}

absl::Status ValidateHandle(absl::string_view handle) {
  if (handle.empty()) {
    return absl::InvalidArgumentError(
        "weight_handle: expected a handle from RegisterWeight, got an empty string");
  }
  return absl::OkStatus();
}

absl::StatusOr<WeightPlan> ValidateRegisterWeight(const v1::RegisterWeightHeader& header) {
  if (header.name().size() > kMaxWeightNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name: expected at most ", kMaxWeightNameBytes,
                                                   " bytes, got ", header.name().size()));
  }
  const v1::TensorSpec& w = header.weight();
  LOGITD_RETURN_IF_ERROR(CheckRequestSpec("weight", header.has_weight(), w, /*streamed=*/false));
  if (w.dtype() != v1::DTYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight: expected dtype BF16, got ", ProtoDTypeName(w.dtype())));
  }
  return WeightPlanOf(ShapeOf(w));
}

absl::StatusOr<WeightPlan> WeightPlanOf(const std::vector<std::int64_t>& shape) {
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight: expected rank 2 [V, K], got ", ShapeString(shape)));
  }
  // The fp32 gradient buffer may follow; its size must be representable too.
  absl::StatusOr<std::int64_t> grad_bytes = CheckedByteCount(shape, DType::kFp32);
  if (!grad_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("weight: ", grad_bytes.status().message()));
  }
  WeightPlan plan;
  plan.v = shape[0];
  plan.k = shape[1];
  plan.bytes = static_cast<std::uint64_t>(*grad_bytes) / 2;
  return plan;
}

absl::StatusOr<LogitsPlan> ValidateLogits(const v1::LogitsHeader& header, const WeightDims& weight,
                                          std::uint64_t max_request_bytes) {
  LOGITD_ASSIGN_OR_RETURN(const LogitsRequest request,
                          RequestOf(&LogitsRequestFrom, header, V1Shm{}));
  return PlanLogits(request, weight, max_request_bytes);
}

absl::StatusOr<BackwardPlan> ValidateBackward(const v1::BackwardHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes) {
  LOGITD_ASSIGN_OR_RETURN(const BackwardRequest request,
                          RequestOf(&BackwardRequestFrom, header, V1Shm{}));
  return PlanBackward(request, weight, max_request_bytes);
}

absl::StatusOr<CrossEntropyPlan> ValidateCrossEntropy(const v1::CrossEntropyHeader& header,
                                                      const WeightDims& weight,
                                                      std::uint64_t max_request_bytes) {
  LOGITD_ASSIGN_OR_RETURN(const CrossEntropyRequest request,
                          RequestOf(&CrossEntropyRequestFrom, header, V1Shm{}));
  return PlanCrossEntropy(request, weight, max_request_bytes);
}

absl::StatusOr<CastPlan> ValidateCast(const v1::CastHeader& header,
                                      std::uint64_t max_request_bytes) {
  LOGITD_ASSIGN_OR_RETURN(const CastRequest request, RequestOf(&CastRequestFrom, header, V1Shm{}));
  return PlanCast(request, max_request_bytes);
}

absl::StatusOr<ProbePlan> ValidateProbe(const v1::ProbeHeader& header, std::size_t chunk_bytes,
                                        std::uint64_t max_request_bytes) {
  ProbePlan plan;
  plan.request_bytes = header.request_bytes();
  plan.response_bytes = header.response_bytes();
  if (header.chunk_bytes() > chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "probe: chunk_bytes: expected 1 to %d (the server's --chunk_bytes) or 0 for that, got %d",
        chunk_bytes, header.chunk_bytes()));
  }
  plan.chunk_bytes =
      header.chunk_bytes() == 0 ? chunk_bytes : static_cast<std::size_t>(header.chunk_bytes());
  const bool overflow =
      plan.request_bytes > std::numeric_limits<std::uint64_t>::max() - plan.response_bytes;
  if (overflow || plan.request_bytes + plan.response_bytes > max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "probe: request_bytes %d and response_bytes %d need %s bytes in one call, over the limit "
        "of %d bytes per call (server flag --max_request_bytes)",
        plan.request_bytes, plan.response_bytes,
        overflow ? std::string("more than 2^64")
                 : absl::StrCat(plan.request_bytes + plan.response_bytes),
        max_request_bytes));
  }
  return plan;
}

absl::StatusOr<LogProbsPlan> ValidateLogProbs(const v1::LogProbsHeader& header,
                                              const WeightDims& weight,
                                              std::uint64_t max_request_bytes) {
  LOGITD_ASSIGN_OR_RETURN(const LogProbsRequest request,
                          RequestOf(&LogProbsRequestFrom, header, V1Shm{}));
  return PlanLogProbs(request, weight, max_request_bytes);
}

}  // namespace logitd::service
