// The harness's suites, by name, in the order they run. determinism runs
// last because it replays the first request of every other selected suite.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/validate/harness.h"

namespace logitd::validate {

std::unique_ptr<Suite> MakeIntegerExactSuite();
std::unique_ptr<Suite> MakeRoundingErrorSuite();
std::unique_ptr<Suite> MakeBackwardContractSuite();
std::unique_ptr<Suite> MakeSpecialValuesSuite();
std::unique_ptr<Suite> MakeCrossEntropySuite();
std::unique_ptr<Suite> MakeLogProbsSuite();
std::unique_ptr<Suite> MakeGoldenSuite();
std::unique_ptr<Suite> MakeDeterminismSuite();

// Every suite name in run order.
const std::vector<std::string>& AllSuiteNames();
// Null for an unknown name.
std::unique_ptr<Suite> MakeSuite(absl::string_view name);

}  // namespace logitd::validate
