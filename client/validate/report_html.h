// The reports for people that `logitctl validate --report=DIR` writes:
// index.html, one self-contained page (inline CSS and SVG, no script, nothing
// fetched) with the verdicts, the platform, the plots and every case's
// figures; and summary.md, markdown for a CI job summary. Both are made from
// the Report the --json document is made from, and write its numbers as it
// does.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "client/validate/report.h"

namespace logitd::validate {

// The page, written so that it is also well-formed XML (XHTML syntax).
std::string ReportHtml(const Report& report);
std::string ReportMarkdown(const Report& report);

// Creates `dir` (and its parents) when missing; InvalidArgument naming the
// directory when it cannot be created or is not writable.
absl::Status PrepareReportDir(const std::string& dir);
// Writes DIR/index.html and DIR/summary.md.
absl::Status WriteReportDir(const Report& report, const std::string& dir);

// Writes the --json document, the --junit XML and the --report directory
// that are asked for (an empty path: not asked). Returns the report's exit
// code, at least 1 when a file could not be written (said on stderr after
// `program`).
int WriteReportFiles(const Report& report, const std::string& json_path,
                     const std::string& junit_path, const std::string& report_dir,
                     const std::string& program);

}  // namespace logitd::validate
