// The golden baseline of `logitctl verify`: a user's own candidates' bits
// and verdict figures per case, in validate's baseline format, so that a CI
// job learns when its kernel's outputs change (a library, driver or GPU
// upgrade) and whether the new ones still keep the contract.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/validate/baseline.h"
#include "client/validate/harness.h"
#include "logitd/client.h"
#include "logitd/tensor.h"

namespace logitd::validate {

// The baseline record of one judged candidate: its bits, the inputs' digest
// and the verdict's bound figures.
CaseRecord RecordVerifiedCandidate(const std::string& case_name, const Tensor& candidate,
                                   std::uint64_t inputs_xxh3, const client::CandidateVerdict& c);

// Adds `cases` to the baseline at `path`, replacing cases of the same names
// and keeping the others (several verify calls build one file); a missing
// file is created. The recording server is noted as validate notes it.
absl::Status RecordVerifyCases(const std::string& path, const client::ServerInfo& info,
                               std::vector<CaseRecord> cases);

// Compares a judged candidate with its case in `baseline` (read from
// `path`), adding failures to `r` when the case is missing, was recorded
// from other inputs, or has other bits; the figures say which and whether
// both keep their bounds ("identical", "different, both within bounds",
// "different, outside bounds").
void CompareVerifiedCandidate(const Baseline& baseline, const std::string& path,
                              const std::string& case_name, const Tensor& candidate,
                              std::uint64_t inputs_xxh3, const client::CandidateVerdict& c,
                              CaseResult* r);

}  // namespace logitd::validate
