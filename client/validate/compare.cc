#include "client/validate/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/validate/report.h"

namespace logitd::validate {
namespace {

std::uint64_t RawBits(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::kBf16:
      return t.data<std::uint16_t>()[i];
    case DType::kFp32:
    case DType::kInt32:
      return t.data<std::uint32_t>()[i];
    case DType::kInt64:
      return t.data<std::uint64_t>()[i];
  }
  return 0;
}

// The position of a float's bits on the ordered line of values: -0 and +0
// at 0, negatives below. `sign` is the sign bit of the width.
std::int64_t Ordered(std::uint64_t bits, std::uint64_t sign) {
  const auto magnitude = static_cast<std::int64_t>(bits & (sign - 1));
  return (bits & sign) != 0 ? -magnitude : magnitude;
}

bool IsNan(DType dtype, std::uint64_t bits) {
  if (dtype == DType::kBf16) return (bits & 0x7fffu) > 0x7f80u;
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

// The largest "…worst_bound_fraction" number anywhere in a case's figures.
double WorstBoundFraction(const nlohmann::ordered_json& j) {
  double worst = -1;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      const std::string suffix = "worst_bound_fraction";
      if (it.value().is_number() && key.size() >= suffix.size() &&
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
        worst = std::max(worst, it.value().get<double>());
      } else {
        worst = std::max(worst, WorstBoundFraction(it.value()));
      }
    }
  } else if (j.is_array()) {
    for (const auto& e : j) worst = std::max(worst, WorstBoundFraction(e));
  }
  return worst;
}

OutputDiff CompareOutput(const RecordedOutput& a, const RecordedOutput& b) {
  OutputDiff c;
  c.key = a.key;
  c.dtype = a.dtype;
  const std::size_t n = std::min(a.bits.size(), b.bits.size());
  c.compared = static_cast<std::int64_t>(n);
  std::vector<std::uint64_t> ulps(n);
  std::int64_t equal = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ulps[i] = UlpDistance(a.dtype, a.bits[i], b.bits[i]);
    equal += a.bits[i] == b.bits[i] ? 1 : 0;
  }
  c.equal_fraction = n == 0 ? 1.0 : static_cast<double>(equal) / static_cast<double>(n);
  if (n > 0) {
    std::sort(ulps.begin(), ulps.end());
    c.max_ulp = ulps.back();
    c.p50_ulp = ulps[n / 2];
    c.p99_ulp = ulps[std::min(n - 1, n * 99 / 100)];
  }
  return c;
}

bool Failed(const CaseResult& r) { return r.verdict == Verdict::kFailed; }

std::string UlpText(std::uint64_t ulp) {
  return ulp == std::numeric_limits<std::uint64_t>::max() ? "NaN" : absl::StrCat(ulp);
}

}  // namespace

void OutputLog::Record(absl::string_view case_name, absl::string_view what, const Tensor& t) {
  std::string key = absl::StrCat(case_name, ": ", what);
  const int n = seen_[key]++;
  if (n > 0) absl::StrAppend(&key, " #", n + 1);
  RecordedOutput out;
  out.key = std::move(key);
  out.dtype = t.dtype();
  out.numel = t.numel();
  out.stride =
      std::max<std::int64_t>(1, (t.numel() + kMaxRecordedElements - 1) / kMaxRecordedElements);
  out.bits.reserve(static_cast<std::size_t>(t.numel() / out.stride + 1));
  for (std::int64_t i = 0; i < t.numel(); i += out.stride) out.bits.push_back(RawBits(t, i));
  outputs_.push_back(std::move(out));
}

