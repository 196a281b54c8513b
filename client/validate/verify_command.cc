// `logitctl verify`: another implementation's outputs, read from safetensors
// files with the inputs they were computed from, judged by the server's
// Verify; reported as validate reports (summary, --json, --junit,
// --report), one case per candidate, and the same exit codes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/common/argv.h"
#include "client/common/exit_codes.h"
#include "client/common/tensor_files.h"
#include "client/validate/cli.h"
#include "client/validate/harness.h"
#include "client/validate/report.h"
#include "client/validate/report_html.h"
#include "client/validate/verify_golden.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/status_macros.h"

// Defined by logitctl, which applies it before dispatching here.
ABSL_DECLARE_FLAG(std::string, server);

namespace logitd::validate {
namespace {

constexpr int kExitUsage = 2;
constexpr char kProgram[] = "logitctl verify";

struct VerifyCommandArgs {
  std::string op;
  std::string x;
  std::string weight;
  std::string w;
  std::string dy;
  std::string targets;
  std::vector<std::string> candidates;
  float alpha = 1.0f;
  // The cross-entropy's and LogProbs' options (their RPCs' defaults).
  client::CrossEntropyOptions cross_entropy;
  client::LogProbsOptions logprobs;
  std::int64_t sample_rows = 0;
  std::uint64_t sample_seed = 0;
  std::string json_path;
  std::string junit_path;
  std::string report_dir;
  std::string record_path;
  std::string baseline_path;
  std::string case_name;
  bool help = false;
};

constexpr const char* kValueFlags[] = {
    "op",         "x",           "weight",       "w",           "dy",
    "targets",    "candidate",   "alpha",        "sample_rows", "sample_seed",
    "json",       "junit",       "report",       "record",      "baseline",
    "case",       "reduction",   "ignore_index", "z_loss",      "logit_softcap",
    "grad_scale", "temperature", "vocab_size"};

// A finite float option.
absl::StatusOr<float> FloatOption(const std::string& name, const std::string& value) {
  double d = 0;
  if (!absl::SimpleAtod(value, &d) || !std::isfinite(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": expected a finite number, got '", value, "'"));
  }
  return static_cast<float>(d);
}

// The cross-entropy's and LogProbs' options; false when `name` is none of
// them.
absl::StatusOr<bool> ApplyOperationOption(const std::string& name, const std::string& value,
                                          VerifyCommandArgs* a) {
  if (name == "reduction") {
    if (value == "none") {
      a->cross_entropy.reduction = client::Reduction::kNone;
    } else if (value == "sum") {
      a->cross_entropy.reduction = client::Reduction::kSum;
    } else if (value == "mean") {
      a->cross_entropy.reduction = client::Reduction::kMean;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--reduction: expected none, sum or mean, got '", value, "'"));
    }
  } else if (name == "ignore_index" || name == "vocab_size") {
    std::int64_t n = 0;
    if (!absl::SimpleAtoi(value, &n) || (name == "vocab_size" && n < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected an integer, got '", value, "'"));
    }
    if (name == "vocab_size") {
      a->logprobs.vocab_size = n;
    } else {
      a->cross_entropy.ignore_index = n;
      a->logprobs.ignore_index = n;
    }
  } else if (name == "z_loss" || name == "logit_softcap" || name == "grad_scale" ||
             name == "temperature") {
    LOGITD_ASSIGN_OR_RETURN(const float f, FloatOption(name, value));
    if (name == "z_loss") a->cross_entropy.z_loss = f;
    if (name == "grad_scale") a->cross_entropy.grad_scale = f;
    if (name == "temperature") a->logprobs.temperature = f;
    if (name == "logit_softcap") {
      a->cross_entropy.logit_softcap = f;
      a->logprobs.logit_softcap = f;
    }
  } else {
    return false;
  }
  return true;
}

std::optional<argv::FlagType> OwnFlag(absl::string_view name) {
  for (const char* f : kValueFlags) {
    if (name == f) return argv::FlagType::kValue;
  }
  return std::nullopt;
}

absl::Status Apply(const std::string& name, const std::string& value, VerifyCommandArgs* a) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
  LOGITD_ASSIGN_OR_RETURN(const bool option, ApplyOperationOption(name, value, a));
  if (option) return absl::OkStatus();
  if (name == "alpha") {
    double alpha = 0;
    if (!absl::SimpleAtod(value, &alpha) || alpha == 0 || !std::isfinite(alpha)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--alpha: expected a finite non-zero scale, got '", value, "'"));
    }
    a->alpha = static_cast<float>(alpha);
  } else if (name == "sample_rows") {
    if (!absl::SimpleAtoi(value, &a->sample_rows) || a->sample_rows < 0 ||
        a->sample_rows > 0xffffffffll) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sample_rows: expected 0 (every row) or a number of rows, got '", value, "'"));
    }
  } else if (name == "sample_seed") {
    if (!absl::SimpleAtoi(value, &a->sample_seed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sample_seed: expected 0 (evenly spaced rows) or a seed below 2^64, got '",
                       value, "'"));
    }
  } else if (name == "candidate") {
    a->candidates.push_back(value);
  } else {
    std::string* field = name == "op"         ? &a->op
                         : name == "x"        ? &a->x
                         : name == "weight"   ? &a->weight
                         : name == "w"        ? &a->w
                         : name == "dy"       ? &a->dy
                         : name == "targets"  ? &a->targets
                         : name == "json"     ? &a->json_path
                         : name == "junit"    ? &a->junit_path
                         : name == "record"   ? &a->record_path
                         : name == "baseline" ? &a->baseline_path
                         : name == "case"     ? &a->case_name
                                              : &a->report_dir;
    *field = value;
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifyCommandArgs> ParseArgs(const std::vector<std::string>& args) {
  const argv::FlagLookup host = [](absl::string_view name) -> std::optional<argv::FlagType> {
    const std::optional<bool> is_bool = HostConnectionFlag(name);
    if (!is_bool.has_value()) return std::nullopt;
    return *is_bool ? argv::FlagType::kBool : argv::FlagType::kValue;
  };
  VerifyCommandArgs a;
  argv::Reader reader(args);
  while (std::optional<argv::Word> word = reader.Next()) {
    if (!word->is_flag) {
      if (word->text == "help") {
        a.help = true;
        continue;
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected word '", word->text, "' (verify takes options only)"));
    }
    if (word->name == "help" || word->name == "h") {
      a.help = true;
      continue;
    }
    if (std::optional<argv::Flag> flag = argv::Resolve(*word, OwnFlag); flag.has_value()) {
      absl::StatusOr<std::string> value = reader.Value(*flag);
      if (!value.ok()) return value.status();
      if (absl::Status s = Apply(flag->name, *value, &a); !s.ok()) return s;
      continue;
    }
    if (std::optional<argv::Flag> flag = argv::Resolve(*word, host); flag.has_value()) {
      reader.SkipValue(*flag);
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option --", word->name, " (see logitctl verify --help)"));
  }
  return a;
}

std::string VerifyUsage() {
  return R"(usage: logitctl verify --op=logits|backward|cross-entropy|logprobs
                       --x=FILE[:TENSOR] (--weight=HANDLE | --w=FILE[:TENSOR])
                       [--dy=FILE[:TENSOR]] [--targets=FILE[:TENSOR]]
                       --candidate=[NAME=]FILE[:TENSOR] [--candidate=...] [options]

Sends another implementation's outputs (the candidates) with the inputs they
were computed from to the server's Verify, which holds every element against
the fp64 reference of the exact products of the bf16 inputs and its proven
bound, tests whether the errors are those of fp32 accumulation (the precision
class), and compares with logitd's own output of the same inputs
(docs/PROTOCOL.md, "Verify"). Verdicts, worst first: outside_bounds (wrong for
certain), outside_precision_class (inside the proven bound, but coarser than
fp32 accumulation: bf16 rounding passed off as fp32, say), within_bounds,
bitwise_equal_to_logitd; the last two pass, and end in _sampled when rows were
sampled.

  --op=logits         candidate y [M, V] = alpha . X . W^T (fp32, or bf16)
  --op=backward       candidates dx [M, K] and/or dw [V, K] (fp32 or bf16) from
                      dY under the gradient-cast contract: G = bf16(dY) once
  --x=FILE[:TENSOR]   X bf16 [M, K] (an fp32 tensor whose values are all bf16
                      values is taken exactly; any other is refused)
  --weight=HANDLE     a registered weight, or
  --w=FILE[:TENSOR]   W bf16 [V, K] streamed for this call only
  --op=cross-entropy  candidates loss (fp32, [M] with --reduction=none, else
                      [1]), lse [M], dx [M, K] (fp32 or bf16) and/or dw
                      [V, K] (fp32) of the fused cross-entropy; the gradients
                      under the contract G = bf16(dL/dlogits) once
  --op=logprobs       candidates logprob (needs --targets), lse, entropy
                      (fp32 [M]), topk_ids (int32 or int64 [M, k]),
                      topk_logprobs (fp32 [M, k]) and rank (int32 or int64
                      [M], needs --targets)
  --dy=FILE[:TENSOR]  backward: dY fp32 or bf16 [M, V]
  --targets=FILE[:TENSOR]
                      cross-entropy, logprobs: target ids, int32 or int64 [M]
  --candidate=[NAME=]FILE[:TENSOR]
                      a candidate, named as the operation names its output
                      (y; dx, dw; loss, lse, dx, dw; logprob, lse,
                      entropy, topk_ids, topk_logprobs, rank); NAME
                      may be left out for logits, and for a tensor itself
                      named as an output; repeat for several
  --reduction=mean    cross-entropy: none, sum or mean
  --ignore_index=-100 cross-entropy, logprobs: the target that counts nothing
  --z_loss=0 --logit_softcap=0 --grad_scale=1
                      cross-entropy (logit_softcap: logprobs too)
  --temperature=1 --vocab_size=0
                      logprobs (vocab_size 0: every row of W)
  --alpha=1           logits: the scale the candidate was computed with
  --sample_rows=0     check this many rows of M, evenly spaced with the first
                      and the last (dW is always checked whole; a reduced
                      loss and LogProbs' top-k and ranks need 0); 0 checks
                      every row
  --sample_seed=0     with --sample_rows: draw the rows uniformly by this
                      seed instead (the server reports them); 0 keeps them
                      evenly spaced
  --json=FILE         write the report as JSON
  --junit=FILE        write the report as JUnit XML, a test case a candidate
  --report=DIR        write DIR/index.html and DIR/summary.md
  --record=FILE       keep each candidate's bits and verdict figures in FILE
                      (validate's golden baseline format), as case
                      CASE/NAME; other cases already in FILE are kept
  --baseline=FILE     compare each candidate's bits with its case in FILE:
                      identical, different (both within bounds), or
                      different (outside bounds); any difference fails
  --case=CASE         the case name under --record/--baseline (default: the
                      operation), to keep several calls in one file

exit codes: 0 every candidate passed (within_bounds or bitwise_equal_to_logitd,
              sampled or not),
            1 one failed (outside_bounds or outside_precision_class), or the
              server failed the call (INTERNAL, a deadline),
            2 usage or input error (the server's INVALID_ARGUMENT, NOT_FOUND,
              OUT_OF_RANGE, FAILED_PRECONDITION, RESOURCE_EXHAUSTED among
              them), or the server could not be reached or refused the
              credentials (the rule of every logitctl command)
)";
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kProgram, message.c_str());
  return kExitUsage;
}

// X and W go to the server as bf16: an fp32 tensor is taken only when each
// of its values is a bf16 value, since the candidate was computed from bits
// this command must not change.
absl::StatusOr<Tensor> ExactBf16(tensor_files::NamedTensor t, const std::string& what) {
  if (t.tensor.dtype() == DType::kBf16) return std::move(t.tensor);
  if (t.tensor.dtype() == DType::kFp32) {
    Tensor out(DType::kBf16, t.tensor.shape());
    const float* src = t.tensor.data<float>();
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const Bf16Bits b = FloatToBf16(src[i]);
      if (Bf16ToFloat(b) != src[i] && !(std::isnan(src[i]))) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " '", t.name, "': expected bf16, got fp32 with values that are not bf16 (",
            src[i], " at element ", i, "); pass the bf16 tensor the candidate was computed from"));
      }
      out.data<Bf16Bits>()[i] = b;
    }
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", t.name, "': expected bf16, got ", DTypeName(t.tensor.dtype())));
}

