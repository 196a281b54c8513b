#include "client/validate/verify_golden.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace logitd::validate {

CaseRecord RecordVerifiedCandidate(const std::string& case_name, const Tensor& candidate,
                                   std::uint64_t inputs_xxh3, const client::CandidateVerdict& c) {
  CaseRecord rec;
  rec.name = case_name;
  rec.inputs_xxh3 = inputs_xxh3;
  rec.outputs.push_back(RecordOutput(c.name, candidate));
  // Passed: within_bounds or bitwise logitd's, sampled or not; a candidate
  // outside the precision class is not recorded as within.
  rec.within_bounds = c.passed();
  rec.worst_bound_fraction = c.worst_bound_fraction;
  return rec;
}

absl::Status RecordVerifyCases(const std::string& path, const client::ServerInfo& info,
                               std::vector<CaseRecord> cases) {
  Baseline b;
  absl::StatusOr<Baseline> existing = ReadBaseline(path);
  if (existing.ok()) {
    b = *std::move(existing);
  } else if (existing.status().code() != absl::StatusCode::kNotFound) {
    return existing.status();
  }
  b.recorded_at = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  b.server = {{"version", info.version},
              {"build_id", info.build_id},
              {"split_k", info.split_k},
              {"algo_choices", info.algo_choices},
              {"algo_cache_path", info.algo_cache_path}};
  b.platform = PlatformOf(info);
  for (CaseRecord& c : cases) {
    bool replaced = false;
    for (CaseRecord& old : b.cases) {
      if (old.name == c.name) {
        old = c;
        replaced = true;
      }
    }
    if (!replaced) b.cases.push_back(std::move(c));
  }
  return WriteBaseline(path, b);
}

void CompareVerifiedCandidate(const Baseline& baseline, const std::string& path,
                              const std::string& case_name, const Tensor& candidate,
                              std::uint64_t inputs_xxh3, const client::CandidateVerdict& c,
                              CaseResult* r) {
  const CaseRecord* rec = baseline.Find(case_name);
  if (!r->Check(rec != nullptr,
                absl::StrCat("case '", case_name, "' is not in baseline '", path,
                             "': record it with --record (and --case=NAME to tell calls apart)"))) {
    return;
  }
  if (!r->Check(rec->inputs_xxh3 == inputs_xxh3,
                absl::StrFormat("case '%s': the baseline was recorded from other inputs (digest "
                                "%016x, now %016x): the same candidate bits cannot be expected",
                                case_name, rec->inputs_xxh3, inputs_xxh3))) {
    return;
  }
  const OutputRecord* out = nullptr;
  for (const OutputRecord& o : rec->outputs) {
    if (o.name == c.name) out = &o;
  }
  if (!r->Check(out != nullptr, absl::StrCat("case '", case_name, "': output '", c.name,
                                             "' is not in the baseline"))) {
    return;
  }
  const OutputComparison cmp = CompareOutput(*out, candidate);
  const bool recorded_within = rec->within_bounds.value_or(false);
  const std::string verdict = cmp.equal                       ? "identical"
                              : recorded_within && c.passed() ? "different, both within bounds"
                                                              : "different, outside bounds";
  r->figures["baseline"] = {{"verdict", verdict},
                            {"differing_elements", cmp.differing_elements},
                            {"differing_blocks", cmp.differing_blocks},
                            {"blocks", cmp.total_blocks},
                            {"max_ulp", cmp.max_ulp},
                            {"recorded_worst_bound_fraction", rec->worst_bound_fraction}};
  absl::StrAppend(&r->summary, "; baseline: ", verdict);
  if (cmp.equal) return;
  r->Check(false,
           absl::StrFormat(
               "case '%s': %s; this candidate is %s (worst %.3g of its bound), the "
               "baseline's was %s (worst %.3g): %s",
               case_name, cmp.message,
               c.passed()                               ? "within its bounds"
               : c.verdict == "outside_precision_class" ? "OUTSIDE fp32's precision class"
                                                        : "OUTSIDE them",
               c.worst_bound_fraction, recorded_within ? "within its bounds" : "OUTSIDE them",
               rec->worst_bound_fraction, verdict));
}

}  // namespace logitd::validate
