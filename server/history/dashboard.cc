#include "server/history/dashboard.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "logitd/markup.h"
#include "server/history/rules.h"

namespace logitd::history {
namespace {

constexpr char kStyle[] = R"css(
body{font-family:system-ui,sans-serif;margin:24px;color:#1b1f24;max-width:1320px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:24px 0 8px}
nav{font-size:13px;margin-bottom:14px;color:#57606a} a{color:#0b5cad;text-decoration:none}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{padding:4px 10px;
border-bottom:1px solid #d8dee4;text-align:left;vertical-align:top} th{background:#f3f5f7}
td.n{text-align:right;font-variant-numeric:tabular-nums} .pass{color:#1a7f37} .fail{color:#cf222e}
.alert{color:#cf222e;font-weight:600} .muted{color:#57606a} svg{display:block;margin:4px 0 12px}
code{font-size:12px}
)css";

// The colours of the plots' lines, in turn.
constexpr const char* kPalette[] = {"#0b5cad", "#d4731b", "#1a7f37", "#8250df",
                                    "#cf222e", "#0a8f8f", "#9a6700", "#57606a"};

std::string Time(std::int64_t unix_us) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_us), absl::UTCTimeZone());
}

// `text` as a query value (RFC 3986 unreserved characters kept).
std::string UrlEncode(absl::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

std::string Link(const std::string& href, absl::string_view text) {
  return absl::StrCat("<a href=\"", XmlEscape(href), "\">", XmlEscape(text), "</a>");
}

std::string ProjectHref(const std::string& project) {
  return absl::StrCat("/history/project?project=", UrlEncode(project));
}
std::string CaseHref(const std::string& project, const std::string& case_name) {
  return absl::StrCat("/history/case?project=", UrlEncode(project), "&case=", UrlEncode(case_name));
}
std::string RunHref(std::int64_t id) { return absl::StrCat("/history/run?run=", id); }

// Whether the precision-class test ran (its figures are 0 where not).
bool Tested(const CandidateFigures& c) { return c.rms_ratio != 0 || c.effective_bits != 0; }

bool Passing(const std::string& verdict) {
  return verdict.rfind("within_bounds", 0) == 0 || verdict.rfind("bitwise_equal", 0) == 0;
}

std::string Verdict(const std::string& verdict) {
  return absl::StrCat("<span class=\"", Passing(verdict) ? "pass" : "fail", "\">",
                      XmlEscape(verdict), "</span>");
}

DashboardPage Html(const std::string& title, const std::string& nav, const std::string& body) {
  DashboardPage page;
  page.body = absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
                           "<title>", XmlEscape(title), " · logitd history</title><style>", kStyle,
                           "</style></head><body>\n<nav>", nav, "</nav>\n<h1>", XmlEscape(title),
                           "</h1>\n", body, "</body></html>\n");
  return page;
}

DashboardPage Error(int status, absl::string_view message) {
  DashboardPage page =
      Html(status == 404 ? "Not found" : "Cannot show this page", Link("/history", "history"),
           absl::StrCat("<p>", XmlEscape(message), "</p>\n"));
  page.status = status;
  return page;
}

std::string Nav(const std::string& project = "", const std::string& case_name = "") {
  std::string nav = Link("/history", "history");
  if (!project.empty()) absl::StrAppend(&nav, " / ", Link(ProjectHref(project), project));
  if (!case_name.empty()) {
    absl::StrAppend(&nav, " / ", Link(CaseHref(project, case_name), case_name));
  }
  return nav;
}

std::string Row(const std::vector<std::string>& cells, const char* tag = "td") {
  std::string row = "<tr>";
  for (const std::string& c : cells) {
    const bool numeric = !c.empty() && (std::isdigit(static_cast<unsigned char>(c[0])) != 0) &&
                         c.find('<') == std::string::npos && c.find(':') == std::string::npos;
    absl::StrAppend(&row, "<", tag, numeric ? " class=\"n\">" : ">", c, "</", tag, ">");
  }
  return row + "</tr>\n";
}

// --- plots --------------------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<std::pair<int, double>> points;  // (run's place, oldest 0; figure)
  std::vector<bool> alert;
};

std::string Number(double v) { return absl::StrFormat("%.4g", v); }

// One figure over the runs: a line per series, its scale from the figures.
std::string Plot(const std::string& title, const std::vector<Series>& series, int runs) {
  constexpr double kW = 1000, kH = 200, kLeft = 70, kRight = 10, kTop = 24, kBottom = 22;
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
    }
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi == lo) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1);
  const auto px = [&](int x) {
    return kLeft + (runs <= 1 ? 0.5 : static_cast<double>(x) / (runs - 1)) * (kW - kLeft - kRight);
  };
  const auto py = [&](double y) { return kTop + (hi - y) / (hi - lo) * (kH - kTop - kBottom); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" "
      "role=\"img\"><title>%s</title>\n<text x=\"%g\" y=\"15\" font-size=\"13\" "
      "font-weight=\"600\">%s</text>\n",
      kW, kH, kW, kH, XmlEscape(title), kLeft, XmlEscape(title));
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#8c959f\"/>"
                        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#8c959f\"/>\n",
                        kLeft, kTop, kLeft, kH - kBottom, kLeft, kH - kBottom, kW - kRight,
                        kH - kBottom);
  for (double v : {lo, hi}) {
    absl::StrAppendFormat(
        &svg, "<text x=\"%g\" y=\"%g\" font-size=\"11\" text-anchor=\"end\">%s</text>\n", kLeft - 6,
        py(v) + 4, Number(v));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%g\" y=\"%g\" font-size=\"11\">oldest</text><text x=\"%g\" "
                        "y=\"%g\" font-size=\"11\" text-anchor=\"end\">newest (%d runs)</text>\n",
                        kLeft, kH - 6, kW - kRight, kH - 6, runs);
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* colour = kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))];
    std::string points;
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(y)) absl::StrAppendFormat(&points, "%.1f,%.1f ", px(x), py(y));
    }
    absl::StrAppendFormat(&svg,
                          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                          "points=\"%s\"><title>%s</title></polyline>\n",
                          colour, points, XmlEscape(s.name));
    for (std::size_t p = 0; p < s.points.size(); ++p) {
      if (!s.alert[p] || !std::isfinite(s.points[p].second)) continue;
      absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#cf222e\"/>\n",
                            px(s.points[p].first), py(s.points[p].second));
    }
    absl::StrAppendFormat(&svg,
                          "<text x=\"%g\" y=\"%g\" font-size=\"11\" fill=\"%s\" "
                          "text-anchor=\"end\">%s</text>\n",
                          kW - kRight, kTop + 12.0 * static_cast<double>(i) + 8, colour,
                          XmlEscape(s.name));
  }
  return svg + "</svg>\n";
}

