#include "client/validate/report_html.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/common/server_info_json.h"
#include "client/validate/report_plots.h"

namespace logitd::validate {
namespace {

constexpr char kStyle[] = R"(body { font-family: sans-serif; margin: 1.5em; color: #1f2328; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.n { text-align: right; font-family: monospace; }
code, .figures { font-family: monospace; font-size: 0.9em; }
td.figures { min-width: 360px; max-width: 560px; overflow-wrap: anywhere; }
.pass { color: #1a7f37; } .fail { color: #cf222e; } .skip { color: #6e7781; }
.badge { display: inline-block; min-width: 3.5em; text-align: center; color: #fff;
  border-radius: 4px; padding: 0 6px; margin-right: 8px; font-weight: bold; }
.pass .badge, .badge.pass { background: #1a7f37; color: #fff; }
.fail .badge, .badge.fail { background: #cf222e; color: #fff; }
.skip .badge, .badge.skip { background: #6e7781; color: #fff; }
td.ok { background: #dafbe1; } td.bad { background: #ffebe9; }
.error { border: 2px solid #cf222e; padding: 0.5em; background: #ffebe9; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0.5em 0; } figcaption { max-width: 660px; font-size: 0.9em; }
)";

const char* VerdictClass(Verdict v) {
  switch (v) {
    case Verdict::kPassed:
      return "pass";
    case Verdict::kFailed:
      return "fail";
    case Verdict::kNotRun:
      return "skip";
  }
  return "skip";
}

// A suite fails when a case failed, passes when one passed, else was skipped.
Verdict SuiteVerdict(const VerdictCounts& c) {
  if (c.failed > 0) return Verdict::kFailed;
  if (c.passed > 0) return Verdict::kPassed;
  return Verdict::kNotRun;
}

const char* BadgeText(Verdict v) {
  return v == Verdict::kPassed ? "PASS" : v == Verdict::kFailed ? "FAIL" : "SKIP";
}

std::string E(absl::string_view text) { return XmlEscape(text); }

std::string CountsText(const VerdictCounts& c) {
  return absl::StrCat(c.passed, " passed, ", c.failed, " failed, ", c.not_run, " not run");
}

VerdictCounts Totals(const Report& report) {
  std::vector<const CaseResult*> all;
  for (const CaseResult& r : report.results) all.push_back(&r);
  return CountVerdicts(all);
}

const char* RunVerdict(const Report& report) {
  if (!report.error.empty()) return "ERROR";
  return Totals(report).failed > 0 ? "FAILED" : "PASSED";
}

std::string Verdicts(const Report& report) {
  std::string out = "<h2>Verdicts</h2>\n";
  for (const SuiteResults& s : BySuite(report.results)) {
    const VerdictCounts c = CountVerdicts(s.results);
    const Verdict v = SuiteVerdict(c);
    absl::StrAppend(&out, "<p class=\"", VerdictClass(v), "\"><span class=\"badge\">", BadgeText(v),
                    "</span><b>", E(s.suite), "</b>: ", CountsText(c), "</p>\n");
  }
  const VerdictCounts t = Totals(report);
  absl::StrAppend(&out, "<p><b>", t.TotalText(), "</b>: ", CountsText(t), " in ",
                  absl::StrFormat("%.1f", report.seconds), " s; exit code ", report.exit_code,
                  "</p>\n");
  return out;
}

void Row(std::string* out, absl::string_view key, absl::string_view value) {
  absl::StrAppend(out, "<tr><th>", E(key), "</th><td><code>", E(value), "</code></td></tr>\n");
}

std::string PlatformTable(const Report& report) {
  std::string out = "<h2>Platform</h2>\n<table>\n";
  Row(&out, "server_address", report.address);
  Row(&out, "started_at", report.started_at);
  if (report.have_info) {
    const nlohmann::ordered_json info =
        client::ServerInfoJson(report.info, /*with_request_memory=*/false);
    for (auto it = info.begin(); it != info.end(); ++it) Row(&out, it.key(), FigureText(*it));
  } else {
    Row(&out, "server", "no server info");
  }
  const Options& o = report.options;
  // `logitctl verify`'s page: its cases are candidates, and the harness's
  // suite options mean nothing for them.
  const bool verify_only = !report.results.empty() &&
                           std::all_of(report.results.begin(), report.results.end(),
                                       [](const CaseResult& r) { return r.suite == "verify"; });
  if (!verify_only) {
    Row(&out, "suites", absl::StrJoin(o.suites, ", "));
    Row(&out, "quick", o.quick ? "true" : "false");
    Row(&out, "seed", absl::StrCat(o.seed));
  }
  if (!o.baseline_path.empty()) Row(&out, "baseline", o.baseline_path);
  if (!o.record_path.empty()) Row(&out, "record", o.record_path);
  absl::StrAppend(&out, "</table>\n");
  return out;
}

// A figure as a table shows it: integers whole, other numbers to four
// significant digits (the --json report and the figures column keep every
// digit), text as it is.
std::string ShortText(const nlohmann::ordered_json& figure) {
  if (figure.is_number_float()) return absl::StrFormat("%.4g", figure.get<double>());
  return FigureText(figure);
}

// Every digit: a value an element's row shows beside its reference.
std::string FullCell(const nlohmann::ordered_json& f, const char* key) {
  if (!f.contains(key)) return "<td></td>";
  return absl::StrCat("<td class=\"n\">", E(FigureText(f[key])), "</td>");
}

std::string Cell(const nlohmann::ordered_json& f, const char* key, bool flag_nonzero = false) {
  if (!f.contains(key)) return "<td></td>";
  const double v = FigureValue(f[key]);
  const char* cls = !flag_nonzero ? "n" : v == 0 ? "n ok" : "n bad";
  return absl::StrCat("<td class=\"", cls, "\">", E(ShortText(f[key])), "</td>");
}

// special_values records, per output, what IEEE 754 predicts and what was wrong.
std::string SpecialValuesGrid(const Report& report) {
  std::string rows;
  for (const CaseResult& r : report.results) {
    if (r.suite != "special_values") continue;
    for (auto it = r.figures.begin(); it != r.figures.end(); ++it) {
      if (!it->is_object() || !it->contains("predicted_nan")) continue;
      const nlohmann::ordered_json& f = *it;
      absl::StrAppend(&rows, "<tr><td>", E(r.name), "</td><td><code>", E(it.key()), "</code></td>",
                      Cell(f, "outputs"), Cell(f, "predicted_nan"), Cell(f, "predicted_inf"),
                      Cell(f, "predicted_subnormal"), Cell(f, "lost_nan_or_inf", true),
                      Cell(f, "spurious_nan_or_inf", true), Cell(f, "wrong_value", true),
                      "</tr>\n");
    }
  }
  if (rows.empty()) return "";
  return absl::StrCat(
      "<h2>special_values: outputs against IEEE 754</h2>\n<table>\n<tr><th>case</th>"
      "<th>output</th><th>outputs</th><th>NaN expected</th><th>Inf expected</th>"
      "<th>subnormal expected</th><th>NaN/Inf lost</th><th>NaN/Inf where none belongs</th>"
      "<th>other wrong value</th></tr>\n",
      rows, "</table>\n");
}

std::string GoldenDiff(const Report& report) {
  std::string rows, notes;
  for (const CaseResult& r : report.results) {
    if (r.suite != "golden") continue;
    bool compared = false;
    for (auto it = r.figures.begin(); it != r.figures.end(); ++it) {
      if (!absl::EndsWith(it.key(), "_comparison") || !it->is_object()) continue;
      compared = true;
      const nlohmann::ordered_json& f = *it;
      const bool equal = f.value("equal", false);
      absl::StrAppend(&rows, "<tr><td>", E(r.name), "</td><td><code>",
                      E(it.key().substr(0, it.key().size() - 11)), "</code></td><td class=\"",
                      equal ? "ok" : "bad", "\">", equal ? "equal" : "DIFFERENT", "</td>",
                      Cell(f, "differing_elements"), Cell(f, "differing_blocks"), Cell(f, "blocks"),
                      Cell(f, "sampled_differing"), Cell(f, "sampled"), Cell(f, "max_ulp"),
                      "</tr>\n");
    }
    if (r.figures.contains("platform_difference")) {
      absl::StrAppend(&notes, "<li>", E(r.name), ": other platform (",
                      E(FigureText(r.figures["platform_difference"])), ")</li>\n");
    }
    if (!compared) {
      absl::StrAppend(&notes, "<li>", E(r.name), ": ", E(r.summary.empty() ? r.note : r.summary),
                      "</li>\n");
    }
  }
  if (rows.empty() && notes.empty()) return "";
  std::string out = "<h2>golden: outputs against the baseline</h2>\n";
  if (!report.options.baseline_path.empty()) {
    absl::StrAppend(&out, "<p>baseline <code>", E(report.options.baseline_path), "</code></p>\n");
  }
  if (!rows.empty()) {
    absl::StrAppend(&out,
                    "<table>\n<tr><th>case</th><th>output</th><th>bits</th><th>differing "
                    "elements</th><th>differing blocks</th><th>blocks</th><th>sampled "
                    "differing</th><th>sampled</th><th>max ulp</th></tr>\n",
                    rows, "</table>\n");
  } else {
    absl::StrAppend(&out, "<p>No baseline comparison ran.</p>\n");
  }
  if (!notes.empty()) absl::StrAppend(&out, "<ul>\n", notes, "</ul>\n");
  return out;
}

// verify's candidates: their verdict figures (the proven bound, the
// precision-class test, ULPs against logitd's and the correctly rounded
// value), and the elements the server listed with their references.
std::string VerifySection(const Report& report) {
  std::string rows, elements;
  for (const CaseResult& r : report.results) {
    if (r.suite != "verify" || !r.figures.contains("verdict")) continue;
    const nlohmann::ordered_json& f = r.figures;
    const nlohmann::ordered_json pc = f.value("precision_class", nlohmann::ordered_json::object());
    const bool tested = pc.value("tested", false);
    const bool passed = r.verdict == Verdict::kPassed;
    const auto class_cell = [&](const char* key, bool flag) {
      if (!tested) return std::string("<td></td>");
      if (!flag) return Cell(pc, key);
      return absl::StrCat("<td class=\"n ", pc.value("outside", false) ? "bad" : "ok", "\">",
                          E(ShortText(pc[key])), "</td>");
    };
    // Figures that read together share a cell: "a / b / c".
    const auto joined = [&](const nlohmann::ordered_json& o,
                            std::initializer_list<const char*> keys, const char* cls = "n") {
      std::vector<std::string> parts;
      for (const char* key : keys) {
        if (o.contains(key)) parts.push_back(ShortText(o[key]));
      }
      return absl::StrCat("<td class=\"", cls, "\">", E(absl::StrJoin(parts, " / ")), "</td>");
    };
    const std::string class_figures =
        !tested ? std::string("<td></td><td></td>")
                : absl::StrCat(joined(pc, {"rms_ratio", "threshold"},
                                      pc.value("outside", false) ? "n bad" : "n ok"),
                               joined(pc, {"effective_bits", "class_bits"}));
    absl::StrAppend(&rows, "<tr><td>", E(r.name), "</td><td class=\"", passed ? "ok" : "bad", "\">",
                    E(FigureText(f["verdict"])), "</td>", Cell(f, "elements"),
                    Cell(f, "outside_bound", true), Cell(f, "worst_bound_fraction"), class_figures,
                    class_cell("rows_outside", true), Cell(f, "nan_inf_mismatches", true),
                    Cell(f, "bitwise_equal_fraction"), joined(f, {"max_ulp", "p99_ulp", "p50_ulp"}),
                    f.value("max_ulp_exact", -1) >= 0
                        ? joined(f, {"max_ulp_exact", "p99_ulp_exact", "p50_ulp_exact"})
                        : std::string("<td></td>"),
                    "</tr>\n");
    if (!f.contains("first_outside") || f["first_outside"].empty()) continue;
    absl::StrAppend(&elements, "<h3>", E(r.name),
                    ": elements outside (the proven bound's first, then the precision-class "
                    "test's, then the probabilistic figure's)</h3>\n<table>\n"
                    "<tr><th>index</th><th>candidate</th><th>fp64 reference</th><th>proven "
                    "bound</th><th>outside it</th><th>class threshold</th><th>probabilistic "
                    "figure</th><th>logitd</th></tr>\n");
    for (const nlohmann::ordered_json& e : f["first_outside"]) {
      std::vector<std::string> index;
      for (const auto& i : e.value("index", nlohmann::ordered_json::array())) {
        index.push_back(FigureText(i));
      }
      const bool outside = e.value("outside_bound", false);
      absl::StrAppend(&elements, "<tr><td>[", E(absl::StrJoin(index, ", ")), "]</td>",
                      FullCell(e, "candidate"), FullCell(e, "reference"), Cell(e, "bound"),
                      "<td class=\"", outside ? "bad" : "n", "\">", outside ? "yes" : "no", "</td>",
                      Cell(e, "class_threshold"), Cell(e, "probabilistic_bound"),
                      FullCell(e, "logitd"), "</tr>\n");
    }
    absl::StrAppend(&elements, "</table>\n");
  }
  if (rows.empty()) return "";
  return absl::StrCat(
      "<h2>verify: candidates against the contract</h2>\n<p>Every element against the fp64 "
      "reference of the exact products of the bf16 inputs and its proven bound (outside: wrong "
      "for certain, <code>outside_bounds</code>); the candidate's errors against those of "
      "conforming fp32 accumulations of the same inputs, the precision-class test (RMS error over "
      "the conforming envelope's above its threshold: not fp32 accumulation, "
      "<code>outside_precision_class</code>); and logitd's own output of the same inputs (bits "
      "and ulps), with ulps from the correctly rounded exact value besides. Effective bits: the "
      "significand of a sequential round-to-nearest accumulator with the same RMS error (24 for "
      "fp32's own). docs/PROTOCOL.md, \"Verify\", derives the bounds and the test.</p>\n"
      "<table>\n<tr><th>candidate</th><th>verdict</th><th>elements</th><th>outside "
      "bound</th><th>worst ÷ bound</th><th>RMS ÷ envelope / threshold</th><th>effective bits / "
      "the envelope's</th><th>rows outside class</th><th>NaN/Inf mismatches</th>"
      "<th>bitwise logitd's (fraction)</th><th>ulp vs logitd: max / p99 / p50</th><th>ulp vs "
      "correctly rounded: max / p99 / p50</th></tr>\n",
      rows, "</table>\n", elements);
}

// Every leaf figure as "path = value", in the --json document's order.
void Flatten(const nlohmann::ordered_json& node, const std::string& path,
             std::vector<std::string>* out) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      Flatten(*it, path.empty() ? it.key() : absl::StrCat(path, ".", it.key()), out);
    }
    return;
  }
  out->push_back(absl::StrCat(E(path), " = ", E(FigureText(node))));
}

std::string CaseTable(const Report& report) {
  std::string out =
      "<h2>Every case</h2>\n<table>\n<tr><th>case</th><th>verdict</th><th>seconds</th>"
      "<th>key figures</th><th>figures (as in --json)</th></tr>\n";
  for (const CaseResult& r : report.results) {
    std::vector<std::string> figures;
    Flatten(r.figures, "", &figures);
    std::string detail = E(r.summary);
    for (const std::string& f : r.failures) absl::StrAppend(&detail, "<br/><b>", E(f), "</b>");
    if (!r.note.empty()) absl::StrAppend(&detail, "<br/><i>", E(r.note), "</i>");
    absl::StrAppend(&out, "<tr class=\"", VerdictClass(r.verdict), "\"><td>", E(r.FullName()),
                    "</td><td><span class=\"badge\">", BadgeText(r.verdict), "</span></td>",
                    "<td class=\"n\">", E(FigureText(r.seconds)), "</td><td>", detail,
                    "</td><td class=\"figures\">", absl::StrJoin(figures, "<br/>"), "</td></tr>\n");
  }
  absl::StrAppend(&out, "</table>\n");
  return out;
}

std::string Failures(const Report& report) {
  std::string items;
  for (const CaseResult& r : report.results) {
    if (r.verdict != Verdict::kFailed) continue;
    absl::StrAppend(&items, "<li><b>", E(r.FullName()), "</b><ul>\n");
    for (const std::string& f : r.failures) absl::StrAppend(&items, "<li>", E(f), "</li>\n");
    absl::StrAppend(&items, "</ul></li>\n");
  }
  if (items.empty()) return "";
  return absl::StrCat("<h2 class=\"fail\">Failures</h2>\n<ul>\n", items, "</ul>\n");
}

std::string Plots(const Report& report) {
  std::string out;
  const std::string rounding = RoundingErrorFigure(report);
  if (!rounding.empty())
    absl::StrAppend(&out, "<h2>rounding_error: error against K</h2>\n", rounding);
  const std::string elements = ElementHistograms(report);
  if (!elements.empty()) {
    absl::StrAppend(&out, "<h2>verify: every element's error as a fraction of its bound</h2>\n",
                    elements);
  }
  const std::vector<FractionGroup> groups = BoundFractions(report);
  if (!groups.empty()) {
    absl::StrAppend(
        &out, "<h2>Error as a fraction of its bound</h2>\n",
        "<p>Each count is one output of one case: its worst element's |error| divided by that "
        "element's bound, the <code>worst_bound_fraction</code> figures of the --json report. The "
        "harness keeps the worst element per output, not every element's error, so these are "
        "histograms of per-output maxima. Bins are decades; 0 is an exact result, above 1 a "
        "bound violated. Hover a bar for its outputs.</p>\n",
        FractionHistograms(groups));
  }
  return out;
}

std::string MdEscape(absl::string_view text) {
  std::string out;
  for (char ch : text) {
    // A line break would end the list item or table row; other controls
    // have no place in the page.
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += ' ';
      continue;
    }
    if (absl::string_view("\\`*[]<>|").find(ch) != absl::string_view::npos) out += '\\';
    out += ch;
  }
  return out;
}

absl::Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  out << text;
  out.close();
  if (!out)
    return absl::InternalError(absl::StrCat("--report: cannot write '", path.string(), "'"));
  return absl::OkStatus();
}

}  // namespace

// --compare's outputs that differ between the two servers, and its verdict.
std::string CompareSection(const Report& report) {
  if (report.compare.is_null()) return "";
  const nlohmann::ordered_json& c = report.compare;
  const std::string verdict = c.value("verdict", "");
  std::string rows;
  int equal = 0;
  for (const auto& o : c["outputs"]) {
    if (o.value("equal_fraction", 0.0) == 1.0) {
      ++equal;
      continue;
    }
    absl::StrAppend(&rows, "<tr><td><code>", E(o.value("output", "")), "</code></td><td>",
                    E(o.value("dtype", "")), "</td><td>", E(FigureText(o["equal_fraction"])),
                    "</td><td>", E(o.value("max_ulp", "")), "</td><td>", E(o.value("p99_ulp", "")),
                    "</td><td>", E(o.value("p50_ulp", "")), "</td></tr>\n");
  }
  std::string out = absl::StrCat(
      "<h2>compare: <code>", E(c.value("a", "")), "</code> against <code>", E(c.value("b", "")),
      "</code></h2>\n<p class=\"", verdict == "outside its bounds" ? "bad" : "ok", "\">",
      E(verdict), ": ", equal, " of ", c["outputs"].size(), " outputs bitwise equal</p>\n");
  if (!rows.empty()) {
    absl::StrAppend(&out,
                    "<table>\n<tr><th>output</th><th>dtype</th><th>bitwise-equal fraction</th>"
                    "<th>max ulp</th><th>p99 ulp</th><th>p50 ulp</th></tr>\n",
                    rows, "</table>\n");
  }
  // Each side's worst error against fp64 as a fraction of its bound, for
  // the cases that have one.
  std::string bounds;
  for (const auto& cb : c["cases"]) {
    const double a = cb.value("a_worst_bound_fraction", -1.0);
    const double b = cb.value("b_worst_bound_fraction", -1.0);
    if (a < 0 && b < 0) continue;
    absl::StrAppend(&bounds, "<tr><td><code>", E(cb.value("case", "")), "</code></td><td>",
                    a < 0 ? "-" : absl::StrFormat("%.4g", a), "</td><td>",
                    b < 0 ? "-" : absl::StrFormat("%.4g", b), "</td></tr>\n");
  }
  if (!bounds.empty()) {
    absl::StrAppend(&out,
                    "<table>\n<tr><th>case</th><th>A: worst error / bound</th>"
                    "<th>B: worst error / bound</th></tr>\n",
                    bounds, "</table>\n");
  }
  return out;
}

std::string CompareMarkdown(const Report& report) {
  if (report.compare.is_null()) return "";
  const nlohmann::ordered_json& c = report.compare;
  std::string out =
      absl::StrCat("\n#### Compare: ", MdEscape(c.value("a", "")), " against ",
                   MdEscape(c.value("b", "")), "\n\n**", MdEscape(c.value("verdict", "")), "**\n");
  std::string rows;
  for (const auto& o : c["outputs"]) {
    if (o.value("equal_fraction", 0.0) == 1.0) continue;
    absl::StrAppend(&rows, "| ", MdEscape(o.value("output", "")), " | ",
                    MdEscape(FigureText(o["equal_fraction"])), " | ", o.value("max_ulp", ""), " | ",
                    o.value("p99_ulp", ""), " |\n");
  }
  if (!rows.empty()) {
    absl::StrAppend(&out, "\n| output | bitwise-equal fraction | max ulp | p99 ulp |\n",
                    "|---|---:|---:|---:|\n", rows);
  }
  return out;
}

std::string ReportHtml(const Report& report) {
  const char* verdict = RunVerdict(report);
  const char* cls = absl::string_view(verdict) == "PASSED" ? "pass" : "fail";
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>",
      E(report.tool), ": ", verdict, " (", E(report.address), ")</title>\n<style>\n", kStyle,
      "</style>\n</head>\n<body>\n", "<h1 class=\"", cls, "\"><span class=\"badge\">", verdict,
      "</span>", E(report.tool), "</h1>\n", "<p>logitd at <code>", E(report.address),
      "</code>, started ", E(report.started_at), "</p>\n");
  if (!report.error.empty()) {
    absl::StrAppend(&out, "<p class=\"error\">", E(report.error), "</p>\n");
  }
  absl::StrAppend(&out, Verdicts(report), Failures(report), PlatformTable(report),
                  VerifySection(report), Plots(report), SpecialValuesGrid(report),
                  GoldenDiff(report), CompareSection(report), CaseTable(report),
                  "</body>\n</html>\n");
  return out;
}

