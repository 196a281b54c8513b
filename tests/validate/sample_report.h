// The report the report tests start from: a cpu server whose device name
// needs escaping (markup, quotes), with no cases yet.
#pragma once

#include "client/validate/report.h"

namespace logitd::validate {

inline Report EmptySampleReport() {
  Report r;
  r.address = "127.0.0.1:1";
  r.have_info = true;
  r.info.backend = "cpu";
  r.info.device_name = "cpu <model> & \"co\"";
  r.started_at = "2024-01-02T03:04:05+00:00";
  return r;
}

// A case that did not run, as golden without --baseline.
inline CaseResult NotRunGoldenCast() {
  CaseResult c;
  c.suite = "golden";
  c.name = "cast";
  c.verdict = Verdict::kNotRun;
  c.note = "no --baseline";
  return c;
}

}  // namespace logitd::validate