// "[NAME=]FILE[:TENSOR]": the name, when the text starts with one of the
// operation's output names and '='.
struct CandidateRef {
  std::string name;
  std::string ref;
};
CandidateRef SplitCandidate(const std::string& text, const std::vector<std::string>& outputs) {
  const std::size_t eq = text.find('=');
  if (eq != std::string::npos) {
    const std::string name = text.substr(0, eq);
    for (const std::string& o : outputs) {
      if (name == o) return {name, text.substr(eq + 1)};
    }
  }
  return {"", text};
}

// A fraction as a percentage with the digits it needs: "0.003%" rather than
// "0.00%" for a few elements of many, "100%" only when it is all of them.
std::string Percent(double fraction) {
  const double p = 100.0 * fraction;
  if (p == 0 || p == 100) return absl::StrFormat("%.0f%%", p);
  if (p > 99.99) return absl::StrFormat("%.6g%%", p);
  return p < 0.01 ? absl::StrFormat("%.2g%%", p) : absl::StrFormat("%.2f%%", p);
}

// "[3, 41]": an element's index.
std::string IndexText(const client::VerifyElement& e) {
  return absl::StrCat("[", absl::StrJoin(e.index, ", "), "]");
}

// An element as the failures list it: its values, what it was held to, and
// logitd's own value there.
std::string ElementText(const client::VerifyElement& e) {
  std::string text =
      absl::StrFormat("%s: candidate %.9g, fp64 reference %.17g, |error| %.3e", IndexText(e),
                      e.candidate, e.reference, std::fabs(e.candidate - e.reference));
  if (e.outside_bound) {
    absl::StrAppendFormat(&text, ", outside its proven bound %.3e", e.bound);
  } else if (e.class_threshold > 0) {
    absl::StrAppendFormat(&text, ", over its class threshold %.3e", e.class_threshold);
    // The precision-class test's elements may come without their bound and
    // logitd's value (0 then).
    if (e.bound == 0) return text;
    absl::StrAppendFormat(&text, " (proven bound %.3e)", e.bound);
  } else {
    // Listed for the probabilistic figure, which decides nothing now.
    absl::StrAppendFormat(&text, ", outside the probabilistic figure %.3e (proven bound %.3e)",
                          e.probabilistic_bound, e.bound);
  }
  absl::StrAppendFormat(&text, ", logitd %.9g", e.logitd);
  return text;
}

