#include "client/validate/report.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/common/server_info_json.h"

namespace logitd::validate {
namespace {

void AppendTimeAttr(std::string* out, double seconds) {
  absl::StrAppend(out, " time=\"", absl::StrFormat("%.3f", seconds), "\"");
}

std::string OneLine(absl::string_view text) {
  std::string s(text);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// Why cases did not run, a line per suite and reason with its count:
// "not run: golden (5): no --baseline FILE ..."; empty when every case ran.
std::string NotRunReasons(const std::vector<CaseResult>& results) {
  struct Reason {
    std::string suite;
    std::string note;
    int count = 0;
  };
  std::vector<Reason> reasons;
  for (const CaseResult& r : results) {
    if (r.verdict != Verdict::kNotRun) continue;
    auto it = std::find_if(reasons.begin(), reasons.end(),
                           [&](const Reason& x) { return x.suite == r.suite && x.note == r.note; });
    if (it == reasons.end()) it = reasons.insert(reasons.end(), Reason{r.suite, r.note, 0});
    ++it->count;
  }
  std::string out;
  for (const Reason& x : reasons) {
    absl::StrAppend(&out, "\nnot run: ", x.suite, " (", x.count,
                    "): ", x.note.empty() ? "skipped" : x.note);
  }
  return out;
}

}  // namespace

void ReportBounds(CaseResult& r, const char* key, const std::string& what,
                  const std::vector<std::int64_t>& shape, const BoundStats& stats) {
  r.figures[key] = {{"violations", stats.violations},
                    {"worst_bound_fraction", JsonNumber(stats.worst_fraction)}};
  r.Check(stats.violations == 0, stats.Describe(what, shape));
}

std::string VerdictCounts::TotalText() const {
  return absl::StrCat(total(), total() == 1 ? " case" : " cases");
}

VerdictCounts CountVerdicts(const std::vector<const CaseResult*>& results) {
  VerdictCounts c;
  for (const CaseResult* r : results) {
    c.seconds += r->seconds;
    switch (r->verdict) {
      case Verdict::kPassed:
        ++c.passed;
        break;
      case Verdict::kFailed:
        ++c.failed;
        break;
      case Verdict::kNotRun:
        ++c.not_run;
        break;
    }
  }
  return c;
}

std::vector<SuiteResults> BySuite(const std::vector<CaseResult>& results) {
  std::vector<SuiteResults> out;
  for (const CaseResult& r : results) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const SuiteResults& s) { return s.suite == r.suite; });
    if (it == out.end()) {
      out.push_back(SuiteResults{r.suite, {}});
      it = std::prev(out.end());
    }
    it->results.push_back(&r);
  }
  return out;
}

std::string ServerLine(const Report& report) {
  if (!report.have_info) return absl::StrCat("server ", report.address, ": no server info");
  const client::ServerInfo& i = report.info;
  std::string line =
      absl::StrCat("server ", report.address, ": logitd ", i.version, " (", i.build_id,
                   "), backend ", i.backend, ", device '", i.device_name, "'");
  if (!i.compute_capability.empty()) absl::StrAppend(&line, " sm ", i.compute_capability);
  if (!i.cublaslt_version.empty()) absl::StrAppend(&line, ", cuBLASLt ", i.cublaslt_version);
  if (!i.blas_version.empty()) absl::StrAppend(&line, ", ", i.blas_version);
  return line;
}

int ExitCodeFor(const std::vector<CaseResult>& results, bool server_unreachable) {
  if (server_unreachable) return 2;
  for (const CaseResult& r : results) {
    if (r.verdict == Verdict::kFailed) return 1;
  }
  return 0;
}

