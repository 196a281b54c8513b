// --compare: the same suites, with the same seed, against two servers; every
// output a case receives is recorded on each side (OutputLog) and the two
// records are compared element by element: the bitwise-equal fraction and
// the distance in units in the last place (ULP) of the output's dtype. Each
// side's own verdicts against fp64 say whether it is within its bounds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/validate/harness.h"
#include "logitd/tensor.h"
#include "nlohmann/json.hpp"

namespace logitd::validate {

// An output as recorded: its dtype, element count and the bit patterns of
// its elements (every one up to kMaxRecordedElements; beyond that an evenly
// spaced sample of them, the same elements on both sides).
struct RecordedOutput {
  std::string key;  // "suite/case: what", with " #n" from the second on
  DType dtype = DType::kFp32;
  std::int64_t numel = 0;
  std::int64_t stride = 1;  // every stride-th element was kept
  std::vector<std::uint64_t> bits;
};

inline constexpr std::int64_t kMaxRecordedElements = std::int64_t{1} << 22;

class OutputLog : public OutputRecorder {
 public:
  void Record(absl::string_view case_name, absl::string_view what, const Tensor& t) override;
  const std::vector<RecordedOutput>& outputs() const { return outputs_; }

 private:
  std::map<std::string, int> seen_;
  std::vector<RecordedOutput> outputs_;
};

// ULP distance of two elements of `dtype` given as bit patterns: for floats
// the distance between their positions on the ordered line of values (-0 and
// +0 the same place), 0 for two NaNs and UINT64_MAX for a NaN against a
// number; for integers |a - b|.
std::uint64_t UlpDistance(DType dtype, std::uint64_t a, std::uint64_t b);

struct OutputDiff {
  std::string key;
  DType dtype = DType::kFp32;
  std::int64_t compared = 0;  // elements compared
  double equal_fraction = 0;  // bitwise
  std::uint64_t max_ulp = 0;
  std::uint64_t p50_ulp = 0;
  std::uint64_t p99_ulp = 0;
};

// A case's largest "…worst_bound_fraction" figure on each side (error
// against fp64 as a fraction of its bound); negative where it has none.
struct CaseBounds {
  std::string name;
  double a = -1;
  double b = -1;
  bool a_passed = true;
  bool b_passed = true;
};

struct CompareReport {
  std::string a_address, b_address;
  std::vector<OutputDiff> outputs;
  std::vector<std::string> only_in_a, only_in_b;
  std::vector<CaseBounds> cases;
  // "identical", "different, both within bounds" or "outside its bounds".
  std::string verdict;
  int exit_code = 0;
};

CompareReport CompareRuns(const std::string& a_address, const std::vector<RecordedOutput>& a,
                          const std::vector<CaseResult>& a_results, const std::string& b_address,
                          const std::vector<RecordedOutput>& b,
                          const std::vector<CaseResult>& b_results);

std::string CompareText(const CompareReport& report);
nlohmann::ordered_json CompareJson(const CompareReport& report);

}  // namespace logitd::validate