// The first element the server listed as outside the proven bound, or found
// by the precision-class test (it lists those first, in that order).
const client::VerifyElement* FirstListed(const client::CandidateVerdict& c, bool proven) {
  for (const client::VerifyElement& e : c.first_outside) {
    if (proven ? e.outside_bound : (!e.outside_bound && e.class_threshold > 0)) return &e;
  }
  return nullptr;
}

// "effective precision 11.2 bits (the envelope's 18.5)": the least the
// conforming implementations reach on these inputs.
std::string PrecisionText(const client::PrecisionClass& p) {
  if (!p.tested) {
    return p.reason.empty() ? "precision class not tested"
                            : absl::StrCat("precision class not tested (", p.reason, ")");
  }
  return absl::StrFormat("effective precision %.1f bits (the envelope's %.1f)", p.effective_bits,
                         p.class_bits);
}

// "ulp vs logitd's: max 3, p99 1, p50 0; ulp vs correctly rounded: ...";
// the second only where the server has the exact value (not for integer
// outputs, nor from servers before it).
std::string UlpText(const client::CandidateVerdict& c) {
  std::string text =
      absl::StrFormat("ulp vs logitd's: max %d, p99 %d, p50 %d", c.max_ulp, c.p99_ulp, c.p50_ulp);
  if (c.max_ulp_exact >= 0) {
    absl::StrAppendFormat(&text, "; ulp vs correctly rounded: max %d, p99 %d, p50 %d",
                          c.max_ulp_exact, c.p99_ulp_exact, c.p50_ulp_exact);
  }
  return text;
}