std::string ReportMarkdown(const Report& report) {
  const std::string verdict = RunVerdict(report);
  const char* mark = verdict == "PASSED" ? "✅" : "❌";
  std::string out = absl::StrCat("### ", mark, " ", report.tool, ": ", verdict, "\n\n");
  if (!report.error.empty()) absl::StrAppend(&out, "**error:** ", MdEscape(report.error), "\n\n");
  if (!report.results.empty()) {
    absl::StrAppend(&out,
                    "| suite | verdict | passed | failed | not run |\n|---|---|---:|---:|---:|\n");
  }
  for (const SuiteResults& s : BySuite(report.results)) {
    const VerdictCounts c = CountVerdicts(s.results);
    const Verdict v = SuiteVerdict(c);
    const char* m = v == Verdict::kPassed ? "✅" : v == Verdict::kFailed ? "❌" : "⏭️";
    absl::StrAppend(&out, "| ", MdEscape(s.suite), " | ", m, " ", BadgeText(v), " | ", c.passed,
                    " | ", c.failed, " | ", c.not_run, " |\n");
  }
  const VerdictCounts t = Totals(report);
  absl::StrAppend(&out, "\n**", t.TotalText(), ":** ", CountsText(t), " in ",
                  absl::StrFormat("%.1f", report.seconds), " s (exit code ", report.exit_code,
                  ")\n");
  bool any = false;
  for (const CaseResult& r : report.results) {
    if (r.verdict != Verdict::kFailed) continue;
    if (!any) absl::StrAppend(&out, "\n#### Failures\n\n");
    any = true;
    absl::StrAppend(&out, "- **", MdEscape(r.FullName()), "**: ", MdEscape(r.summary), "\n");
    for (const std::string& f : r.failures) absl::StrAppend(&out, "  - ", MdEscape(f), "\n");
  }
  absl::StrAppend(&out, CompareMarkdown(report));
  absl::StrAppend(&out, "\n**Platform:** ", MdEscape(ServerLine(report)), "\n");
  return out;
}