nlohmann::ordered_json JsonNumber(double value) {
  if (std::isfinite(value)) return value;
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

std::string SummaryText(const Report& report) {
  std::string out;
  for (const std::string& table : report.detail_tables) absl::StrAppend(&out, table, "\n");

  std::size_t suite_w = 5;
  std::size_t case_w = 4;
  for (const CaseResult& r : report.results) {
    suite_w = std::max(suite_w, r.suite.size());
    case_w = std::max(case_w, r.name.size());
  }
  const int sw = static_cast<int>(suite_w);
  const int cw = static_cast<int>(case_w);
  absl::StrAppend(&out, absl::StrFormat("%-*s  %-*s  %-7s  %8s  %s\n", sw, "suite", cw, "case",
                                        "verdict", "time", "key figures"));
  for (const CaseResult& r : report.results) {
    const std::string figures =
        r.verdict == Verdict::kNotRun && r.summary.empty() ? r.note : r.summary;
    absl::StrAppend(&out, absl::StrFormat("%-*s  %-*s  %-7s  %7.1fs  %s\n", sw, r.suite, cw, r.name,
                                          VerdictName(r.verdict), r.seconds, figures));
  }

  bool any_failure = false;
  for (const CaseResult& r : report.results) {
    if (r.verdict != Verdict::kFailed) continue;
    if (!any_failure) absl::StrAppend(&out, "\nfailures:\n");
    any_failure = true;
    absl::StrAppend(&out, "  ", r.FullName(), "\n");
    for (const std::string& f : r.failures) absl::StrAppend(&out, "    - ", f, "\n");
  }

  std::vector<const CaseResult*> all;
  for (const CaseResult& r : report.results) all.push_back(&r);
  const VerdictCounts c = CountVerdicts(all);
  absl::StrAppend(&out, "\n", ServerLine(report), "\n");
  absl::StrAppend(&out,
                  absl::StrFormat("%s: %d passed, %d FAILED, %d not run in %.1f s", c.TotalText(),
                                  c.passed, c.failed, c.not_run, report.seconds));
  absl::StrAppend(&out, NotRunReasons(report.results));
  if (!report.error.empty()) absl::StrAppend(&out, "\nerror: ", report.error);
  absl::StrAppend(&out, "\n", report.compare_text);
  return out;
}

nlohmann::ordered_json ReportJson(const Report& report) {
  nlohmann::ordered_json j;
  j["tool"] = report.tool;
  j["started_at"] = report.started_at;
  j["duration_s"] = report.seconds;
  j["exit_code"] = report.exit_code;
  j["server_address"] = report.address;
  j["server"] = report.have_info
                    ? client::ServerInfoJson(report.info, /*with_request_memory=*/false)
                    : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json options;
  options["suites"] = report.options.suites;
  options["quick"] = report.options.quick;
  options["seed"] = report.options.seed;
  options["baseline"] = report.options.baseline_path;
  options["record"] = report.options.record_path;
  options["allow_other_platform"] = report.options.allow_other_platform;
  j["options"] = options;
  if (!report.error.empty()) j["error"] = report.error;
  if (!report.compare.is_null()) j["compare"] = report.compare;

  std::vector<const CaseResult*> all;
  for (const CaseResult& r : report.results) all.push_back(&r);
  const VerdictCounts c = CountVerdicts(all);
  j["totals"] = {
      {"cases", c.total()}, {"passed", c.passed}, {"failed", c.failed}, {"not_run", c.not_run}};

  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const CaseResult& r : report.results) {
    nlohmann::ordered_json cj;
    cj["suite"] = r.suite;
    cj["case"] = r.name;
    cj["verdict"] = VerdictName(r.verdict);
    cj["seconds"] = r.seconds;
    cj["summary"] = r.summary;
    cj["figures"] = r.figures;
    cj["failures"] = r.failures;
    if (!r.note.empty()) cj["note"] = r.note;
    cases.push_back(std::move(cj));
  }
  j["cases"] = std::move(cases);
  return j;
}

