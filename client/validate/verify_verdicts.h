// How `logitctl verify` reads one candidate's verdict: the line that says
// what decided it (the figure and the bound that failed, the precision
// class's effective bits, ULP figures and against what) and the report's
// case with every field of the verdict. The command itself, its flags and
// its tensors are verify_command.cc's.
#pragma once

#include <string>
#include <vector>

#include "client/validate/harness.h"
#include "logitd/client.h"

namespace logitd::validate {

// One candidate's verdict as a case of the report: `case_prefix` then the
// candidate's name, its summary line, its figures as fields, and a failure
// that says what decided it when it did not pass.
CaseResult CaseOf(const std::string& case_prefix, const client::CandidateVerdict& c,
                  const client::VerifyResult& result, double seconds);

// The candidates against the baseline run, a line each, and what differs
// between the two runs' platforms and inputs.
void PrintComparison(const client::RunComparison& c);
// The rules of its project a recorded run broke (none: nothing).
void PrintAlerts(const std::vector<client::Alert>& alerts);

}  // namespace logitd::validate
