#include "client/validate/verify_verdicts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/validate/report.h"
#include "nlohmann/json.hpp"

namespace logitd::validate {
namespace {

// A fraction as a percentage with the digits it needs: "0.003%" rather than
// "0.00%" for a few elements of many, "100%" only when it is all of them.
std::string Percent(double fraction) {
  const double p = 100.0 * fraction;
  if (p == 0 || p == 100) return absl::StrFormat("%.0f%%", p);
  if (p > 99.99) return absl::StrFormat("%.6g%%", p);
  return p < 0.01 ? absl::StrFormat("%.2g%%", p) : absl::StrFormat("%.2f%%", p);
}

// "[3, 41]": an element's index.
std::string IndexText(const client::VerifyElement& e) {
  return absl::StrCat("[", absl::StrJoin(e.index, ", "), "]");
}

// An element as the failures list it: its values, what it was held to, and
// logitd's own value there.
std::string ElementText(const client::VerifyElement& e) {
  std::string text =
      absl::StrFormat("%s: candidate %.9g, fp64 reference %.17g, |error| %.3e", IndexText(e),
                      e.candidate, e.reference, std::fabs(e.candidate - e.reference));
  if (e.outside_bound) {
    absl::StrAppendFormat(&text, ", outside its proven bound %.3e", e.bound);
  } else if (e.class_threshold > 0) {
    absl::StrAppendFormat(&text, ", over its class threshold %.3e", e.class_threshold);
    // The precision-class test's elements may come without their bound and
    // logitd's value (0 then).
    if (e.bound == 0) return text;
    absl::StrAppendFormat(&text, " (proven bound %.3e)", e.bound);
  } else {
    // Listed for the probabilistic figure, which decides nothing now.
    absl::StrAppendFormat(&text, ", outside the probabilistic figure %.3e (proven bound %.3e)",
                          e.probabilistic_bound, e.bound);
  }
  absl::StrAppendFormat(&text, ", logitd %.9g", e.logitd);
  return text;
}

// The first element the server listed as outside the proven bound, or found
// by the precision-class test (it lists those first, in that order).
const client::VerifyElement* FirstListed(const client::CandidateVerdict& c, bool proven) {
  for (const client::VerifyElement& e : c.first_outside) {
    if (proven ? e.outside_bound : (!e.outside_bound && e.class_threshold > 0)) return &e;
  }
  return nullptr;
}

// "effective precision 11.2 bits (the envelope's 18.5)": the least the
// conforming implementations reach on these inputs.
std::string PrecisionText(const client::PrecisionClass& p) {
  if (!p.tested) {
    return p.reason.empty() ? "precision class not tested"
                            : absl::StrCat("precision class not tested (", p.reason, ")");
  }
  std::string text = absl::StrFormat("effective precision %.1f bits (the envelope's %.1f)",
                                     p.effective_bits, p.class_bits);
  if (p.drawn_from > 0) {
    absl::StrAppendFormat(&text, " over %d tokens drawn of %d", p.rows, p.drawn_from);
  }
  return text;
}

// "ulp vs logitd's: max 3, p99 1, p50 0; ulp vs correctly rounded: ...";
// the second only where the server has the exact value (not for integer
// outputs, nor from servers before it).
std::string UlpText(const client::CandidateVerdict& c) {
  std::string text =
      absl::StrFormat("ulp vs logitd's: max %d, p99 %d, p50 %d", c.max_ulp, c.p99_ulp, c.p50_ulp);
  if (c.max_ulp_exact >= 0) {
    absl::StrAppendFormat(&text, "; ulp vs correctly rounded: max %d, p99 %d, p50 %d",
                          c.max_ulp_exact, c.p99_ulp_exact, c.p50_ulp_exact);
  }
  return text;
}

// "RMS error 5.31 times the conforming envelope's (threshold 2.05)".
std::string RmsText(const client::PrecisionClass& p) {
  return absl::StrFormat("RMS error %.3g times the conforming envelope's (threshold %.3g)",
                         p.rms_ratio, p.threshold);
}

// The summary line: the verdict and what decided it.
std::string SummaryOf(const client::CandidateVerdict& c, const client::VerifyResult& result) {
  const client::PrecisionClass& p = c.precision_class;
  std::string text;
  if (c.verdict == "outside_bounds") {
    text = absl::StrFormat(
        "outside_bounds: %d of %d elements outside the proven bound (worst %.3g "
        "times it)",
        c.outside_bound, c.elements, c.worst_bound_fraction);
    if (c.nan_inf_mismatches > 0) {
      absl::StrAppendFormat(&text, ", %d NaN/Inf mismatches", c.nan_inf_mismatches);
    }
    if (const client::VerifyElement* e = FirstListed(c, /*proven=*/true); e != nullptr) {
      absl::StrAppendFormat(&text, "; first %s: candidate %.9g, fp64 reference %.9g, bound %.3e",
                            IndexText(*e), e->candidate, e->reference, e->bound);
    }
  } else if (c.verdict == "outside_precision_class") {
    text = absl::StrFormat(
        "outside_precision_class: %s; %s; alpha %.3g; %d of %d rows and %d of %d elements outside",
        RmsText(p), PrecisionText(p), p.alpha, p.rows_outside, p.rows, p.elements_outside,
        p.elements);
    if (const client::VerifyElement* e = FirstListed(c, /*proven=*/false); e != nullptr) {
      absl::StrAppendFormat(&text, "; worst %s: |error| %.3e against its class threshold %.3e",
                            IndexText(*e), std::fabs(e->candidate - e->reference),
                            e->class_threshold);
    }
  } else if (c.passed()) {
    text = absl::StrFormat("%s: %s; %s; worst %.3g of its bound; %s bitwise logitd's", c.verdict,
                           PrecisionText(p), UlpText(c), c.worst_bound_fraction,
                           Percent(c.bitwise_equal_fraction));
  } else {
    // A verdict this build does not know (a newer server's): its bound
    // figures, which every server gives.
    text =
        absl::StrFormat("%s; worst %.3g of its bound; %s bitwise logitd's; max %d ulp", c.verdict,
                        c.worst_bound_fraction, Percent(c.bitwise_equal_fraction), c.max_ulp);
  }
  if (!result.rows_checked.empty()) {
    absl::StrAppendFormat(
        &text, "; rows %d of %d, %s", result.rows_checked.size(), result.rows_total,
        result.sample_seed == 0 ? std::string("evenly spaced")
                                : absl::StrCat("drawn by seed ", result.sample_seed));
  }
  return text;
}

// Why a candidate failed, in full: the figures that decided it and the
// first elements the server listed.
std::string FailureOf(const client::CandidateVerdict& c) {
  const client::PrecisionClass& p = c.precision_class;
  std::string why;
  if (c.verdict == "outside_precision_class") {
    why = absl::StrFormat(
        "%s: outside_precision_class: inside the proven bound, but the errors are not those of "
        "fp32 accumulation: %s, %s (a conforming implementation is found outside with probability "
        "at most %.3g); %d of %d rows and %d of %d elements outside",
        c.name, RmsText(p), PrecisionText(p), p.alpha, p.rows_outside, p.rows, p.elements_outside,
        p.elements);
    for (std::size_t i = 0; i < p.worst_rows.size() && i < 3; ++i) {
      const client::RowPrecision& row = p.worst_rows[i];
      absl::StrAppendFormat(&why, "; row %d: RMS %.3g times (threshold %.3g), %.1f bits%s", row.row,
                            row.rms_ratio, row.threshold, row.effective_bits,
                            row.outside ? " (outside)" : "");
    }
    if (!p.envelope.empty()) absl::StrAppend(&why, "; envelope: ", p.envelope);
  } else {
    why = absl::StrFormat(
        "%s: %s: %d of %d elements outside the proven bound (worst %.3g times it), %d NaN/Inf "
        "mismatches",
        c.name, c.verdict, c.outside_bound, c.elements, c.worst_bound_fraction,
        c.nan_inf_mismatches);
    if (p.tested && p.outside) {
      absl::StrAppend(&why, "; outside the precision class too: ", RmsText(p));
    }
  }
  for (std::size_t i = 0; i < c.first_outside.size() && i < 5; ++i) {
    absl::StrAppend(&why, "; ", ElementText(c.first_outside[i]));
  }
  return why;
}

nlohmann::ordered_json PrecisionClassJson(const client::PrecisionClass& p) {
  nlohmann::ordered_json j;
  j["tested"] = p.tested;
  if (!p.reason.empty()) j["reason"] = p.reason;
  j["outside"] = p.outside;
  j["alpha"] = JsonNumber(p.alpha);
  j["effective_bits"] = JsonNumber(p.effective_bits);
  j["class_bits"] = JsonNumber(p.class_bits);
  j["rms_ratio"] = JsonNumber(p.rms_ratio);
  j["threshold"] = JsonNumber(p.threshold);
  j["elements"] = p.elements;
  j["rows"] = p.rows;
  j["rows_outside"] = p.rows_outside;
  j["elements_outside"] = p.elements_outside;
  if (p.drawn_from > 0) j["drawn_from"] = p.drawn_from;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const client::RowPrecision& r : p.worst_rows) {
    rows.push_back({{"row", r.row},
                    {"elements", r.elements},
                    {"effective_bits", JsonNumber(r.effective_bits)},
                    {"class_bits", JsonNumber(r.class_bits)},
                    {"rms_ratio", JsonNumber(r.rms_ratio)},
                    {"threshold", JsonNumber(r.threshold)},
                    {"outside", r.outside}});
  }
  j["worst_rows"] = std::move(rows);
  j["envelope"] = p.envelope;
  return j;
}

}  // namespace