// --- pages --------------------------------------------------------------------------

DashboardPage ProjectsPage(HistoryStore& store, const std::string& tenant) {
  absl::StatusOr<std::vector<ProjectSummary>> projects = store.Projects(tenant);
  if (!projects.ok()) return Error(500, projects.status().message());
  std::string body;
  if (projects->empty()) {
    body =
        "<p class=\"muted\">No recorded runs yet: `logitctl verify --project=P --case=C` "
        "records one.</p>\n";
  } else {
    body = "<table>\n" + Row({"project", "cases", "runs", "alerts", "latest run (UTC)"}, "th");
    for (const ProjectSummary& p : *projects) {
      body +=
          Row({Link(ProjectHref(p.project), p.project), absl::StrCat(p.cases), absl::StrCat(p.runs),
               p.alerts > 0 ? absl::StrCat("<span class=\"alert\">", p.alerts, "</span>") : "0",
               Time(p.latest_unix_us)});
    }
    body += "</table>\n";
  }
  return Html("Projects", Link("/history", "history"), body);
}

std::string RulesSection(HistoryStore& store, const std::string& tenant,
                         const std::string& project) {
  absl::StatusOr<std::vector<Rule>> rules = store.Rules(tenant, project);
  if (!rules.ok() || rules->empty()) {
    return "<h2>Rules</h2>\n<p class=\"muted\">None (logitctl rules set).</p>\n";
  }
  std::string out = "<h2>Rules</h2>\n<ul>\n";
  for (const Rule& r : *rules)
    absl::StrAppend(&out, "<li><code>", XmlEscape(RuleText(r)), "</code></li>\n");
  return out + "</ul>\n";
}