// "RMS error 5.31 times the conforming envelope's (threshold 2.05)".
std::string RmsText(const client::PrecisionClass& p) {
  return absl::StrFormat("RMS error %.3g times the conforming envelope's (threshold %.3g)",
                         p.rms_ratio, p.threshold);
}

// The summary line: the verdict and what decided it.
std::string SummaryOf(const client::CandidateVerdict& c, const client::VerifyResult& result) {
  const client::PrecisionClass& p = c.precision_class;
  std::string text;
  if (c.verdict == "outside_bounds") {
    text = absl::StrFormat(
        "outside_bounds: %d of %d elements outside the proven bound (worst %.3g "
        "times it)",
        c.outside_bound, c.elements, c.worst_bound_fraction);
    if (c.nan_inf_mismatches > 0) {
      absl::StrAppendFormat(&text, ", %d NaN/Inf mismatches", c.nan_inf_mismatches);
    }
    if (const client::VerifyElement* e = FirstListed(c, /*proven=*/true); e != nullptr) {
      absl::StrAppendFormat(&text, "; first %s: candidate %.9g, fp64 reference %.9g, bound %.3e",
                            IndexText(*e), e->candidate, e->reference, e->bound);
    }
  } else if (c.verdict == "outside_precision_class") {
    text = absl::StrFormat(
        "outside_precision_class: %s; %s; alpha %.3g; %d of %d rows and %d of %d elements outside",
        RmsText(p), PrecisionText(p), p.alpha, p.rows_outside, p.rows, p.elements_outside,
        p.elements);
    if (const client::VerifyElement* e = FirstListed(c, /*proven=*/false); e != nullptr) {
      absl::StrAppendFormat(&text, "; worst %s: |error| %.3e against its class threshold %.3e",
                            IndexText(*e), std::fabs(e->candidate - e->reference),
                            e->class_threshold);
    }
  } else if (c.passed()) {
    text = absl::StrFormat("%s: %s; %s; worst %.3g of its bound; %s bitwise logitd's", c.verdict,
                           PrecisionText(p), UlpText(c), c.worst_bound_fraction,
                           Percent(c.bitwise_equal_fraction));
  } else {
    // A verdict this build does not know (a newer server's): its bound
    // figures, which every server gives.
    text =
        absl::StrFormat("%s; worst %.3g of its bound; %s bitwise logitd's; max %d ulp", c.verdict,
                        c.worst_bound_fraction, Percent(c.bitwise_equal_fraction), c.max_ulp);
  }
  if (!result.rows_checked.empty()) {
    absl::StrAppendFormat(
        &text, "; rows %d of %d, %s", result.rows_checked.size(), result.rows_total,
        result.sample_seed == 0 ? std::string("evenly spaced")
                                : absl::StrCat("drawn by seed ", result.sample_seed));
  }
  return text;
}

