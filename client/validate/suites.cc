#include "client/validate/suites.h"

namespace logitd::validate {

const std::vector<std::string>& AllSuiteNames() {
  static const std::vector<std::string>* const kNames = new std::vector<std::string>{
      "integer_exact", "rounding_error", "backward_contract", "special_values", "cross_entropy",
      "logprobs",      "golden",         "determinism"};
  return *kNames;
}

std::unique_ptr<Suite> MakeSuite(absl::string_view name) {
  if (name == "integer_exact") return MakeIntegerExactSuite();
  if (name == "rounding_error") return MakeRoundingErrorSuite();
  if (name == "backward_contract") return MakeBackwardContractSuite();
  if (name == "special_values") return MakeSpecialValuesSuite();
  if (name == "cross_entropy") return MakeCrossEntropySuite();
  if (name == "logprobs") return MakeLogProbsSuite();
  if (name == "golden") return MakeGoldenSuite();
  if (name == "determinism") return MakeDeterminismSuite();
  return nullptr;
}

}  // namespace logitd::validate