CaseResult CaseOf(const std::string& case_prefix, const client::CandidateVerdict& c,
                  const client::VerifyResult& result, double seconds) {
  CaseResult r;
  r.suite = "verify";
  r.name = absl::StrCat(case_prefix, "/", c.name);
  r.seconds = seconds;
  r.verdict = c.passed() ? Verdict::kPassed : Verdict::kFailed;
  r.summary = SummaryOf(c, result);
  nlohmann::ordered_json& f = r.figures;
  f["candidate"] = c.name;
  f["dtype"] = std::string(DTypeName(c.dtype));
  f["shape"] = c.shape;
  f["xxh3"] = absl::StrFormat("%016x", c.xxh3);
  f["verdict"] = c.verdict;
  f["passed"] = c.passed();
  f["elements"] = c.elements;
  f["outside_bound"] = c.outside_bound;
  f["worst_bound_fraction"] = JsonNumber(c.worst_bound_fraction);
  f["precision_class"] = PrecisionClassJson(c.precision_class);
  f["outside_probabilistic_bound"] = c.outside_probabilistic_bound;
  f["worst_probabilistic_fraction"] = JsonNumber(c.worst_probabilistic_fraction);
  f["logitd_outside_probabilistic_bound"] = c.logitd_outside_probabilistic_bound;
  f["nan_inf_mismatches"] = c.nan_inf_mismatches;
  f["bitwise_equal_fraction"] = c.bitwise_equal_fraction;
  f["max_ulp"] = c.max_ulp;
  f["p99_ulp"] = c.p99_ulp;
  f["p50_ulp"] = c.p50_ulp;
  f["max_ulp_exact"] = c.max_ulp_exact;
  f["p99_ulp_exact"] = c.p99_ulp_exact;
  f["p50_ulp_exact"] = c.p50_ulp_exact;
  f["error_histogram"] = c.error_histogram;
  nlohmann::ordered_json worst = nlohmann::ordered_json::array();
  for (const client::VerifyElement& e : c.first_outside) {
    worst.push_back({{"index", e.index},
                     {"candidate", JsonNumber(e.candidate)},
                     {"reference", JsonNumber(e.reference)},
                     {"bound", JsonNumber(e.bound)},
                     {"outside_bound", e.outside_bound},
                     {"class_threshold", JsonNumber(e.class_threshold)},
                     {"probabilistic_bound", JsonNumber(e.probabilistic_bound)},
                     {"logitd", JsonNumber(e.logitd)}});
  }
  f["first_outside"] = std::move(worst);
  f["inputs_xxh3"] = absl::StrFormat("%016x", result.inputs_xxh3);
  f["rows_checked"] = result.rows_checked;
  f["rows_total"] = result.rows_total;
  f["sample_seed"] = result.sample_seed;
  f["reference_us"] = result.reference_us;
  f["reference_engine"] = result.reference_engine;
  if (!c.passed()) r.failures.push_back(FailureOf(c));
  return r;
}