DashboardPage ProjectPage(HistoryStore& store, const std::string& tenant,
                          const std::string& project) {
  absl::StatusOr<std::vector<CaseSummary>> cases = store.Cases(tenant, project);
  if (!cases.ok()) return Error(500, cases.status().message());
  if (cases->empty())
    return Error(404, absl::StrCat("no recorded runs of project '", project, "'"));
  std::string body = "<table>\n" + Row({"case", "runs", "alerts", "latest run", "verdict", "branch",
                                        "ref", "recorded (UTC)"},
                                       "th");
  for (const CaseSummary& c : *cases) {
    body += Row({Link(CaseHref(project, c.case_name), c.case_name), absl::StrCat(c.runs),
                 c.alerts > 0 ? absl::StrCat("<span class=\"alert\">", c.alerts, "</span>") : "0",
                 Link(RunHref(c.latest_run_id), absl::StrCat("run ", c.latest_run_id)),
                 Verdict(c.latest_verdict), XmlEscape(c.latest_branch), XmlEscape(c.latest_ref),
                 Time(c.latest_unix_us)});
  }
  body += "</table>\n" + RulesSection(store, tenant, project);
  return Html(absl::StrCat("Project ", project), Nav(project), body);
}

// The plots of a case's runs (oldest first): each figure, a line per
// candidate, branch and device.
std::string CasePlots(const std::vector<RunRecord>& runs) {
  struct Figure {
    const char* title;
    std::function<double(const CandidateFigures&)> of;
  };
  const Figure figures[] = {
      {"worst bound fraction (|error| / proven bound, the worst element)",
       [](const CandidateFigures& c) { return c.worst_bound_fraction; }},
      {"max ULP from logitd's own output",
       [](const CandidateFigures& c) { return static_cast<double>(c.max_ulp); }},
      {"p99 ULP from logitd's own output",
       [](const CandidateFigures& c) { return static_cast<double>(c.p99_ulp); }},
      {"effective bits (the precision-class test)",
       [](const CandidateFigures& c) { return Tested(c) ? c.effective_bits : NAN; }},
  };
  std::string out;
  for (const Figure& f : figures) {
    std::vector<Series> series;
    std::map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const RunRecord& r = runs[i];
      for (const CandidateFigures& c : r.candidates) {
        const std::string key = absl::StrCat(
            c.name, " · ", r.labels.branch.empty() ? "-" : r.labels.branch, " · ", r.device);
        auto [it, added] = index.emplace(key, series.size());
        if (added) series.push_back(Series{key, {}, {}});
        Series& s = series[it->second];
        s.points.emplace_back(static_cast<int>(i), f.of(c));
        bool alert = false;
        for (const Alert& a : r.alerts) alert = alert || a.candidate == c.name;
        s.alert.push_back(alert);
      }
    }
    out += Plot(f.title, series, static_cast<int>(runs.size()));
  }
  return out;
}