absl::Status PrepareReportDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--report: cannot create directory '", dir, "': ", ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--report: '", dir, "' is not a directory"));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--report: directory '", dir, "' is not writable"));
  }
  return absl::OkStatus();
}

absl::Status WriteReportDir(const Report& report, const std::string& dir) {
  const absl::Status html =
      WriteFile(std::filesystem::path(dir) / "index.html", ReportHtml(report));
  if (!html.ok()) return html;
  return WriteFile(std::filesystem::path(dir) / "summary.md", ReportMarkdown(report));
}

namespace {

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

int WriteReportFiles(const Report& report, const std::string& json_path,
                     const std::string& junit_path, const std::string& report_dir,
                     const std::string& program) {
  int code = report.exit_code;
  const auto written = [&](const absl::Status& s) {
    if (s.ok()) return;
    std::fprintf(stderr, "%s: %s\n", program.c_str(), std::string(s.message()).c_str());
    code = std::max(code, 1);
  };
  if (!json_path.empty()) {
    written(WriteText(
        json_path,
        ReportJson(report).dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) +
            "\n"));
  }
  if (!junit_path.empty()) written(WriteText(junit_path, JUnitXml(report)));
  if (!report_dir.empty()) written(WriteReportDir(report, report_dir));
  return code;
}

}  // namespace logitd::validate