// The candidates against the baseline run, a line each, and what differs
// between the two runs' platforms and inputs.
// "; changed rows: 0-63, 128-191" from a comparison's changed blocks
// (consecutive blocks joined); "" when none are named.
std::string ChangedRows(const client::CandidateComparison& cc) {
  if (cc.changed_blocks.empty() || cc.block_rows <= 0) return "";
  std::vector<std::string> ranges;
  for (std::size_t i = 0; i < cc.changed_blocks.size();) {
    std::size_t j = i;
    while (j + 1 < cc.changed_blocks.size() &&
           cc.changed_blocks[j + 1] == cc.changed_blocks[j] + 1) {
      ++j;
    }
    const std::int64_t first = cc.changed_blocks[i] * cc.block_rows;
    std::int64_t last = (cc.changed_blocks[j] + 1) * cc.block_rows - 1;
    if (cc.rows > 0) last = std::min(last, cc.rows - 1);
    ranges.push_back(first == last ? absl::StrCat(first) : absl::StrCat(first, "-", last));
    i = j + 1;
  }
  return absl::StrCat(
      "; changed rows: ", absl::StrJoin(ranges, ", "),
      cc.block_rows > 1 ? absl::StrCat(" (in blocks of ", cc.block_rows, " rows)") : "");
}

