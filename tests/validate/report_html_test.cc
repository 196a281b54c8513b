// The reports for people: the SVG writer's scales and ticks, the HTML page
// (well formed whatever the failure messages hold, no script, the JSON's
// numbers), the markdown summary, and the report directory's checks.
#include "client/validate/report_html.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "client/validate/report_plots.h"
#include "client/validate/svg.h"
#include "gtest/gtest.h"
#include "tests/validate/sample_report.h"
#include "tests/validate/xml_check.h"

namespace logitd::validate {
namespace {

using ::logitd::testing::XmlProblem;

std::string WithoutDoctype(const std::string& html) {
  const std::string doctype = "<!DOCTYPE html>\n";
  return html.rfind(doctype, 0) == 0 ? html.substr(doctype.size()) : "no doctype";
}

CaseResult Rounding(int k, double fp32, double bf16, double worst) {
  CaseResult r;
  r.suite = "rounding_error";
  r.name = "K=" + std::to_string(k);
  r.verdict = worst <= 1 ? Verdict::kPassed : Verdict::kFailed;
  r.figures["k"] = k;
  r.figures["fp32_max_abs_err"] = 1.0000000000000002e-5;
  r.figures["fp32_rel_frobenius_err"] = fp32;
  r.figures["bf16_rel_frobenius_err"] = bf16;
  r.figures["gamma_k"] = k * 5.96e-8;
  r.figures["worst_bound_fraction"] = worst;
  if (worst > 1) r.failures = {"3 of 4 fp32 logits lie outside the bound γ_K·Σ|x·w| <here> & \x02"};
  return r;
}

Report Sample() {
  Report r = EmptySampleReport();
  r.options.suites = {"rounding_error", "backward_contract", "golden"};
  r.results.push_back(Rounding(512, 1.25e-7, 1.7e-3, 0.0123456789012345));
  r.results.push_back(Rounding(4096, 0.0, 1.7e-3, 2.5));
  CaseResult b;
  b.suite = "backward_contract";
  b.name = "grad_bounds";
  b.verdict = Verdict::kPassed;
  b.figures["dx_fp32"] = {{"violations", 0}, {"worst_bound_fraction", 3.5e-4}};
  b.figures["dw_fp32"] = {{"violations", 0}, {"worst_bound_fraction", 0}};
  b.figures["nan_figure"] = "nan";
  r.results.push_back(b);
  r.results.push_back(NotRunGoldenCast());
  return r;
}

TEST(SvgTest, ScalesAndTicks) {
  const svg::Scale lin{0, 10, 100, 200};
  EXPECT_DOUBLE_EQ(lin(5), 150);
  const svg::Scale log{1e-8, 1e-2, 300, 0, /*log=*/true};
  EXPECT_DOUBLE_EQ(log(1e-8), 300);
  EXPECT_NEAR(log(1e-5), 150, 1e-9);
  EXPECT_FALSE(log.Drawable(0));
  EXPECT_TRUE(log.Drawable(1e-9));
  EXPECT_EQ(svg::DecadeRange(1.25e-7, 1.7e-3), std::make_pair(1e-7, 1e-2));
  const std::vector<svg::Tick> decades = svg::DecadeTicks(1e-7, 1e-2);
  ASSERT_EQ(decades.size(), 6u);
  EXPECT_EQ(decades.front().label, "1e-7");
  EXPECT_EQ(decades.back().label, "1e-2");
  const std::vector<svg::Tick> ticks = svg::LinearTicks(0, 4, 4);
  ASSERT_EQ(ticks.size(), 5u);
  EXPECT_EQ(ticks[2].label, "2");
}

TEST(SvgTest, CanvasIsWellFormedAndEscapesText) {
  svg::Canvas c(100, 50, "a <title> & more");
  c.Polyline({{0, 0}, {10, 20}}, "#123456", 1.5, /*dashed=*/true);
  c.Circle(5, 5, 2, "red", "tip <1> & 'two'");
  c.Rect(1, 2, 3, 4, "blue");
  c.Text(10, 10, "x < y", svg::Canvas::Anchor::kMiddle, 10, /*rotate=*/true);
  const std::string s = c.Str();
  EXPECT_EQ(XmlProblem(s), "") << s;
  EXPECT_NE(s.find("a &lt;title&gt; &amp; more"), std::string::npos) << s;
  EXPECT_NE(s.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(s.find("rotate(-90 10.0 10.0)"), std::string::npos);
}

TEST(ReportHtmlTest, PageIsWellFormedWithoutScriptAndShowsTheJsonNumbers) {
  const Report r = Sample();
  const std::string html = ReportHtml(r);
  EXPECT_EQ(XmlProblem(WithoutDoctype(html)), "") << html;
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find('\x02'), std::string::npos);
  // Figures as the JSON document writes them.
  const nlohmann::ordered_json json = ReportJson(r);
  const std::string fraction = json["cases"][0]["figures"]["worst_bound_fraction"].dump();
  EXPECT_EQ(fraction, "0.0123456789012345");
  EXPECT_NE(html.find("worst_bound_fraction = " + fraction), std::string::npos);
  const std::string max_abs = json["cases"][0]["figures"]["fp32_max_abs_err"].dump();
  EXPECT_EQ(max_abs.size(), 22u) << max_abs;  // 17 significant digits: 1.0000000000000003e-05
  EXPECT_NE(html.find("fp32_max_abs_err = " + max_abs), std::string::npos);
  EXPECT_NE(html.find("dx_fp32.worst_bound_fraction = 0.00035"), std::string::npos);
  EXPECT_NE(html.find("nan_figure = nan"), std::string::npos);
  // Verdict lines, the platform (escaped), the failure, the plot.
  EXPECT_NE(html.find("<b>rounding_error</b>: 1 passed, 1 failed, 0 not run"), std::string::npos);
  EXPECT_NE(html.find("<b>golden</b>: 0 passed, 0 failed, 1 not run"), std::string::npos);
  EXPECT_NE(html.find("cpu &lt;model&gt; &amp; &quot;co&quot;"), std::string::npos);
  EXPECT_NE(html.find("&lt;here&gt; &amp; ?"), std::string::npos);
  EXPECT_NE(html.find("rounding_error: relative error against K"), std::string::npos);
  EXPECT_NE(html.find("golden: outputs against the baseline"), std::string::npos);
  EXPECT_NE(html.find("No baseline comparison ran."), std::string::npos);
}

TEST(ReportHtmlTest, BoundFractionsAreGroupedByOutput) {
  const std::vector<FractionGroup> groups = BoundFractions(Sample());
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].title, "Logits");
  ASSERT_EQ(groups[0].items.size(), 2u);
  EXPECT_EQ(groups[0].items[0].label, "rounding_error/K=512 fp32 logits");
  EXPECT_EQ(groups[0].items[1].text, "2.5");
  EXPECT_EQ(groups[1].title, "dX");
  EXPECT_EQ(groups[1].items[0].label, "backward_contract/grad_bounds dx_fp32");
  EXPECT_EQ(groups[2].title, "dW");
  EXPECT_EQ(groups[2].items[0].value, 0);
}

