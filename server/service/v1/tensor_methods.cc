#include "server/service/v1/tensor_methods.h"

#include "logitd/v1/logitd.pb.h"

namespace logitd::service {
namespace {

void FillCountedTokens(const OpResult& result, v1::CrossEntropyResponse* head) {
  head->mutable_result()->set_counted_tokens(result.counted_tokens);
}

const V1Method kMethods[] = {
    {"Logits", &ServeTensorOp<v1::LogitsRequest, v1::LogitsResponse, &LogitsRequestOf, &RunLogits>},
    {"Backward",
     &ServeTensorOp<v1::BackwardRequest, v1::BackwardResponse, &BackwardRequestOf, &RunBackward>},
    {"Cast", &ServeTensorOp<v1::CastRequest, v1::CastResponse, &CastRequestOf, &RunCast>},
    {"CrossEntropy", &ServeTensorOp<v1::CrossEntropyRequest, v1::CrossEntropyResponse,
                                    &CrossEntropyRequestOf, &RunCrossEntropy, &FillCountedTokens>},
    {"LogProbs",
     &ServeTensorOp<v1::LogProbsRequest, v1::LogProbsResponse, &LogProbsRequestOf, &RunLogProbs>},
};

}  // namespace

absl::Span<const V1Method> V1TensorMethods() { return kMethods; }

const V1Method* FindV1TensorMethod(absl::string_view method) {
  for (const V1Method& m : kMethods) {
    if (m.method == method) return &m;
  }
  return nullptr;
}

}  // namespace logitd::service