DashboardPage CasePage(HistoryStore& store, const std::string& tenant, const std::string& project,
                       const std::string& case_name, const std::string& branch) {
  RunFilter filter;
  filter.tenant = tenant;
  filter.project = project;
  filter.case_name = case_name;
  filter.branch = branch;
  filter.limit = kCasePageRuns;
  absl::StatusOr<std::vector<RunRecord>> runs = store.List(filter);
  if (!runs.ok()) return Error(500, runs.status().message());
  if (runs->empty()) {
    return Error(404,
                 absl::StrCat("no recorded runs of project '", project, "', case '", case_name, "'",
                              branch.empty() ? "" : absl::StrCat(" on branch '", branch, "'")));
  }
  std::vector<RunRecord> oldest_first(runs->rbegin(), runs->rend());
  std::string body = absl::StrCat(
      "<p class=\"muted\">The newest ", runs->size(), " runs", branch.empty() ? "" : " of branch ",
      XmlEscape(branch),
      "; a line per candidate, branch and device; a red dot is a run that broke a rule.</p>\n",
      CasePlots(oldest_first), "<h2>Runs</h2>\n<table>\n",
      Row({"run", "recorded (UTC)", "branch", "ref", "platform", "verdict", "candidates", "alerts"},
          "th"));
  for (std::size_t i = 0; i < runs->size() && i < static_cast<std::size_t>(kCaseTableRuns); ++i) {
    const RunRecord& r = (*runs)[i];
    std::string cands;
    for (const CandidateFigures& c : r.candidates) {
      absl::StrAppend(&cands, cands.empty() ? "" : " ", XmlEscape(c.name), ": ",
                      Verdict(c.verdict));
    }
    body += Row({Link(RunHref(r.id), absl::StrCat("run ", r.id)), Time(r.recorded_unix_us),
                 XmlEscape(r.labels.branch), XmlEscape(r.labels.ref),
                 XmlEscape(absl::StrCat(r.backend, " ", r.device)), Verdict(r.verdict), cands,
                 r.alerts.empty()
                     ? "0"
                     : absl::StrCat("<span class=\"alert\">", r.alerts.size(), "</span>")});
  }
  body += "</table>\n";
  return Html(absl::StrCat("Case ", case_name), Nav(project, case_name), body);
}

// The run against the run it was compared with: each candidate's bits
// (equal digests), the rows whose block digests differ, and the worst bound
// fraction then and now.
std::string ComparisonSection(HistoryStore& store, const RunRecord& r) {
  if (r.baseline_run_id == 0) return "";
  std::string out = absl::StrCat(
      "<h2>Against ", Link(RunHref(r.baseline_run_id), absl::StrCat("run ", r.baseline_run_id)),
      "</h2>\n");
  RunFilter f;
  f.tenant = r.tenant;
  f.run_id = r.baseline_run_id;
  f.limit = 1;
  absl::StatusOr<std::vector<RunRecord>> base = store.List(f);
  if (!base.ok() || base->empty()) {
    return out +
           "<p class=\"muted\">That run is no longer kept (pruned, or its project "
           "removed).</p>\n";
  }
  const RunRecord& b = base->front();
  absl::StrAppend(
      &out, "<p class=\"muted\">",
      XmlEscape(b.labels.branch.empty() ? "no branch" : b.labels.branch),
      b.labels.ref.empty() ? "" : absl::StrCat(" at ", XmlEscape(b.labels.ref)), ", ",
      XmlEscape(absl::StrCat(b.backend, " · ", b.device)),
      b.backend == r.backend && b.device == r.device ? "" : " (another platform)",
      b.inputs_xxh3 == r.inputs_xxh3 ? "" : "; other inputs", "</p>\n<table>\n",
      Row({"candidate", "bits", "changed rows", "worst bound fraction then", "now"}, "th"));
  for (const CandidateFigures& c : r.candidates) {
    const CandidateFigures* was = nullptr;
    for (const CandidateFigures& w : b.candidates) {
      if (w.name == c.name) was = &w;
    }
    if (was == nullptr) {
      out += Row({XmlEscape(c.name), "new", "", "", Number(c.worst_bound_fraction)});
      continue;
    }
    std::string rows;
    if (was->xxh3 != c.xxh3 && was->block_rows == c.block_rows && c.block_rows > 0 &&
        was->block_digests.size() == c.block_digests.size()) {
      for (std::size_t i = 0; i < c.block_digests.size(); ++i) {
        if (c.block_digests[i] == was->block_digests[i]) continue;
        const std::int64_t first = static_cast<std::int64_t>(i) * c.block_rows;
        // The last block ends at the candidate's last row where it is kept.
        std::int64_t last = first + c.block_rows - 1;
        if (c.rows > 0) last = std::min(last, c.rows - 1);
        absl::StrAppend(&rows, rows.empty() ? "" : ", ", first,
                        last > first ? absl::StrCat("-", last) : "");
      }
    }
    out += Row({XmlEscape(c.name),
                was->xxh3 == c.xxh3 ? "<span class=\"pass\">identical</span>"
                                    : "<span class=\"fail\">different</span>",
                rows, Number(was->worst_bound_fraction), Number(c.worst_bound_fraction)});
  }
  return out + "</table>\n";
}