// Why a candidate failed, in full: the figures that decided it and the
// first elements the server listed.
std::string FailureOf(const client::CandidateVerdict& c) {
  const client::PrecisionClass& p = c.precision_class;
  std::string why;
  if (c.verdict == "outside_precision_class") {
    why = absl::StrFormat(
        "%s: outside_precision_class: inside the proven bound, but the errors are not those of "
        "fp32 accumulation: %s, %s (a conforming implementation is found outside with probability "
        "at most %.3g); %d of %d rows and %d of %d elements outside",
        c.name, RmsText(p), PrecisionText(p), p.alpha, p.rows_outside, p.rows, p.elements_outside,
        p.elements);
    for (std::size_t i = 0; i < p.worst_rows.size() && i < 3; ++i) {
      const client::RowPrecision& row = p.worst_rows[i];
      absl::StrAppendFormat(&why, "; row %d: RMS %.3g times (threshold %.3g), %.1f bits%s", row.row,
                            row.rms_ratio, row.threshold, row.effective_bits,
                            row.outside ? " (outside)" : "");
    }
    if (!p.envelope.empty()) absl::StrAppend(&why, "; envelope: ", p.envelope);
  } else {
    why = absl::StrFormat(
        "%s: %s: %d of %d elements outside the proven bound (worst %.3g times it), %d NaN/Inf "
        "mismatches",
        c.name, c.verdict, c.outside_bound, c.elements, c.worst_bound_fraction,
        c.nan_inf_mismatches);
    if (p.tested && p.outside) {
      absl::StrAppend(&why, "; outside the precision class too: ", RmsText(p));
    }
  }
  for (std::size_t i = 0; i < c.first_outside.size() && i < 5; ++i) {
    absl::StrAppend(&why, "; ", ElementText(c.first_outside[i]));
  }
  return why;
}

nlohmann::ordered_json PrecisionClassJson(const client::PrecisionClass& p) {
  nlohmann::ordered_json j;
  j["tested"] = p.tested;
  if (!p.reason.empty()) j["reason"] = p.reason;
  j["outside"] = p.outside;
  j["alpha"] = JsonNumber(p.alpha);
  j["effective_bits"] = JsonNumber(p.effective_bits);
  j["class_bits"] = JsonNumber(p.class_bits);
  j["rms_ratio"] = JsonNumber(p.rms_ratio);
  j["threshold"] = JsonNumber(p.threshold);
  j["elements"] = p.elements;
  j["rows"] = p.rows;
  j["rows_outside"] = p.rows_outside;
  j["elements_outside"] = p.elements_outside;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const client::RowPrecision& r : p.worst_rows) {
    rows.push_back({{"row", r.row},
                    {"elements", r.elements},
                    {"effective_bits", JsonNumber(r.effective_bits)},
                    {"class_bits", JsonNumber(r.class_bits)},
                    {"rms_ratio", JsonNumber(r.rms_ratio)},
                    {"threshold", JsonNumber(r.threshold)},
                    {"outside", r.outside}});
  }
  j["worst_rows"] = std::move(rows);
  j["envelope"] = p.envelope;
  return j;
}

