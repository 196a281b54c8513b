// The golden suite's server-side form (logitctl validate --project): each
// golden case, judged here, recorded as a run of the server's history
// (Client::RecordValidation), compared there with a recorded run and checked
// against the project's rules.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "client/validate/harness.h"
#include "logitd/client.h"
#include "logitd/reference/bounds.h"
#include "logitd/tensor.h"

namespace logitd::validate {

// A golden case's outputs as a run keeps them: each output's digest, its
// bound figures and its rows' digests in at most 64 blocks.
client::ValidatedCase ValidatedCaseOf(
    const std::string& case_name, std::uint64_t inputs_xxh3,
    const std::vector<std::pair<std::string, Tensor>>& outputs,
    const std::vector<std::pair<std::string, BoundStats>>& bounds);

// Records `cases` under the run's labels and puts what the server said in
// each golden CaseResult of `results` (matched by name): the run's id, the
// comparison in its summary, an alert or an unrecorded run as a failure;
// the call's error as a failure of each.
void RecordGoldenCases(RunContext& ctx, std::vector<client::ValidatedCase> cases,
                       std::vector<CaseResult>& results);

}  // namespace logitd::validate