DashboardPage RunPage(HistoryStore& store, const std::string& tenant, std::int64_t id) {
  RunFilter filter;
  filter.tenant = tenant;
  filter.run_id = id;
  filter.limit = 1;
  absl::StatusOr<std::vector<RunRecord>> runs = store.List(filter);
  if (!runs.ok()) return Error(500, runs.status().message());
  if (runs->empty()) return Error(404, absl::StrCat("no recorded run ", id));
  const RunRecord& r = runs->front();
  std::string body = absl::StrCat(
      "<table>\n", Row({"verdict", Verdict(r.verdict)}),
      Row({"project", Link(ProjectHref(r.labels.project), r.labels.project)}),
      Row({"case", Link(CaseHref(r.labels.project, r.labels.case_name), r.labels.case_name)}),
      Row({"branch", XmlEscape(r.labels.branch)}), Row({"ref", XmlEscape(r.labels.ref)}),
      Row({"operation", XmlEscape(r.operation)}),
      Row({"inputs_xxh3", absl::StrFormat("<code>%016x</code>", r.inputs_xxh3)}),
      Row({"platform",
           XmlEscape(absl::StrCat(r.backend, " · ", r.device, " · logitd ", r.logitd_version,
                                  r.libraries.empty() ? "" : " · ", r.libraries))}),
      Row({"recorded (UTC)", Time(r.recorded_unix_us)}), "</table>\n<h2>Candidates</h2>\n<table>\n",
      Row({"candidate", "verdict", "xxh3", "elements", "outside bound", "worst bound fraction",
           "bitwise equal", "max ULP", "p99 ULP", "effective bits"},
          "th"));
  for (const CandidateFigures& c : r.candidates) {
    body += Row({XmlEscape(c.name), Verdict(c.verdict),
                 absl::StrFormat("<code>%016x</code>", c.xxh3), absl::StrCat(c.elements),
                 absl::StrCat(c.outside_bound), Number(c.worst_bound_fraction),
                 Number(c.bitwise_equal_fraction), absl::StrCat(c.max_ulp), absl::StrCat(c.p99_ulp),
                 Tested(c) ? Number(c.effective_bits) : "-"});
  }
  body += "</table>\n" + ComparisonSection(store, r) + "<h2>Alerts</h2>\n";
  if (r.alerts.empty()) {
    body += "<p class=\"muted\">None: this run broke no rule of its project.</p>\n";
  } else {
    body += "<ul>\n";
    for (const Alert& a : r.alerts) {
      absl::StrAppend(&body, "<li class=\"alert\"><code>", XmlEscape(a.rule),
                      "</code>: ", XmlEscape(a.message), "</li>\n");
    }
    body += "</ul>\n";
  }
  return Html(absl::StrCat("Run ", r.id), Nav(r.labels.project, r.labels.case_name), body);
}

std::string Param(const std::map<std::string, std::string>& query, const std::string& name) {
  auto it = query.find(name);
  return it == query.end() ? std::string() : it->second;
}

}  // namespace

DashboardPage RenderDashboard(HistoryStore& store, const std::string& tenant,
                              absl::string_view path,
                              const std::map<std::string, std::string>& query) {
  if (path == "/history" || path == "/history/") return ProjectsPage(store, tenant);
  const std::string project = Param(query, "project");
  if (path == "/history/project") {
    if (project.empty()) return Error(400, "project: the query names no project (?project=P)");
    return ProjectPage(store, tenant, project);
  }
  if (path == "/history/case") {
    const std::string case_name = Param(query, "case");
    if (project.empty() || case_name.empty()) {
      return Error(400, "the query names no project and case (?project=P&case=C)");
    }
    return CasePage(store, tenant, project, case_name, Param(query, "branch"));
  }
  if (path == "/history/run") {
    std::int64_t id = 0;
    if (!absl::SimpleAtoi(Param(query, "run"), &id) || id <= 0) {
      return Error(400, "run: expected a run's id (?run=N)");
    }
    return RunPage(store, tenant, id);
  }
  return Error(404, absl::StrCat("no page at ", path,
                                 ": the history's pages are /history, /history/project, "
                                 "/history/case and /history/run"));
}

}  // namespace logitd::history