std::uint64_t UlpDistance(DType dtype, std::uint64_t a, std::uint64_t b) {
  if (dtype == DType::kInt32 || dtype == DType::kInt64) {
    const std::int64_t x =
        dtype == DType::kInt32 ? static_cast<std::int32_t>(a) : static_cast<std::int64_t>(a);
    const std::int64_t y =
        dtype == DType::kInt32 ? static_cast<std::int32_t>(b) : static_cast<std::int64_t>(b);
    return x > y ? static_cast<std::uint64_t>(x) - static_cast<std::uint64_t>(y)
                 : static_cast<std::uint64_t>(y) - static_cast<std::uint64_t>(x);
  }
  const bool na = IsNan(dtype, a);
  const bool nb = IsNan(dtype, b);
  if (na || nb) return na && nb ? 0 : std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t sign = dtype == DType::kBf16 ? 0x8000u : 0x80000000u;
  const std::int64_t d = Ordered(a, sign) - Ordered(b, sign);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

CompareReport CompareRuns(const std::string& a_address, const std::vector<RecordedOutput>& a,
                          const std::vector<CaseResult>& a_results, const std::string& b_address,
                          const std::vector<RecordedOutput>& b,
                          const std::vector<CaseResult>& b_results) {
  CompareReport r;
  r.a_address = a_address;
  r.b_address = b_address;
  std::map<std::string, const RecordedOutput*> by_key;
  for (const RecordedOutput& o : b) by_key[o.key] = &o;
  std::set<std::string> matched;
  for (const RecordedOutput& o : a) {
    auto it = by_key.find(o.key);
    if (it == by_key.end() || it->second->dtype != o.dtype || it->second->numel != o.numel) {
      r.only_in_a.push_back(o.key);
      continue;
    }
    matched.insert(o.key);
    r.outputs.push_back(CompareOutput(o, *it->second));
  }
  for (const RecordedOutput& o : b) {
    if (matched.count(o.key) == 0) r.only_in_b.push_back(o.key);
  }
  std::map<std::string, CaseBounds> cases;
  for (const CaseResult& c : a_results) {
    CaseBounds& cb = cases[c.FullName()];
    cb.name = c.FullName();
    cb.a = WorstBoundFraction(c.figures);
    cb.a_passed = !Failed(c);
  }
  for (const CaseResult& c : b_results) {
    CaseBounds& cb = cases[c.FullName()];
    cb.name = c.FullName();
    cb.b = WorstBoundFraction(c.figures);
    cb.b_passed = !Failed(c);
  }
  bool both_pass = true;
  for (auto& [name, cb] : cases) {
    both_pass = both_pass && cb.a_passed && cb.b_passed;
    r.cases.push_back(cb);
  }
  const bool identical = r.only_in_a.empty() && r.only_in_b.empty() &&
                         std::all_of(r.outputs.begin(), r.outputs.end(),
                                     [](const OutputDiff& c) { return c.equal_fraction == 1.0; });
  if (!both_pass) {
    r.verdict = "outside its bounds";
    r.exit_code = 1;
  } else {
    r.verdict = identical ? "identical" : "different, both within bounds";
  }
  return r;
}

std::string CompareText(const CompareReport& r) {
  std::string out = absl::StrFormat("\ncompare: A %s, B %s\n", r.a_address, r.b_address);
  absl::StrAppendFormat(&out, "%-58s %-5s %10s %9s %9s %9s\n", "output", "dtype", "equal",
                        "max ulp", "p99 ulp", "p50 ulp");
  int shown = 0;
  for (const OutputDiff& c : r.outputs) {
    if (c.equal_fraction == 1.0) continue;
    absl::StrAppendFormat(&out, "%-58s %-5s %9.4f%% %9s %9s %9s\n", c.key.substr(0, 58),
                          DTypeName(c.dtype), 100 * c.equal_fraction, UlpText(c.max_ulp),
                          UlpText(c.p99_ulp), UlpText(c.p50_ulp));
    ++shown;
  }
  absl::StrAppendFormat(&out, "%d of %d outputs bitwise equal\n",
                        static_cast<int>(r.outputs.size()) - shown,
                        static_cast<int>(r.outputs.size()));
  for (const std::string& k : r.only_in_a) absl::StrAppend(&out, "only from A: ", k, "\n");
  for (const std::string& k : r.only_in_b) absl::StrAppend(&out, "only from B: ", k, "\n");
  for (const CaseBounds& c : r.cases) {
    if (c.a_passed && c.b_passed) continue;
    absl::StrAppendFormat(&out, "%s: A %s, B %s\n", c.name, c.a_passed ? "passed" : "FAILED",
                          c.b_passed ? "passed" : "FAILED");
  }
  double worst_a = -1, worst_b = -1;
  for (const CaseBounds& c : r.cases) {
    worst_a = std::max(worst_a, c.a);
    worst_b = std::max(worst_b, c.b);
  }
  if (worst_a >= 0 || worst_b >= 0) {
    absl::StrAppendFormat(&out,
                          "worst error against fp64 as a fraction of its bound: A %.4g, B %.4g\n",
                          worst_a, worst_b);
  }
  absl::StrAppend(&out, "compare verdict: ", r.verdict, "\n");
  return out;
}

nlohmann::ordered_json CompareJson(const CompareReport& r) {
  nlohmann::ordered_json j;
  j["a"] = r.a_address;
  j["b"] = r.b_address;
  j["verdict"] = r.verdict;
  nlohmann::ordered_json outputs = nlohmann::ordered_json::array();
  for (const OutputDiff& c : r.outputs) {
    outputs.push_back({{"output", c.key},
                       {"dtype", DTypeName(c.dtype)},
                       {"compared", c.compared},
                       {"equal_fraction", JsonNumber(c.equal_fraction)},
                       {"max_ulp", UlpText(c.max_ulp)},
                       {"p99_ulp", UlpText(c.p99_ulp)},
                       {"p50_ulp", UlpText(c.p50_ulp)}});
  }
  j["outputs"] = std::move(outputs);
  j["only_in_a"] = r.only_in_a;
  j["only_in_b"] = r.only_in_b;
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const CaseBounds& c : r.cases) {
    cases.push_back({{"case", c.name},
                     {"a_passed", c.a_passed},
                     {"b_passed", c.b_passed},
                     {"a_worst_bound_fraction", JsonNumber(c.a)},
                     {"b_worst_bound_fraction", JsonNumber(c.b)}});
  }
  j["cases"] = std::move(cases);
  return j;
}

}  // namespace logitd::validate