// One candidate's verdict as a case of the report.
CaseResult CaseOf(const std::string& case_prefix, const client::CandidateVerdict& c,
                  const client::VerifyResult& result, double seconds) {
  CaseResult r;
  r.suite = "verify";
  r.name = absl::StrCat(case_prefix, "/", c.name);
  r.seconds = seconds;
  r.verdict = c.passed() ? Verdict::kPassed : Verdict::kFailed;
  r.summary = SummaryOf(c, result);
  nlohmann::ordered_json& f = r.figures;
  f["candidate"] = c.name;
  f["dtype"] = std::string(DTypeName(c.dtype));
  f["shape"] = c.shape;
  f["xxh3"] = absl::StrFormat("%016x", c.xxh3);
  f["verdict"] = c.verdict;
  f["passed"] = c.passed();
  f["elements"] = c.elements;
  f["outside_bound"] = c.outside_bound;
  f["worst_bound_fraction"] = JsonNumber(c.worst_bound_fraction);
  f["precision_class"] = PrecisionClassJson(c.precision_class);
  f["outside_probabilistic_bound"] = c.outside_probabilistic_bound;
  f["worst_probabilistic_fraction"] = JsonNumber(c.worst_probabilistic_fraction);
  f["logitd_outside_probabilistic_bound"] = c.logitd_outside_probabilistic_bound;
  f["nan_inf_mismatches"] = c.nan_inf_mismatches;
  f["bitwise_equal_fraction"] = c.bitwise_equal_fraction;
  f["max_ulp"] = c.max_ulp;
  f["p99_ulp"] = c.p99_ulp;
  f["p50_ulp"] = c.p50_ulp;
  f["max_ulp_exact"] = c.max_ulp_exact;
  f["p99_ulp_exact"] = c.p99_ulp_exact;
  f["p50_ulp_exact"] = c.p50_ulp_exact;
  f["error_histogram"] = c.error_histogram;
  nlohmann::ordered_json worst = nlohmann::ordered_json::array();
  for (const client::VerifyElement& e : c.first_outside) {
    worst.push_back({{"index", e.index},
                     {"candidate", JsonNumber(e.candidate)},
                     {"reference", JsonNumber(e.reference)},
                     {"bound", JsonNumber(e.bound)},
                     {"outside_bound", e.outside_bound},
                     {"class_threshold", JsonNumber(e.class_threshold)},
                     {"probabilistic_bound", JsonNumber(e.probabilistic_bound)},
                     {"logitd", JsonNumber(e.logitd)}});
  }
  f["first_outside"] = std::move(worst);
  f["inputs_xxh3"] = absl::StrFormat("%016x", result.inputs_xxh3);
  f["rows_checked"] = result.rows_checked;
  f["rows_total"] = result.rows_total;
  f["sample_seed"] = result.sample_seed;
  f["reference_us"] = result.reference_us;
  f["reference_engine"] = result.reference_engine;
  if (!c.passed()) r.failures.push_back(FailureOf(c));
  return r;
}

// One case per candidate, compared with its baseline case or recorded.
void JudgeCandidates(const VerifyCommandArgs& a, const client::VerifyResult& result, double seconds,
                     const std::vector<tensor_files::NamedTensor>& candidates,
                     const std::optional<Baseline>& baseline, Report* report) {
  const std::string prefix = a.case_name.empty() ? a.op : a.case_name;
  std::vector<CaseRecord> records;
  bool all_passed = true;
  for (const client::CandidateVerdict& c : result.candidates) {
    CaseResult r = CaseOf(prefix, c, result, seconds);
    const Tensor* tensor = nullptr;
    for (const tensor_files::NamedTensor& t : candidates) {
      if (t.name == c.name) tensor = &t.tensor;
    }
    if (tensor != nullptr && baseline.has_value()) {
      CompareVerifiedCandidate(*baseline, a.baseline_path, r.name, *tensor, result.inputs_xxh3, c,
                               &r);
      if (!r.failures.empty()) r.verdict = Verdict::kFailed;
    }
    if (tensor != nullptr && !a.record_path.empty()) {
      records.push_back(RecordVerifiedCandidate(r.name, *tensor, result.inputs_xxh3, c));
    }
    all_passed = all_passed && r.verdict == Verdict::kPassed;
    report->results.push_back(std::move(r));
  }
  if (a.record_path.empty()) return;
  absl::Status written =
      all_passed ? RecordVerifyCases(a.record_path, report->info, std::move(records))
                 : absl::FailedPreconditionError(absl::StrCat(
                       "baseline '", a.record_path,
                       "' not written: a candidate failed (a baseline keeps passing bits)"));
  for (CaseResult& r : report->results) {
    if (written.ok()) {
      absl::StrAppend(&r.summary, "; recorded to ", a.record_path);
    } else {
      r.failures.push_back(std::string(written.message()));
      r.verdict = Verdict::kFailed;
    }
  }
}

