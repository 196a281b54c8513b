// The harness end to end: the real logitctl binary against the real logitd
// (cpu backend) started on a free port. A clean server passes every suite;
// a server with a deliberately wrong result (a test-only fault) or a doctored
// baseline makes the matching suite fail; an unreachable server exits 2.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/validate/report.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/server_process.h"
#include "tests/validate/xml_check.h"

namespace logitd {
namespace {

using ::logitd::testing::ServerProcess;
using ::logitd::testing::XmlProblem;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Starts logitctl with `args`, its stdout and stderr going to files in `dir`.
pid_t SpawnLogitctl(const std::string& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {LOGITCTL_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out_path = dir + "/stdout";
  const std::string err_path = dir + "/stderr";
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execv(LOGITCTL_PATH, argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for a spawned logitctl (killing it past `timeout`).
CommandResult WaitLogitctl(pid_t pid, const std::string& dir,
                           absl::Duration timeout = absl::Minutes(5)) {
  CommandResult r;
  if (pid < 0) return r;
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.err = "timed out";
      return r;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(dir + "/stdout");
  r.err = ReadFile(dir + "/stderr");
  return r;
}

CommandResult RunLogitctl(const std::string& dir, const std::vector<std::string>& args) {
  return WaitLogitctl(SpawnLogitctl(dir, args), dir);
}

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

class ValidateE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/logitd-validate-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  ServerProcess Start(const std::string& fault = "", std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--backend=cpu"};
    if (!fault.empty()) args.push_back("--test_fault=" + fault);
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<ServerProcess> s = ServerProcess::Start(LOGITD_SERVER_PATH, args);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }

  // logitctl validate --server=ADDR ARGS... --json=DIR/report.json --junit=DIR/report.xml
  CommandResult Validate(const ServerProcess& server, std::vector<std::string> args) {
    std::vector<std::string> all = {"validate", "--server=" + server.address(),
                                    "--json",   Path("report.json"),
                                    "--junit",  Path("report.xml")};
    all.insert(all.end(), args.begin(), args.end());
    return RunLogitctl(dir_, all);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  nlohmann::json Json() const { return nlohmann::json::parse(ReadFile(Path("report.json"))); }
  std::string JUnit() const { return ReadFile(Path("report.xml")); }

  // suite/case -> verdict.
  std::map<std::string, std::string> Verdicts() const {
    std::map<std::string, std::string> v;
    const nlohmann::json j = Json();
    for (const auto& c : j["cases"]) {
      v[c["suite"].get<std::string>() + "/" + c["case"].get<std::string>()] = c["verdict"];
    }
    return v;
  }

  std::string dir_;
};

std::string Describe(const CommandResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\nstdout:\n", r.out, "\nstderr:\n", r.err);
}

TEST_F(ValidateE2eTest, QuickRunOfEverySuitePassesOnACleanCpuServer) {
  ServerProcess server = Start();
  const CommandResult r = Validate(server, {"--quick", "--record", Path("baseline.json")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const nlohmann::json j = Json();
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["server"]["backend"], "cpu");
  std::map<std::string, int> per_suite;
  for (const auto& c : j["cases"]) {
    EXPECT_EQ(c["verdict"], "passed") << c.dump();
    ++per_suite[c["suite"].get<std::string>()];
  }
  for (const char* suite :
       {"integer_exact", "rounding_error", "backward_contract", "special_values", "cross_entropy",
        "logprobs", "golden", "determinism"}) {
    EXPECT_GT(per_suite[suite], 0) << suite;
  }
  // The determinism suite replays the cross_entropy suite's first request.
  EXPECT_EQ(Verdicts().at("determinism/replay_cross_entropy"), "passed");
  EXPECT_EQ(Verdicts().at("determinism/replay_logprobs"), "passed");
  EXPECT_EQ(j["totals"]["failed"], 0);
  EXPECT_EQ(j["totals"]["passed"], j["cases"].size());
  // The seed's table and the summary are printed.
  EXPECT_NE(r.out.find("fp32 rel Frob"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cross_entropy: X ["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 FAILED"), std::string::npos) << r.out;

  const std::string x = JUnit();
  EXPECT_EQ(XmlProblem(x), "") << x;
  EXPECT_EQ(Count(x, "<testcase "), j["cases"].size());
  EXPECT_EQ(Count(x, "<failure "), 0u);
  EXPECT_NE(x.find("failures=\"0\""), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(Path("baseline.json")));
}

// --suite=logprobs runs that suite alone, every case passing on the cpu
// backend, with its figures in the JSON report.
TEST_F(ValidateE2eTest, LogProbsSuiteAlonePasses) {
  ServerProcess server = Start();
  const CommandResult r = Validate(server, {"--quick", "--suite=logprobs"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::map<std::string, std::string> v = Verdicts();
  for (const char* c :
       {"bounds", "bounds_scaled_capped", "exact", "cross_entropy_bitwise", "bf16_head_mismatch"}) {
    EXPECT_EQ(v.count(absl::StrCat("logprobs/", c)), 1u) << c;
  }
  for (const auto& [name, verdict] : v) {
    EXPECT_TRUE(absl::StartsWith(name, "logprobs/")) << name;
    EXPECT_EQ(verdict, "passed") << name;
  }
  const nlohmann::json report = Json();
  for (const auto& c : report["cases"]) {
    if (c["case"] != "bf16_head_mismatch") continue;
    // The bf16 head misses the fp32 bound on some token; LogProbs does not.
    EXPECT_GT(c["figures"]["bf16_tokens_outside_bound"].get<int>(), 0) << c.dump();
    EXPECT_EQ(c["figures"]["logprobs"]["violations"].get<int>(), 0) << c.dump();
  }
}

TEST_F(ValidateE2eTest, RecordThenBaselinePasses) {
  ServerProcess server = Start();
  const CommandResult rec = Validate(server, {"golden", "--record", Path("b.json")});
  ASSERT_EQ(rec.exit_code, 0) << Describe(rec);
  // The platform is held once, under "platform"; "server" names the build.
  std::ifstream in(Path("b.json"));
  const nlohmann::json b = nlohmann::json::parse(in);
  EXPECT_EQ(b["platform"]["backend"], "cpu");
  EXPECT_FALSE(b["server"].contains("backend")) << b["server"].dump();
  EXPECT_FALSE(b["server"].contains("device_name")) << b["server"].dump();
  EXPECT_TRUE(b["server"].contains("build_id")) << b["server"].dump();
  const CommandResult cmp = Validate(server, {"golden", "--baseline", Path("b.json")});
  ASSERT_EQ(cmp.exit_code, 0) << Describe(cmp);
  for (const auto& [name, verdict] : Verdicts()) EXPECT_EQ(verdict, "passed") << name;
}

TEST_F(ValidateE2eTest, DoctoredBaselineFailsAndNamesTheCase) {
  ServerProcess server = Start();
  ASSERT_EQ(Validate(server, {"--suite=golden", "--record", Path("b.json")}).exit_code, 0);
  nlohmann::json b = nlohmann::json::parse(ReadFile(Path("b.json")));
  // Flip one bit of one stored digest.
  std::string digest = b["cases"][0]["outputs"][0]["xxh3"];
  const std::string name = b["cases"][0]["name"];
  digest.back() = digest.back() == '0' ? '1' : '0';
  b["cases"][0]["outputs"][0]["xxh3"] = digest;
  std::ofstream(Path("doctored.json")) << b.dump(1);

  const CommandResult r = Validate(server, {"--suite=golden", "--baseline", Path("doctored.json")});
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  const std::map<std::string, std::string> v = Verdicts();
  EXPECT_EQ(v.at("golden/" + name), "FAILED");
  int failed = 0;
  for (const auto& [n, verdict] : v) failed += verdict == "FAILED";
  EXPECT_EQ(failed, 1);
  EXPECT_NE(r.out.find("golden/" + name), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("case '" + name + "'"), std::string::npos) << r.out;
  EXPECT_EQ(XmlProblem(JUnit()), "");
}

TEST_F(ValidateE2eTest, BaselineFromAnotherPlatformIsRefusedUnlessAllowed) {
  ServerProcess server = Start();
  ASSERT_EQ(Validate(server, {"golden", "--record", Path("b.json")}).exit_code, 0);
  nlohmann::json b = nlohmann::json::parse(ReadFile(Path("b.json")));
  b["platform"]["device_name"] = "NVIDIA H100 80GB HBM3";
  b["platform"]["backend"] = "cuda";
  std::ofstream(Path("other.json")) << b.dump(1);

  const CommandResult refused = Validate(server, {"golden", "--baseline", Path("other.json")});
  EXPECT_EQ(refused.exit_code, 1) << Describe(refused);
  EXPECT_NE(refused.out.find("--allow_other_platform"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("NVIDIA H100"), std::string::npos) << refused.out;

  const CommandResult allowed =
      Validate(server, {"golden", "--baseline", Path("other.json"), "--allow_other_platform"});
  EXPECT_EQ(allowed.exit_code, 0) << Describe(allowed);
}

TEST_F(ValidateE2eTest, UnreachableServerExits2) {
  ServerProcess server = Start();
  server.Stop();
  const CommandResult r = Validate(server, {"--quick", "integer_exact"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  const nlohmann::json j = Json();
  EXPECT_EQ(j["exit_code"], 2);
  EXPECT_TRUE(j.contains("error"));
  const std::string x = JUnit();
  EXPECT_EQ(XmlProblem(x), "") << x;
  EXPECT_NE(x.find("errors=\"1\""), std::string::npos) << x;
}

// A server that goes away in the middle of a run stops it with exit 2: the
// remaining cases are not run, and the reports say why.
TEST_F(ValidateE2eTest, ServerGoneMidRunExits2) {
  ServerProcess server = Start();
  // The full integer_exact suite takes far longer than the wait below.
  const pid_t pid = SpawnLogitctl(dir_, {"validate", "--server=" + server.address(), "--json",
                                         Path("report.json"), "integer_exact"});
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (server.Log().find("Logits") == std::string::npos && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  server.Stop();
  const CommandResult r = WaitLogitctl(pid, dir_);
  ASSERT_EQ(r.exit_code, 2) << Describe(r);
  const nlohmann::json j = Json();
  EXPECT_NE(j["error"].get<std::string>().find("unreachable"), std::string::npos) << j.dump(1);
  EXPECT_GT(j["totals"]["not_run"].get<int>(), 0) << j.dump(1);
}

// Bad options exit 2 like every logitctl usage error: not a precision failure.
// --compare: the same suites against a second server, every output
// compared. One BLAS thread against two gives the same or nearly the same
// bits, both within bounds: exit 0 either way, with the comparison in the
// JSON report.
TEST_F(ValidateE2eTest, CompareTwoCleanServersPasses) {
  ServerProcess a = Start("", {"--cpu_threads=1"});
  ServerProcess b = Start("", {"--cpu_threads=2"});
  const CommandResult r = Validate(a, {"--quick", "--compare=" + b.address()});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const nlohmann::json j = Json();
  ASSERT_TRUE(j.contains("compare")) << j.dump(1);
  const std::string verdict = j["compare"]["verdict"];
  EXPECT_TRUE(verdict == "identical" || verdict == "different, both within bounds") << verdict;
  EXPECT_GT(j["compare"]["outputs"].size(), 20u);
  EXPECT_TRUE(j["compare"]["only_in_a"].empty());
  EXPECT_TRUE(j["compare"]["only_in_b"].empty());
  EXPECT_NE(r.out.find("compare verdict: " + verdict), std::string::npos) << r.out;
}

// A server whose logits are one ulp off in their first element: with the
// bounded suite alone the two differ within bounds (exit 0, the ULP figures
// reported); with the exact suite too the wrong side fails (exit 1).
TEST_F(ValidateE2eTest, CompareReportsAOneUlpDifference) {
#ifndef LOGITD_TEST_FAULTS_ENABLED
  GTEST_SKIP() << "logitd is built without LOGITD_ENABLE_TEST_FAULTS";
#endif
  ServerProcess a = Start();
  ServerProcess b = Start("logits_bit");
  CommandResult r = Validate(a, {"--quick", "--suite", "rounding_error", "--compare=" + b.address(),
                                 "--report", Path("report")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  nlohmann::json j = Json();
  EXPECT_EQ(j["compare"]["verdict"], "different, both within bounds");
  // The reports for people carry the comparison too.
  const std::string md = ReadFile(Path("report/summary.md"));
  EXPECT_NE(md.find("#### Compare: "), std::string::npos) << md;
  EXPECT_NE(md.find("**different, both within bounds**"), std::string::npos) << md;
  EXPECT_NE(ReadFile(Path("report/index.html")).find("<h2>compare: "), std::string::npos);
  bool saw_fp32 = false;
  for (const auto& o : j["compare"]["outputs"]) {
    if (o["dtype"] != "fp32") continue;
    saw_fp32 = true;
    EXPECT_EQ(o["max_ulp"], "1") << o.dump();
    EXPECT_LT(o["equal_fraction"].get<double>(), 1.0) << o.dump();
    EXPECT_GT(o["equal_fraction"].get<double>(), 0.99) << o.dump();
  }
  EXPECT_TRUE(saw_fp32) << j["compare"].dump(1);

  r = Validate(a,
               {"--quick", "--suite", "integer_exact,rounding_error", "--compare=" + b.address()});
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  j = Json();
  EXPECT_EQ(j["compare"]["verdict"], "outside its bounds");
  EXPECT_NE(r.out.find("integer_exact/K=512: A passed, B FAILED"), std::string::npos) << r.out;
}

TEST_F(ValidateE2eTest, CompareWithAnUnreachableServerExits2) {
  ServerProcess a = Start();
  const CommandResult r =
      Validate(a, {"--quick", "--suite", "rounding_error", "--compare=127.0.0.1:1"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("--compare: cannot use logitd at 127.0.0.1:1"), std::string::npos) << r.err;
}

TEST_F(ValidateE2eTest, UnknownSuiteIsRefused) {
  ServerProcess server = Start();
  const CommandResult r = Validate(server, {"--suite=integer_exac"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("unknown suite 'integer_exac'"), std::string::npos) << r.err;
}

// What the HTML report must show for a figure: "path = value", the value
// written as the --json document writes it, escaped for XML (XmlEscape,
// tested on its own in report_test.cc).
std::string Escaped(const std::string& text) { return validate::XmlEscape(text); }

void FigureLines(const nlohmann::ordered_json& node, const std::string& path,
                 std::vector<std::string>* out) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      FigureLines(*it, path.empty() ? it.key() : path + "." + it.key(), out);
    }
    return;
  }
  const std::string value = node.is_string() ? node.get<std::string>() : node.dump();
  out->push_back(Escaped(path) + " = " + Escaped(value));
}

// The HTML report's problems as a page: not well-formed, a script, or
// anything it would fetch.
std::string PageProblem(const std::string& html) {
  const std::string doctype = "<!DOCTYPE html>\n";
  if (html.rfind(doctype, 0) != 0) return "no <!DOCTYPE html>";
  if (const std::string p = XmlProblem(html.substr(doctype.size())); !p.empty()) return p;
  for (const char* bad : {"<script", "http://", "https://", " src=", " href=", "url("}) {
    if (html.find(bad) != std::string::npos) return std::string("contains ") + bad;
  }
  return "";
}

TEST_F(ValidateE2eTest, ReportDirHoldsAPageAndASummaryWithTheJsonNumbers) {
  ServerProcess server = Start();
  ASSERT_EQ(Validate(server, {"golden", "--record", Path("b.json")}).exit_code, 0);
  // The directory is made, parents included.
  const std::string dir = Path("out/report");
  const CommandResult r =
      Validate(server, {"--quick", "rounding_error", "backward_contract", "special_values",
                        "cross_entropy", "golden", "--baseline", Path("b.json"), "--report", dir});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string html = ReadFile(dir + "/index.html");
  const std::string md = ReadFile(dir + "/summary.md");
  EXPECT_EQ(PageProblem(html), "");
  // The rounding_error plot, the four histograms and golden's outputs
  // against their bounds (under "Other").
  EXPECT_EQ(Count(html, "<svg "), 6u) << html;
  EXPECT_NE(html.find("golden/logits_fp32 y"), std::string::npos);
  EXPECT_NE(html.find("special_values: outputs against IEEE 754"), std::string::npos);
  EXPECT_NE(html.find("golden: outputs against the baseline"), std::string::npos);

  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(ReadFile(Path("report.json")));
  std::map<std::string, std::array<int, 3>> per_suite;
  std::size_t checked = 0;
  for (const auto& c : j["cases"]) {
    const std::string suite = c["suite"];
    EXPECT_NE(html.find(Escaped(suite + "/" + c["case"].get<std::string>())), std::string::npos);
    std::vector<std::string> lines;
    FigureLines(c["figures"], "", &lines);
    for (const std::string& line : lines) EXPECT_NE(html.find(line), std::string::npos) << line;
    checked += lines.size();
    ++per_suite[suite][c["verdict"] == "passed" ? 0 : c["verdict"] == "FAILED" ? 1 : 2];
    if (suite == "rounding_error") {
      // The plot's hover text carries the JSON's figure too.
      EXPECT_NE(
          html.find("fp32_rel_frobenius_err " + c["figures"]["fp32_rel_frobenius_err"].dump()),
          std::string::npos);
    }
  }
  EXPECT_GT(checked, 300u);
  for (const auto& [suite, n] : per_suite) {
    const std::string row =
        absl::StrCat("| ", suite, " | ✅ PASS | ", n[0], " | ", n[1], " | ", n[2], " |");
    EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  }
  const nlohmann::ordered_json& t = j["totals"];
  const std::string totals = absl::StrCat(
      "**", t["cases"].get<int>(), t["cases"].get<int>() == 1 ? " case:** " : " cases:** ",
      t["passed"].get<int>(), " passed, ", t["failed"].get<int>(), " failed, ",
      t["not_run"].get<int>(), " not run");
  EXPECT_NE(md.find(totals), std::string::npos) << md;
  EXPECT_NE(md.find("backend " + j["server"]["backend"].get<std::string>()), std::string::npos)
      << md;
  EXPECT_NE(html.find("<code>" + Escaped(j["server"]["blas_version"].get<std::string>())),
            std::string::npos);
}

TEST_F(ValidateE2eTest, ReportOfAFailedRunSpellsOutTheFailures) {
#ifndef LOGITD_TEST_FAULTS_ENABLED
  GTEST_SKIP() << "logitd is built without LOGITD_ENABLE_TEST_FAULTS";
#endif
  ServerProcess server = Start("fp32_as_bf16");
  const CommandResult r =
      Validate(server, {"--quick", "rounding_error", "--report", Path("report")});
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  const std::string html = ReadFile(Path("report/index.html"));
  const std::string md = ReadFile(Path("report/summary.md"));
  EXPECT_EQ(PageProblem(html), "");
  EXPECT_NE(html.find("<span class=\"badge\">FAILED</span>"), std::string::npos);
  EXPECT_NE(md.find("logitctl validate: FAILED"), std::string::npos) << md;
  EXPECT_NE(md.find("#### Failures"), std::string::npos) << md;
  EXPECT_NE(md.find("- **rounding_error/K=512**"), std::string::npos) << md;
  EXPECT_NE(md.find("accumulation bound"), std::string::npos) << md;
  // Outside the bound: the histogram's last bin, in red, is drawn.
  EXPECT_NE(html.find("fill=\"#cf222e\"><title>rounding_error/K=512 fp32 logits: "),
            std::string::npos);
}

TEST_F(ValidateE2eTest, UnusableReportDirExits2BeforeAnyWork) {
  ServerProcess server = Start();
  std::ofstream(Path("file")) << "not a directory";
  const CommandResult r =
      Validate(server, {"--quick", "integer_exact", "--report", Path("file/report")});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_NE(r.err.find("--report: cannot create directory"), std::string::npos) << r.err;
  EXPECT_EQ(server.Log().find("Logits"), std::string::npos) << server.Log();
}

struct FaultCase {
  const char* fault;
  const char* suite;
  const char* failing_case;  // must be FAILED in the JSON report
  const char* message;       // a piece of its failure text
};

void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << c.fault << " -> " << c.suite << "/" << c.failing_case;
}

class FaultTest : public ValidateE2eTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(FaultTest, SuiteFailsAgainstAWrongServer) {
#ifndef LOGITD_TEST_FAULTS_ENABLED
  GTEST_SKIP() << "logitd is built without LOGITD_ENABLE_TEST_FAULTS";
#endif
  const FaultCase& p = GetParam();
  ServerProcess server = Start(p.fault);
  const CommandResult r = Validate(server, {"--quick", "--suite", p.suite});
  ASSERT_EQ(r.exit_code, 1) << Describe(r) << server.Log();
  const std::map<std::string, std::string> v = Verdicts();
  const std::string key = absl::StrCat(p.suite, "/", p.failing_case);
  ASSERT_TRUE(v.count(key)) << key;
  EXPECT_EQ(v.at(key), "FAILED");
  bool found = false;
  const nlohmann::json j = Json();
  for (const auto& c : j["cases"]) {
    if (c["suite"] != p.suite || c["case"] != p.failing_case) continue;
    for (const auto& f : c["failures"])
      found |= f.get<std::string>().find(p.message) != std::string::npos;
  }
  EXPECT_TRUE(found) << "no failure mentioning '" << p.message << "' in\n" << j["cases"].dump(1);
  EXPECT_EQ(XmlProblem(JUnit()), "");
}

INSTANTIATE_TEST_SUITE_P(
    Faults, FaultTest,
    ::testing::Values(
        FaultCase{"logits_bit", "integer_exact", "K=512", "fp32 logits"},
        FaultCase{"fp32_as_bf16", "rounding_error", "K=512", "accumulation bound"},
        FaultCase{"cast_bit", "backward_contract", "cast_rne", "round-to-nearest-even"},
        FaultCase{"dx_bit", "backward_contract", "exact_grads", "dX fp32"},
        FaultCase{"dw_bit", "backward_contract", "exact_grads", "dW fp32"},
        FaultCase{"flaky_bit", "determinism", "logits_fp32_twice", "second response differs"},
        FaultCase{"nan_to_zero", "special_values", "logits_fp32", "NaN/Inf lost"},
        // A corrupted transfer is an error the client catches, never a pass.
        FaultCase{"digest", "integer_exact", "K=512", "DATA_LOSS"}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return std::string(info.param.fault); });

// No test fault reaches LogProbs' outputs (fault_backend.cc passes them
// through), so the logprobs suite has no case here; logprobs_test.cc shows
// its checks failing on doctored results instead.

// The faults on dX and dW reach the fused cross-entropy's gradients too; its
// bitwise cases must see one flipped bit, and the all-ignored case a
// gradient that should be zero.
INSTANTIATE_TEST_SUITE_P(CrossEntropyFaults, FaultTest,
                         ::testing::Values(FaultCase{"dx_bit", "cross_entropy", "exact_grads",
                                                     "dX fp32 differs from the exact"},
                                           FaultCase{"dw_bit", "cross_entropy",
                                                     "exact_grads_mean_softcap_z_loss",
                                                     "dW fp32 differs from the exact"},
                                           FaultCase{"dw_bit", "cross_entropy", "ignore_index",
                                                     "gradient elements are not zero"}),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return absl::StrCat(info.param.fault, "_", info.param.failing_case);
                         });

}  // namespace
}  // namespace logitd