TEST(ReportHtmlTest, CompareShowsDifferingOutputsAndEachSidesBoundFraction) {
  Report r = Sample();
  r.compare = {{"a", "gpu:1"},
               {"b", "cpu:2"},
               {"verdict", "different, both within bounds"},
               {"outputs",
                {{{"output", "rounding_error/K=512: y fp32"},
                  {"dtype", "fp32"},
                  {"equal_fraction", 0.25},
                  {"max_ulp", "7"},
                  {"p99_ulp", "3"},
                  {"p50_ulp", "1"}},
                 {{"output", "integer_exact/K=512: y fp32"},
                  {"dtype", "fp32"},
                  {"equal_fraction", 1.0},
                  {"max_ulp", "0"},
                  {"p99_ulp", "0"},
                  {"p50_ulp", "0"}}}},
               {"cases",
                {{{"case", "rounding_error/K=512"},
                  {"a_worst_bound_fraction", 0.03125},
                  {"b_worst_bound_fraction", 0.5}},
                 {{"case", "backward_contract/cast_rne"},
                  {"a_worst_bound_fraction", -1.0},
                  {"b_worst_bound_fraction", -1.0}}}}};
  const std::string html = ReportHtml(r);
  EXPECT_EQ(XmlProblem(WithoutDoctype(html)), "") << html;
  EXPECT_NE(html.find("different, both within bounds: 1 of 2 outputs bitwise equal"),
            std::string::npos);
  EXPECT_NE(html.find("<code>rounding_error/K=512: y fp32</code></td><td>fp32</td><td>0.25</td>"
                      "<td>7</td><td>3</td><td>1</td>"),
            std::string::npos)
      << html;
  EXPECT_EQ(html.find("<code>integer_exact/K=512: y fp32</code>"), std::string::npos);
  EXPECT_NE(html.find("<code>rounding_error/K=512</code></td><td>0.03125</td><td>0.5</td>"),
            std::string::npos);
  EXPECT_EQ(html.find("<code>backward_contract/cast_rne</code>"), std::string::npos);
}

TEST(ReportHtmlTest, FigureValuesReadJsonNumbersAndNonFiniteStrings) {
  EXPECT_EQ(FigureValue(nlohmann::ordered_json(0.5)), 0.5);
  EXPECT_EQ(FigureValue(JsonNumber(std::numeric_limits<double>::infinity())),
            std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(FigureValue(JsonNumber(std::nan("")))));
  EXPECT_EQ(FigureText(nlohmann::ordered_json(512)), "512");
  EXPECT_EQ(FigureText(nlohmann::ordered_json("inf")), "inf");
}

TEST(ReportHtmlTest, MarkdownHasVerdictsTotalsFailuresAndPlatform) {
  Report r = Sample();
  r.seconds = 12.34;
  r.exit_code = 1;
  const std::string md = ReportMarkdown(r);
  EXPECT_NE(md.find("### ❌ logitctl validate: FAILED"), std::string::npos) << md;
  EXPECT_NE(md.find("| rounding_error | ❌ FAIL | 1 | 1 | 0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| backward_contract | ✅ PASS | 1 | 0 | 0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| golden | ⏭️ SKIP | 0 | 0 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("**4 cases:** 2 passed, 1 failed, 1 not run in 12.3 s (exit code 1)"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("- **rounding_error/K=4096**"), std::string::npos) << md;
  // Markdown and HTML metacharacters in messages are escaped.
  EXPECT_NE(md.find("γ_K·Σ\\|x·w\\| \\<here\\>"), std::string::npos) << md;
  EXPECT_NE(md.find("**Platform:** server 127.0.0.1:1"), std::string::npos) << md;
}

TEST(ReportHtmlTest, ReportDirIsCreatedOrRefused) {
  const std::string base = ::testing::TempDir() + "report_html_test_" + std::to_string(getpid());
  const std::string dir = base + "/a/b";
  ASSERT_TRUE(PrepareReportDir(dir).ok());
  ASSERT_TRUE(WriteReportDir(Sample(), dir).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/index.html"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/summary.md"));
  std::ofstream(base + "/file") << "x";
  const absl::Status s = PrepareReportDir(base + "/file/sub");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--report: cannot create directory"), std::string::npos) << s;
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace logitd::validate