// The operation and the combination of flags it needs; the outputs it
// gives, by name.
absl::Status CheckCombination(const VerifyCommandArgs& a, client::VerifyArgs* call,
                              std::vector<std::string>* outputs) {
  if (a.op == "logits") {
    call->operation = client::VerifyOperation::kLogits;
    *outputs = {"y"};
  } else if (a.op == "backward") {
    call->operation = client::VerifyOperation::kBackward;
    *outputs = {"dx", "dw"};
  } else if (a.op == "cross-entropy" || a.op == "cross_entropy") {
    call->operation = client::VerifyOperation::kCrossEntropy;
    *outputs = {"loss", "lse"};
  } else if (a.op == "logprobs") {
    call->operation = client::VerifyOperation::kLogProbs;
    *outputs = {"logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank"};
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--op: expected logits, backward, cross-entropy or logprobs, got '", a.op, "'"));
  }
  const bool per_token = call->operation == client::VerifyOperation::kCrossEntropy ||
                         call->operation == client::VerifyOperation::kLogProbs;
  if (!per_token && !a.targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--targets: given, but --op=", a.op, " takes none"));
  }
  if (call->operation == client::VerifyOperation::kCrossEntropy && a.targets.empty()) {
    return absl::InvalidArgumentError("--op=cross-entropy needs --targets=FILE[:TENSOR]");
  }
  call->cross_entropy = a.cross_entropy;
  call->logprobs = a.logprobs;
  if (a.weight.empty() == a.w.empty()) {
    return absl::InvalidArgumentError("expected one of --weight=HANDLE and --w=FILE[:TENSOR]");
  }
  if (a.candidates.empty()) {
    return absl::InvalidArgumentError("--candidate=[NAME=]FILE[:TENSOR] is required");
  }
  if (call->operation == client::VerifyOperation::kBackward && a.dy.empty()) {
    return absl::InvalidArgumentError("--op=backward needs --dy=FILE[:TENSOR]");
  }
  if (call->operation == client::VerifyOperation::kLogits && !a.dy.empty()) {
    return absl::InvalidArgumentError("--dy: given, but --op=logits takes no dY");
  }
  if (!a.record_path.empty() && !a.baseline_path.empty()) {
    return absl::InvalidArgumentError("--baseline and --record exclude each other");
  }
  if (a.sample_seed != 0 && a.sample_rows == 0) {
    return absl::InvalidArgumentError(
        "--sample_seed: given without --sample_rows (the number of rows to draw)");
  }
  return absl::OkStatus();
}

// The tensors of the call, held here while VerifyArgs points at them.
struct VerifyTensors {
  std::optional<Tensor> x;
  std::optional<Tensor> w;
  std::optional<tensor_files::NamedTensor> dy;
  std::optional<tensor_files::NamedTensor> targets;
  std::vector<tensor_files::NamedTensor> candidates;
};

// A bf16 input from FILE[:TENSOR] (fp32 files taken when every value is a
// bf16 value).
absl::StatusOr<Tensor> LoadBf16(const std::string& ref, const char* flag) {
  absl::StatusOr<tensor_files::NamedTensor> file = tensor_files::LoadTensorRef(ref, flag);
  if (!file.ok()) return file.status();
  return ExactBf16(*std::move(file), flag);
}

