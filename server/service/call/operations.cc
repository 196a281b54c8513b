#include "server/service/call/operations.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kWeight[] = {"weight"};
constexpr absl::string_view kX[] = {"x"};
constexpr absl::string_view kY[] = {"y"};
constexpr absl::string_view kDyX[] = {"dy", "x"};
constexpr absl::string_view kDxDw[] = {"dx", "dw"};
constexpr absl::string_view kDw[] = {"dw"};
constexpr absl::string_view kInput[] = {"input"};
constexpr absl::string_view kOutput[] = {"output"};
constexpr absl::string_view kXTargets[] = {"x", "targets"};
constexpr absl::string_view kCeOutputs[] = {"loss", "lse", "dx", "dw"};
constexpr absl::string_view kLpOutputs[] = {"logprob",  "lse",           "entropy",
                                            "topk_ids", "topk_logprobs", "rank"};
constexpr absl::string_view kVerifyInputs[] = {"w", "x", "dy", "targets"};

// A span of no tensors.
constexpr absl::Span<const absl::string_view> Empty() { return {}; }

const OperationInfo kOperations[] = {
    {"GetServerInfo", false, Empty(), Empty(), std::nullopt},
    {"RegisterWeight", true, kWeight, Empty(), std::nullopt},
    {"LoadWeight", true, Empty(), Empty(), std::nullopt},
    {"ListWeights", false, Empty(), Empty(), std::nullopt},
    {"ReleaseWeight", false, Empty(), Empty(), std::nullopt},
    {"Logits", true, kX, kY, VerifyOperation::kLogits},
    {"Backward", true, kDyX, kDxDw, VerifyOperation::kBackward},
    {"FetchGradient", true, Empty(), kDw, std::nullopt},
    {"ZeroGradient", true, Empty(), Empty(), std::nullopt},
    {"Cast", true, kInput, kOutput, std::nullopt},
    {"CrossEntropy", true, kXTargets, kCeOutputs, VerifyOperation::kCrossEntropy},
    {"LogProbs", true, kXTargets, kLpOutputs, VerifyOperation::kLogProbs},
    {"Verify", true, kVerifyInputs, Empty(), std::nullopt},
    {"ListRuns", false, Empty(), Empty(), std::nullopt},
    {"ListProjects", false, Empty(), Empty(), std::nullopt},
    {"ListCases", false, Empty(), Empty(), std::nullopt},
    {"PromoteRun", false, Empty(), Empty(), std::nullopt},
    {"SetRules", false, Empty(), Empty(), std::nullopt},
    {"ListRules", false, Empty(), Empty(), std::nullopt},
    {"DeleteProject", false, Empty(), Empty(), std::nullopt},
    {"RecordValidation", false, Empty(), Empty(), std::nullopt},
    {"Probe", false, Empty(), Empty(), std::nullopt},
    {"RegisterShm", false, Empty(), Empty(), std::nullopt},
    {"ReleaseShm", false, Empty(), Empty(), std::nullopt},
};

}  // namespace

absl::Span<const OperationInfo> Operations() { return kOperations; }

const OperationInfo* FindOperation(absl::string_view method) {
  for (const OperationInfo& op : kOperations) {
    if (op.method == method) return &op;
  }
  return nullptr;
}

const OperationInfo* FindVerifiable(VerifyOperation operation) {
  for (const OperationInfo& op : kOperations) {
    if (op.verify == operation) return &op;
  }
  return nullptr;
}

}  // namespace logitd::service
