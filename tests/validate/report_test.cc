// Reports: the exit code rule, the JSON document, and JUnit XML that stays
// well formed whatever the failure messages contain.
#include "client/validate/report.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/validate/sample_report.h"

namespace logitd::validate {
namespace {

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

Report Sample() {
  Report r = EmptySampleReport();
  CaseResult a;
  a.suite = "integer_exact";
  a.name = "K=512";
  a.verdict = Verdict::kPassed;
  a.summary = "y 0/10 differ";
  a.figures["k"] = 512;
  CaseResult b;
  b.suite = "integer_exact";
  b.name = "K=1024";
  b.verdict = Verdict::kFailed;
  b.failures = {"got <1> & want \"2\"\x01", "second"};
  r.results = {a, b, NotRunGoldenCast()};
  return r;
}

TEST(ReportTest, ExitCodes) {
  Report r = Sample();
  EXPECT_EQ(ExitCodeFor(r.results, false), 1);
  EXPECT_EQ(ExitCodeFor(r.results, true), 2);
  r.results.erase(r.results.begin() + 1);
  EXPECT_EQ(ExitCodeFor(r.results, false), 0);  // not run is not a failure
}

TEST(ReportTest, XmlEscape) {
  EXPECT_EQ(XmlEscape("a<b>&\"c'\x02"), "a&lt;b&gt;&amp;&quot;c&apos;?");
  EXPECT_EQ(XmlEscape("tab\tnl\n"), "tab\tnl\n");
}

TEST(ReportTest, JUnitCountsAndEscapes) {
  const std::string x = JUnitXml(Sample());
  EXPECT_EQ(x.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>", 0), 0u);
  EXPECT_NE(x.find("<testsuites name=\"logitctl validate\" tests=\"3\" failures=\"1\" "
                   "errors=\"0\" skipped=\"1\""),
            std::string::npos)
      << x;
  EXPECT_EQ(Count(x, "<testsuite "), 2u);
  EXPECT_EQ(Count(x, "<testcase "), 3u);
  EXPECT_EQ(Count(x, "<failure "), 1u);
  EXPECT_EQ(Count(x, "<skipped "), 1u);
  EXPECT_NE(x.find("got &lt;1&gt; &amp; want &quot;2&quot;?"), std::string::npos);
  EXPECT_NE(x.find("cpu &lt;model&gt; &amp; &quot;co&quot;"), std::string::npos);
  EXPECT_EQ(x.find('\x01'), std::string::npos);
}

TEST(ReportTest, JUnitForAnUnreachableServer) {
  Report r;
  r.address = "127.0.0.1:1";
  r.error = "cannot use logitd at 127.0.0.1:1: UNAVAILABLE";
  const std::string x = JUnitXml(r);
  EXPECT_NE(x.find("errors=\"1\""), std::string::npos);
  EXPECT_NE(x.find("<error message="), std::string::npos);
}

TEST(ReportTest, JsonCarriesServerAndCases) {
  Report r = Sample();
  r.exit_code = 1;
  const nlohmann::ordered_json j = ReportJson(r);
  EXPECT_EQ(j["server"]["backend"], "cpu");
  EXPECT_EQ(j["exit_code"], 1);
  ASSERT_EQ(j["cases"].size(), 3u);
  EXPECT_EQ(j["cases"][0]["verdict"], "passed");
  EXPECT_EQ(j["cases"][1]["verdict"], "FAILED");
  EXPECT_EQ(j["cases"][2]["verdict"], "not run");
  EXPECT_EQ(j["cases"][0]["figures"]["k"], 512);
  EXPECT_EQ(j["totals"]["failed"], 1);
  EXPECT_EQ(JsonNumber(1.0 / 0.0), "inf");
}

TEST(ReportTest, SummaryNamesFailures) {
  const std::string s = SummaryText(Sample());
  EXPECT_NE(s.find("integer_exact/K=1024"), std::string::npos) << s;
  EXPECT_NE(s.find("3 cases: 1 passed, 1 FAILED, 1 not run"), std::string::npos) << s;
  // And why the case did not run.
  EXPECT_NE(s.find("\nnot run: golden (1): no --baseline"), std::string::npos) << s;
}

TEST(ReportTest, OneCaseIsOneCase) {
  Report r = Sample();
  r.results.resize(1);
  const std::string s = SummaryText(r);
  EXPECT_NE(s.find("1 case: 1 passed, 0 FAILED, 0 not run"), std::string::npos) << s;
}

}  // namespace
}  // namespace logitd::validate
