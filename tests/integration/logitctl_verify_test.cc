// `logitctl verify` against the real server (cpu backend): tensors and
// candidates as safetensors files in a temporary folder, the verdict read
// from the exit code, the summary, --json, --junit and --report.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/bf16.h"
#include "logitd/safetensors.h"
#include "tests/common/seeded_tensors.h"
#include "tests/integration/integration_util.h"
#include "tests/integration/logitctl_fixture.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class LogitctlVerifyTest : public LogitctlFixture {
 protected:
  // Writes X [m, k] and W [v, k] (seeded normal bf16) as x.safetensors and
  // w.safetensors, registers W (handle_), and writes logitd's own logits as
  // y.safetensors ("logits").
  void WriteLogitsCase(std::int64_t m, std::int64_t k, std::int64_t v) {
    x_ = NormalBf16({m, k}, 11);
    w_ = NormalBf16({v, k}, 12);
    Write("x.safetensors", {{"x", &x_}});
    Write("w.safetensors", {{"w", &w_}});
    LogitctlRun r = Run({"weights", "register", Path("w.safetensors")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    handle_ = Field(r.out, "handle");
    ASSERT_FALSE(handle_.empty()) << r.out;
    r = Run({"logits", "--x=" + Path("x.safetensors"), "--weight=" + handle_,
             "--out=" + Path("y.safetensors")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  std::string handle_;
  Tensor x_, w_;
};

TEST_F(LogitctlVerifyTest, CrossEntropyAndLogProbsOfLogitdPassAndAShiftedLossFails) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(12, 128, 80));
  Tensor targets(DType::kInt64, {12});
  for (std::int64_t i = 0; i < 12; ++i) targets.data<std::int64_t>()[i] = i == 5 ? -100 : i * 7;
  Write("t.safetensors", {{"targets", &targets}});
  const std::vector<std::string> inputs = {"--x=" + Path("x.safetensors"), "--weight=" + handle_,
                                           "--targets=" + Path("t.safetensors")};
  const auto with = [&](std::vector<std::string> words) {
    words.insert(words.end(), inputs.begin(), inputs.end());
    return Run(words);
  };
  LogitctlRun r =
      with({"cross-entropy", "--reduction=none", "--lse", "--out=" + Path("ce.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = with({"verify", "--op=cross-entropy", "--reduction=none",
            "--candidate=" + Path("ce.safetensors") + ":loss",
            "--candidate=" + Path("ce.safetensors") + ":lse", "--json=" + Path("ce.json")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("ce.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["cases"].size(), 2u);
  EXPECT_EQ(j["cases"][0]["figures"]["verdict"], "bitwise_equal_to_logitd");
  EXPECT_EQ(j["cases"][0]["figures"]["elements"], 12);

  // One token's loss half a nat off: outside its bound, exit 1.
  absl::StatusOr<Tensor> loss = ReadSafetensorsTensor(Path("ce.safetensors"), "loss");
  ASSERT_TRUE(loss.ok()) << loss.status();
  loss->data<float>()[3] += 0.5f;
  Write("bad.safetensors", {{"loss", &*loss}});
  r = with({"verify", "--op=cross-entropy", "--reduction=none",
            "--candidate=" + Path("bad.safetensors")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("outside_bounds"));

  // LogProbs at a temperature, its options given as the logprobs command's.
  r = with({"logprobs", "--temperature=0.5", "--entropy", "--out=" + Path("lp.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = with({"verify", "--op=logprobs", "--temperature=0.5",
            "--candidate=" + Path("lp.safetensors") + ":logprob",
            "--candidate=" + Path("lp.safetensors") + ":entropy"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("logprobs/entropy"));
  r = with({"verify", "--op=logprobs", "--candidate=" + Path("lp.safetensors") + ":logprob"});
  EXPECT_EQ(r.exit_code, 1) << "temperature 1 is not what the candidate was computed at\n" << r.out;
  // Its top-k (int32 ids) and ranks (int64), by their tensor names.
  r = with({"logprobs", "--top_k=3", "--rank", "--out=" + Path("topk.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = with({"verify", "--op=logprobs", "--candidate=" + Path("topk.safetensors") + ":topk_ids",
            "--candidate=" + Path("topk.safetensors") + ":topk_logprobs",
            "--candidate=" + Path("topk.safetensors") + ":rank"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("logprobs/topk_ids"));
  EXPECT_THAT(r.out, HasSubstr("logprobs/rank"));

  // Usage errors: no targets for the cross-entropy, targets for logits.
  EXPECT_EQ(Run({"verify", "--op=cross-entropy", "--x=" + Path("x.safetensors"),
                 "--weight=" + handle_, "--candidate=" + Path("bad.safetensors")})
                .exit_code,
            2);
  EXPECT_EQ(with({"verify", "--op=logits", "--candidate=" + Path("y.safetensors")}).exit_code, 2);
}

TEST_F(LogitctlVerifyTest, LogitdsOwnLogitsPassAndBf16OnesPassedOffAsFp32Fail) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(16, 1024, 96));
  LogitctlRun r = Run({"verify", "--op=logits", "--x=" + Path("x.safetensors"),
                       "--w=" + Path("w.safetensors"), "--candidate=" + Path("y.safetensors"),
                       "--json=" + Path("pass.json"), "--junit=" + Path("pass.xml")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("verify"));
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("pass.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["tool"], "logitctl verify");
  ASSERT_EQ(j["cases"].size(), 1u);
  const nlohmann::json& c = j["cases"][0];
  EXPECT_EQ(c["case"], "logits/y");
  EXPECT_EQ(c["figures"]["verdict"], "bitwise_equal_to_logitd");
  EXPECT_EQ(c["figures"]["elements"], 16 * 96);
  EXPECT_EQ(c["figures"]["bitwise_equal_fraction"], 1.0);
  EXPECT_EQ(c["figures"]["passed"], true);
  EXPECT_EQ(c["figures"]["max_ulp_exact"].get<std::int64_t>() >= 0, true);
  EXPECT_EQ(c["figures"]["precision_class"]["tested"], true);
  EXPECT_EQ(c["figures"]["precision_class"]["outside"], false);
  EXPECT_THAT(Slurp(Path("pass.xml")), HasSubstr("tests=\"1\" failures=\"0\""));
  // A pass names its effective precision and its ulps, each against what
  // it is measured from.
  EXPECT_THAT(r.out, HasSubstr("bitwise_equal_to_logitd: effective precision "));
  EXPECT_THAT(r.out, HasSubstr("ulp vs logitd's: max 0, p99 0, p50 0"));
  EXPECT_THAT(r.out, HasSubstr("ulp vs correctly rounded: max "));

  // The same logits rounded to bf16 and written back as fp32: at K=1024 a
  // good share of them lie outside the bound that fp32 logits keep.
  absl::StatusOr<Tensor> y = ReadSafetensorsTensor(Path("y.safetensors"), "logits");
  ASSERT_TRUE(y.ok()) << y.status();
  for (std::int64_t i = 0; i < y->numel(); ++i) {
    y->data<float>()[i] = RoundToBf16(y->data<float>()[i]);
  }
  Write("y_bf16.safetensors", {{"y", &*y}});
  r = Run({"verify", "--op=logits", "--x=" + Path("x.safetensors"), "--w=" + Path("w.safetensors"),
           "--candidate=y=" + Path("y_bf16.safetensors") + ":y", "--json=" + Path("fail.json"),
           "--junit=" + Path("fail.xml"), "--report=" + Path("report")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  j = nlohmann::json::parse(Slurp(Path("fail.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const nlohmann::json& f = j["cases"][0]["figures"];
  EXPECT_EQ(f["verdict"], "outside_bounds");
  EXPECT_EQ(f["passed"], false);
  EXPECT_GT(f["outside_bound"].get<std::int64_t>(), 0);
  EXPECT_GT(f["worst_bound_fraction"].get<double>(), 1.0);
  EXPECT_FALSE(f["first_outside"].empty());
  EXPECT_EQ(f["first_outside"][0]["outside_bound"], true);
  // The summary gives the proven bound's figures, which decided it.
  EXPECT_THAT(r.out, HasSubstr("elements outside the proven bound (worst "));
  const std::string junit = Slurp(Path("fail.xml"));
  EXPECT_THAT(junit, HasSubstr("failures=\"1\""));
  EXPECT_THAT(junit, HasSubstr("fp64 reference"));
  const std::string page = Slurp(Path("report/index.html"));
  EXPECT_THAT(page, HasSubstr("<title>logitctl verify: FAILED"));
  EXPECT_THAT(page, HasSubstr("elements outside (the proven bound's first"));
  EXPECT_THAT(page, HasSubstr("RMS ÷ envelope"));
  EXPECT_THAT(Slurp(Path("report/summary.md")), HasSubstr("logits/y"));
  // The page parses, its plots draw, and its verdicts are the JSON's.
  LogitctlRun check =
      RunProgram("/usr/bin/python3", {std::string(LOGITD_SOURCE_DIR) + "/scripts/check-report.py",
                                      Path("report/index.html"), Path("fail.json")});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("|error| as a fraction of its bound"));
}

TEST_F(LogitctlVerifyTest, Bf16LogitsAtK4096AreOutsideThePrecisionClass) {
  // Inside the proven bound at this K, but not fp32 accumulation: exit 1,
  // with the figures of the precision-class test that decided it.
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(4, 4096, 64));
  absl::StatusOr<Tensor> y = ReadSafetensorsTensor(Path("y.safetensors"), "logits");
  ASSERT_TRUE(y.ok()) << y.status();
  for (std::int64_t i = 0; i < y->numel(); ++i) {
    y->data<float>()[i] = RoundToBf16(y->data<float>()[i]);
  }
  Write("y_bf16.safetensors", {{"y", &*y}});
  LogitctlRun r =
      Run({"verify", "--op=logits", "--x=" + Path("x.safetensors"), "--weight=" + handle_,
           "--candidate=" + Path("y_bf16.safetensors"), "--json=" + Path("class.json"),
           "--junit=" + Path("class.xml"), "--report=" + Path("class")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("outside_precision_class: RMS error "));
  EXPECT_THAT(r.out, HasSubstr("times the conforming envelope's (threshold "));
  EXPECT_THAT(r.out, HasSubstr("effective precision "));
  EXPECT_THAT(r.out, HasSubstr("bits (the envelope's "));
  EXPECT_THAT(r.out, HasSubstr("; alpha "));
  EXPECT_THAT(r.out, HasSubstr("of 4 rows and "));
  EXPECT_THAT(r.out, HasSubstr("of 256 elements outside"));
  EXPECT_THAT(r.out, HasSubstr("FAILED"));
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("class.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["exit_code"], 1);
  const nlohmann::json& f = j["cases"][0]["figures"];
  EXPECT_EQ(f["verdict"], "outside_precision_class");
  EXPECT_EQ(f["passed"], false);
  EXPECT_EQ(f["outside_bound"], 0);
  const nlohmann::json& p = f["precision_class"];
  EXPECT_EQ(p["tested"], true);
  EXPECT_EQ(p["outside"], true);
  EXPECT_GT(p["rms_ratio"].get<double>(), p["threshold"].get<double>());
  EXPECT_LT(p["effective_bits"].get<double>(), p["class_bits"].get<double>());
  EXPECT_GT(p["alpha"].get<double>(), 0.0);
  EXPECT_EQ(p["rows"], 4);
  EXPECT_GT(p["rows_outside"].get<std::int64_t>(), 0);
  EXPECT_FALSE(p["worst_rows"].empty());
  EXPECT_FALSE(p["envelope"].get<std::string>().empty());
  EXPECT_GT(f["max_ulp_exact"].get<std::int64_t>(), 0);
  EXPECT_THAT(j["cases"][0]["failures"][0].get<std::string>(),
              HasSubstr("not those of fp32 accumulation"));
  // JUnit: a failure, its message the test's figures.
  const std::string junit = Slurp(Path("class.xml"));
  EXPECT_THAT(junit, HasSubstr("failures=\"1\""));
  EXPECT_THAT(junit, HasSubstr("<failure message=\"y: outside_precision_class: "));
  EXPECT_THAT(junit, HasSubstr("RMS error "));
  EXPECT_THAT(Slurp(Path("class/index.html")), HasSubstr("outside_precision_class"));

  // A failing candidate of this kind is not recorded as a baseline.
  r = Run({"verify", "--op=logits", "--x=" + Path("x.safetensors"), "--weight=" + handle_,
           "--candidate=" + Path("y_bf16.safetensors"), "--record=" + Path("class_gold.json")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_FALSE(std::filesystem::exists(Path("class_gold.json")));
}

TEST_F(LogitctlVerifyTest, SampledRowsEvenlySpacedOrDrawnByASeed) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(30, 128, 16));
  const std::vector<std::string> call = {"verify", "--op=logits", "--x=" + Path("x.safetensors"),
                                         "--weight=" + handle_,
                                         "--candidate=" + Path("y.safetensors")};
  const auto with = [&](std::vector<std::string> words) {
    words.insert(words.begin(), call.begin(), call.end());
    return Run(words);
  };
  LogitctlRun r = with({"--sample_rows=1", "--json=" + Path("even.json")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("bitwise_equal_to_logitd_sampled"));
  EXPECT_THAT(r.out, HasSubstr("rows 2 of 30, evenly spaced"));
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("even.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["cases"][0]["figures"]["rows_checked"], nlohmann::json::array({0, 29}));
  EXPECT_EQ(j["cases"][0]["figures"]["sample_seed"], 0);

  r = with({"--sample_rows=4", "--sample_seed=77", "--json=" + Path("seeded.json")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("bitwise_equal_to_logitd_sampled"));
  EXPECT_THAT(r.out, HasSubstr("rows 4 of 30, drawn by seed 77"));
  j = nlohmann::json::parse(Slurp(Path("seeded.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const nlohmann::json f = j["cases"][0]["figures"];
  EXPECT_EQ(f["verdict"], "bitwise_equal_to_logitd_sampled");
  EXPECT_EQ(f["passed"], true);
  EXPECT_EQ(f["sample_seed"], 77);
  EXPECT_EQ(f["rows_total"], 30);
  EXPECT_EQ(f["rows_checked"].size(), 4u);
  // The same seed, the same rows.
  r = with({"--sample_rows=4", "--sample_seed=77", "--json=" + Path("again.json")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  j = nlohmann::json::parse(Slurp(Path("again.json")), nullptr, false);
  EXPECT_EQ(j["cases"][0]["figures"]["rows_checked"], f["rows_checked"]);

  r = with({"--sample_seed=77"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--sample_seed: given without --sample_rows"));
  r = with({"--sample_rows=4", "--sample_seed=-1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--sample_seed: expected"));
  r = RunLogitctl({"verify", "--help"});
  EXPECT_THAT(r.out, HasSubstr("--sample_seed=0"));
  EXPECT_THAT(r.out, HasSubstr("outside_precision_class"));
  r = RunLogitctl({"help"});
  EXPECT_THAT(r.out, HasSubstr("--sample_seed"));
}

TEST_F(LogitctlVerifyTest, ARegisteredWeightAndABf16Candidate) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(5, 256, 40));
  const std::string handle = handle_;
  LogitctlRun r = Run({"logits", "--x=" + Path("x.safetensors"), "--weight=" + handle,
                       "--out=" + Path("y16.safetensors"), "--out_dtype=bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run({"verify", "--op=logits", "--x=" + Path("x.safetensors"), "--weight=" + handle,
           "--candidate=" + Path("y16.safetensors"), "--json=" + Path("r.json")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("r.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["cases"][0]["figures"]["dtype"], "bf16");
  EXPECT_TRUE(j["cases"][0]["verdict"] == "passed") << j["cases"][0];
}

TEST_F(LogitctlVerifyTest, UsageAndInputErrorsExitTwo) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(4, 64, 8));
  const std::string x = "--x=" + Path("x.safetensors");
  const std::string w = "--w=" + Path("w.safetensors");
  const std::string y = "--candidate=" + Path("y.safetensors");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"verify", "--op=softmax", x, w, y},
       "--op: expected logits, backward, cross-entropy or logprobs"},
      {{"verify", "--op=logits", x, y}, "expected one of --weight=HANDLE and --w="},
      {{"verify", "--op=logits", x, w}, "--candidate=[NAME=]FILE[:TENSOR] is required"},
      {{"verify", "--op=backward", x, w, y}, "--op=backward needs --dy"},
      {{"verify", "--op=logits", x, w, y, "--alpha=0"}, "--alpha: expected a finite non-zero"},
      {{"verify", "--op=logits", x, w, y, "--bogus=1"}, "unknown option --bogus"},
      {{"verify", "--op=logits", "--x=" + Path("missing.safetensors"), w, y},
       "missing.safetensors"},
      {{"verify", "--op=logits", "--x=" + Path("y.safetensors"), w, y}, "expected bf16"},
  };
  for (const Case& c : cases) {
    LogitctlRun r = Run(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.message << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
  // A candidate of the wrong shape is the server's INVALID_ARGUMENT, an
  // input error: exit 2, the error printed once and no empty table.
  Tensor wrong = NormalBf16({4, 9}, 3);
  Write("wrong.safetensors", {{"y", &wrong}});
  LogitctlRun r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("wrong.safetensors")});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_EQ(r.out.find("INVALID_ARGUMENT"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0 cases"), std::string::npos) << r.out;
  // No server: exit 2.
  r = RunLogitctl({"--server=127.0.0.1:1", "verify", "--op=logits", x, w, y});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  r = RunLogitctl({"verify", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--candidate=[NAME=]FILE[:TENSOR]"));
}

TEST_F(LogitctlVerifyTest, RecordAndBaselineKeepACandidatesBits) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(6, 512, 48));
  const std::string x = "--x=" + Path("x.safetensors");
  const std::string w = "--w=" + Path("w.safetensors");
  const std::string gold = Path("gold.json");
  LogitctlRun r = Run(
      {"verify", "--op=logits", x, w, "--candidate=" + Path("y.safetensors"), "--record=" + gold});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("recorded to " + gold));
  // A second call adds its case under another name and keeps the first.
  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("y.safetensors"),
           "--record=" + gold, "--case=second"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json g = nlohmann::json::parse(Slurp(gold), nullptr, false);
  ASSERT_FALSE(g.is_discarded());
  std::vector<std::string> names;
  for (const auto& c : g["cases"]) names.push_back(c["name"]);
  EXPECT_THAT(names, ::testing::ElementsAre("logits/y", "second/y"));

  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("y.safetensors"),
           "--baseline=" + gold, "--json=" + Path("same.json")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("same.json")), nullptr, false);
  EXPECT_EQ(j["cases"][0]["figures"]["baseline"]["verdict"], "identical");

  // One ulp moved: still within bounds, but not the recorded bits.
  absl::StatusOr<Tensor> y = ReadSafetensorsTensor(Path("y.safetensors"), "logits");
  ASSERT_TRUE(y.ok()) << y.status();
  y->data<float>()[7] = std::nextafter(y->data<float>()[7], INFINITY);
  Write("y2.safetensors", {{"y", &*y}});
  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("y2.safetensors"),
           "--baseline=" + gold, "--json=" + Path("moved.json")});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  j = nlohmann::json::parse(Slurp(Path("moved.json")), nullptr, false);
  const nlohmann::json& c = j["cases"][0];
  EXPECT_EQ(c["figures"]["verdict"], "within_bounds");
  EXPECT_EQ(c["figures"]["baseline"]["verdict"], "different, both within bounds");
  EXPECT_EQ(c["figures"]["baseline"]["differing_elements"], 1);
  EXPECT_THAT(c["failures"][0].get<std::string>(), HasSubstr("both within bounds"));

  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("y.safetensors"),
           "--baseline=" + gold, "--case=third"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("'third/y' is not in baseline"));

  // A failing candidate is not recorded.
  for (std::int64_t i = 0; i < y->numel(); ++i) y->data<float>()[i] = -y->data<float>()[i] + 1;
  Write("bad.safetensors", {{"y", &*y}});
  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("bad.safetensors"),
           "--record=" + Path("bad.json")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(Path("bad.json")));
  EXPECT_THAT(r.out, HasSubstr("not written"));

  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("y.safetensors"),
           "--baseline=" + gold, "--record=" + gold});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("exclude each other"));
  r = Run({"verify", "--op=logits", x, w, "--candidate=" + Path("y.safetensors"),
           "--baseline=" + Path("missing.json")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing.json"));
}

TEST_F(LogitctlVerifyTest, BackwardCandidatesByTensorName) {
  ASSERT_NO_FATAL_FAILURE(WriteLogitsCase(6, 96, 40));
  const Tensor dy = NormalFp32({6, 40}, 13);
  Write("dy.safetensors", {{"dy", &dy}});
  const std::string x = "--x=" + Path("x.safetensors");
  const std::string dys = "--dy=" + Path("dy.safetensors");
  LogitctlRun r = Run({"backward", dys, x, "--weight=" + handle_, "--out=" + Path("g.safetensors"),
                       "--dx_dtype=fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The tensors' own names (dx, dw) say which output each is.
  r = Run({"verify", "--op=backward", dys, x, "--weight=" + handle_,
           "--candidate=" + Path("g.safetensors") + ":dx",
           "--candidate=" + Path("g.safetensors") + ":dw", "--json=" + Path("b.json")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(Slurp(Path("b.json")), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["cases"].size(), 2u);
  std::vector<std::string> names;
  for (const auto& c : j["cases"]) {
    names.push_back(c["case"]);
    EXPECT_EQ(c["figures"]["verdict"], "bitwise_equal_to_logitd") << c["case"];
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("backward/dx", "backward/dw"));

  // A tensor of another name needs NAME=.
  Tensor other = NormalFp32({6, 96}, 14);
  Write("o.safetensors", {{"grad", &other}});
  r = Run({"verify", "--op=backward", dys, x, "--weight=" + handle_,
           "--candidate=" + Path("o.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("name the output it is (dx or dw)"));
  // Named, it is judged: random values are no gradient.
  r = Run({"verify", "--op=backward", dys, x, "--weight=" + handle_,
           "--candidate=dx=" + Path("o.safetensors")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("outside_bounds"));
}

}  // namespace
}  // namespace logitd::testing
