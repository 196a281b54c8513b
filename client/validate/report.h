// What a validation run reports: the summary table printed at the end, the
// --json document (server info, every case's figures and verdict) and the
// --junit XML that CI systems render.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/validate/harness.h"
#include "logitd/client.h"
#include "logitd/markup.h"
#include "logitd/reference/bounds.h"
#include "nlohmann/json.hpp"

namespace logitd::validate {

struct Report {
  // The command that made it, as the JSON document names it.
  std::string tool = "logitctl validate";
  std::string address;
  bool have_info = false;
  client::ServerInfo info;
  Options options;
  // RFC 3339, UTC.
  std::string started_at;
  double seconds = 0;
  std::vector<CaseResult> results;
  std::vector<std::string> detail_tables;
  // Set when the run could not start or stopped early (server unreachable).
  std::string error;
  int exit_code = 0;
  // --compare: the comparison with the second server, as text and JSON.
  std::string compare_text;
  nlohmann::ordered_json compare = nullptr;
};

// How many cases of a set passed, failed or were not run, and their time.
struct VerdictCounts {
  int passed = 0;
  int failed = 0;
  int not_run = 0;
  double seconds = 0;
  int total() const { return passed + failed + not_run; }
  // "1 case", "42 cases".
  std::string TotalText() const;
};
VerdictCounts CountVerdicts(const std::vector<const CaseResult*>& results);

// One suite's cases, in run order.
struct SuiteResults {
  std::string suite;
  std::vector<const CaseResult*> results;
};
// Suites in the order their first case appears.
std::vector<SuiteResults> BySuite(const std::vector<CaseResult>& results);

// "server ADDR: logitd VERSION (BUILD), backend B, device 'D'..." in one line.
std::string ServerLine(const Report& report);

// 0 when every case passed or was deliberately not run, 1 when one failed,
// 2 when the server was unreachable (report.error set).
int ExitCodeFor(const std::vector<CaseResult>& results, bool server_unreachable);

// A finite number as a JSON number; ±Inf and NaN as strings (JSON has none).
nlohmann::ordered_json JsonNumber(double value);

// A bound check's figures under `key` ({"violations",
// "worst_bound_fraction"}) and a failure naming the first element outside
// its bound, when one is ("3 of 65536 dX elements outside ...").
void ReportBounds(CaseResult& r, const char* key, const std::string& what,
                  const std::vector<std::int64_t>& shape, const BoundStats& stats);

// Detail tables, then one row per case, the failures spelled out, totals.
std::string SummaryText(const Report& report);
nlohmann::ordered_json ReportJson(const Report& report);
std::string JUnitXml(const Report& report);

// XmlEscape (logitd/markup.h) escapes what the report writes of names.
using ::logitd::XmlEscape;

}  // namespace logitd::validate