void PrintComparison(const client::RunComparison& c) {
  std::printf("against run %lld (%s%s%s, %s):%s%s\n", static_cast<long long>(c.baseline_run_id),
              c.baseline_labels.branch.empty() ? "no branch" : c.baseline_labels.branch.c_str(),
              c.baseline_labels.ref.empty() ? "" : " at ", c.baseline_labels.ref.c_str(),
              c.baseline_verdict.c_str(), c.same_inputs ? "" : " OTHER INPUTS,",
              c.platform_difference.empty()
                  ? " the same platform"
                  : absl::StrCat(" ANOTHER PLATFORM (", c.platform_difference, ")").c_str());
  for (const client::CandidateComparison& cc : c.candidates) {
    std::printf("  %s: %s (worst bound fraction %+.3g, max ulp %+lld, effective bits %+.2f)%s\n",
                cc.name.c_str(), cc.bits.c_str(), cc.worst_bound_fraction_delta,
                static_cast<long long>(cc.max_ulp_delta), cc.effective_bits_delta,
                ChangedRows(cc).c_str());
  }
}

void PrintAlerts(const std::vector<client::Alert>& alerts) {
  if (alerts.empty()) return;
  std::printf("ALERT: this run broke %zu rule%s of its project:\n", alerts.size(),
              alerts.size() == 1 ? "" : "s");
  for (const client::Alert& a : alerts) {
    std::printf("  %s: %s\n", a.rule.c_str(), a.message.c_str());
  }
}

}  // namespace logitd::validate