// Reads --x, --w, --dy and the candidates into *held and points *call at
// them.
absl::Status LoadTensors(const VerifyCommandArgs& a, const std::vector<std::string>& outputs,
                         VerifyTensors* held, client::VerifyArgs* call) {
  LOGITD_ASSIGN_OR_RETURN(held->x, LoadBf16(a.x, "--x"));
  call->x = *held->x;
  if (!a.w.empty()) {
    LOGITD_ASSIGN_OR_RETURN(held->w, LoadBf16(a.w, "--w"));
    call->w = *held->w;
  }
  call->weight_handle = a.weight;
  if (!a.dy.empty()) {
    LOGITD_ASSIGN_OR_RETURN(held->dy, tensor_files::LoadTensorRef(a.dy, "--dy"));
    call->dy = held->dy->tensor;
  }
  if (!a.targets.empty()) {
    LOGITD_ASSIGN_OR_RETURN(held->targets, tensor_files::LoadTensorRef(a.targets, "--targets"));
    call->targets = held->targets->tensor;
  }
  // Addresses into it are kept: no reallocation once one is taken.
  held->candidates.reserve(a.candidates.size());
  for (const std::string& text : a.candidates) {
    CandidateRef ref = SplitCandidate(text, outputs);
    LOGITD_ASSIGN_OR_RETURN(tensor_files::NamedTensor t,
                            tensor_files::LoadTensorRef(ref.ref, "--candidate"));
    if (ref.name.empty()) {
      if (outputs.size() == 1) {
        ref.name = outputs[0];
      } else if (std::find(outputs.begin(), outputs.end(), t.name) != outputs.end()) {
        ref.name = t.name;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--candidate=", text, ": name the output it is (", absl::StrJoin(outputs, " or "),
            "), e.g. --candidate=", outputs[0], "=", ref.ref));
      }
    }
    if (call->candidates.count(ref.name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--candidate: '", ref.name, "' is given twice"));
    }
    t.name = ref.name;  // from here on, the output it stands for
    held->candidates.push_back(std::move(t));
    call->candidates[ref.name] = held->candidates.back().tensor;
  }
  return absl::OkStatus();
}

// A refusal of what was sent (a shape, a dtype, a handle, a size past the
// server's limits) or of the connection (IsServerUnreachable): exit 2, as a
// usage error is. What else the server answers (INTERNAL, a deadline) is 1.
bool IsInputOrConnectionError(const absl::Status& status) {
  return exit_codes::ForStatus(status) == exit_codes::kUsage;
}

}  // namespace

int RunVerifyCommand(const std::vector<std::string>& args) {
  const absl::Time start = absl::Now();
  absl::StatusOr<VerifyCommandArgs> parsed = ParseArgs(args);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  const VerifyCommandArgs& a = *parsed;
  if (a.help) {
    std::fputs(VerifyUsage().c_str(), stdout);
    return 0;
  }
  client::VerifyArgs call;
  std::vector<std::string> outputs;
  if (absl::Status s = CheckCombination(a, &call, &outputs); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  std::optional<Baseline> baseline;
  if (!a.baseline_path.empty()) {
    absl::StatusOr<Baseline> b = ReadBaseline(a.baseline_path);
    if (!b.ok()) return UsageError(std::string(b.status().message()));
    baseline = *std::move(b);
  }
  if (!a.report_dir.empty()) {
    if (absl::Status s = PrepareReportDir(a.report_dir); !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  }
  VerifyTensors held;
  if (absl::Status s = LoadTensors(a, outputs, &held, &call); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  call.alpha = a.alpha;
  call.sample_rows = a.sample_rows;
  call.sample_seed = a.sample_seed;

  Report report;
  report.tool = kProgram;
  report.started_at = absl::FormatTime(absl::RFC3339_sec, start, absl::UTCTimeZone());
  report.address = absl::GetFlag(FLAGS_server);
  report.options.suites = {"verify"};
  // `summary`: the table of candidates (none after a refused call, whose
  // error was printed once, on stderr).
  const auto finish = [&](int code, bool summary = true) {
    report.exit_code = code;
    report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (summary) {
      std::fputs(SummaryText(report).c_str(), stdout);
      std::fflush(stdout);
    }
    return WriteReportFiles(report, a.json_path, a.junit_path, a.report_dir, kProgram);
  };
  absl::StatusOr<std::unique_ptr<client::Client>> client = ConnectForReport(&report, kProgram);
  if (!client.ok()) {
    if (report.error.empty()) return UsageError(std::string(client.status().message()));
    return finish(2);
  }

  const absl::Time call_start = absl::Now();
  absl::StatusOr<client::VerifyResult> result = (*client)->Verify(call);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - call_start);
  if (!result.ok()) {
    report.error = absl::StrCat("Verify: ", absl::StatusCodeToString(result.status().code()), ": ",
                                result.status().message());
    std::fprintf(stderr, "%s: %s\n", kProgram, report.error.c_str());
    return finish(IsInputOrConnectionError(result.status()) ? 2 : 1, /*summary=*/false);
  }
  JudgeCandidates(a, *result, seconds, held.candidates, baseline, &report);
  return finish(ExitCodeFor(report.results, false));
}

}  // namespace logitd::validate