std::string JUnitXml(const Report& report) {
  std::vector<const CaseResult*> all;
  for (const CaseResult& r : report.results) all.push_back(&r);
  const VerdictCounts total = CountVerdicts(all);
  const bool connect_error = report.results.empty() && !report.error.empty();
  const std::string timestamp = report.started_at.substr(0, 19);  // no zone, as JUnit wants

  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&x, "<testsuites name=\"logitctl validate\" tests=\"",
                  total.total() + (connect_error ? 1 : 0), "\" failures=\"", total.failed,
                  "\" errors=\"", connect_error ? 1 : 0, "\" skipped=\"", total.not_run, "\"");
  AppendTimeAttr(&x, report.seconds);
  absl::StrAppend(&x, ">\n");

  std::string properties = "    <properties>\n";
  absl::StrAppend(&properties, "      <property name=\"server.address\" value=\"",
                  XmlEscape(report.address), "\"/>\n");
  if (report.have_info) {
    const nlohmann::ordered_json info =
        client::ServerInfoJson(report.info, /*with_request_memory=*/false);
    for (auto it = info.begin(); it != info.end(); ++it) {
      const std::string value = it->is_string() ? it->get<std::string>() : it->dump();
      absl::StrAppend(&properties, "      <property name=\"server.", XmlEscape(it.key()),
                      "\" value=\"", XmlEscape(value), "\"/>\n");
    }
  }
  absl::StrAppend(&properties, "      <property name=\"options.quick\" value=\"",
                  report.options.quick ? "true" : "false", "\"/>\n",
                  "      <property name=\"options.seed\" value=\"", report.options.seed, "\"/>\n",
                  "    </properties>\n");

  if (connect_error) {
    absl::StrAppend(&x, "  <testsuite name=\"logitd.validate\" tests=\"1\" failures=\"0\" ",
                    "errors=\"1\" skipped=\"0\" time=\"0.000\" timestamp=\"", XmlEscape(timestamp),
                    "\" hostname=\"", XmlEscape(report.address), "\">\n", properties,
                    "    <testcase name=\"connect\" classname=\"logitd.validate\" ",
                    "time=\"0.000\">\n", "      <error message=\"",
                    XmlEscape(OneLine(report.error)), "\" type=\"unreachable\">",
                    XmlEscape(report.error), "</error>\n", "    </testcase>\n", "  </testsuite>\n");
  }

  for (const auto& [suite, results] : BySuite(report.results)) {
    const VerdictCounts c = CountVerdicts(results);
    const std::string classname = absl::StrCat("logitd.validate.", suite);
    absl::StrAppend(&x, "  <testsuite name=\"", XmlEscape(classname), "\" tests=\"", c.total(),
                    "\" failures=\"", c.failed, "\" errors=\"0\" skipped=\"", c.not_run, "\"");
    AppendTimeAttr(&x, c.seconds);
    absl::StrAppend(&x, " timestamp=\"", XmlEscape(timestamp), "\" hostname=\"",
                    XmlEscape(report.address), "\">\n", properties);
    for (const CaseResult* r : results) {
      absl::StrAppend(&x, "    <testcase name=\"", XmlEscape(r->name), "\" classname=\"",
                      XmlEscape(classname), "\"");
      AppendTimeAttr(&x, r->seconds);
      absl::StrAppend(&x, ">\n");
      if (r->verdict == Verdict::kFailed) {
        const std::string first = r->failures.empty() ? "failed" : r->failures.front();
        absl::StrAppend(&x, "      <failure message=\"", XmlEscape(OneLine(first)),
                        "\" type=\"check\">", XmlEscape(absl::StrJoin(r->failures, "\n")),
                        "</failure>\n");
      } else if (r->verdict == Verdict::kNotRun) {
        absl::StrAppend(&x, "      <skipped message=\"", XmlEscape(OneLine(r->note)), "\"/>\n");
      }
      absl::StrAppend(&x, "      <system-out>", XmlEscape(r->summary), "\n",
                      XmlEscape(r->figures.dump(-1, ' ', false,
                                                nlohmann::ordered_json::error_handler_t::replace)),
                      "</system-out>\n", "    </testcase>\n");
    }
    absl::StrAppend(&x, "  </testsuite>\n");
  }
  absl::StrAppend(&x, "</testsuites>\n");
  return x;
}

}  // namespace logitd::validate
