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
#include "client/validate/verify_verdicts.h"
#include "logitd/bf16.h"
#include "logitd/client.h"
#include "logitd/status_macros.h"

// Defined by logitctl, which applies it before dispatching here.

namespace logitd::validate {
namespace {

constexpr int kVerifyExitUsage = 2;
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
  // The server's history (--project, --branch, --ref; the case is --case).
  std::string project;
  std::string branch;
  std::string ref;
  // The recorded run to compare with (--compare_branch, --compare_ref,
  // --compare_run).
  std::string compare_branch;
  std::string compare_ref;
  std::string compare_run;
  std::string compare_baseline;
  // --compare_missing: "fail" (NOT_FOUND, exit 2) or "record" (recorded
  // without a comparison) when no run is selected.
  std::string compare_missing = "fail";
  bool help = false;
};

constexpr const char* kValueFlags[] = {"op",
                                       "x",
                                       "weight",
                                       "w",
                                       "dy",
                                       "targets",
                                       "candidate",
                                       "alpha",
                                       "sample_rows",
                                       "sample_seed",
                                       "json",
                                       "junit",
                                       "report",
                                       "record",
                                       "baseline",
                                       "case",
                                       "reduction",
                                       "ignore_index",
                                       "z_loss",
                                       "logit_softcap",
                                       "grad_scale",
                                       "temperature",
                                       "vocab_size",
                                       "project",
                                       "branch",
                                       "ref",
                                       "compare_branch",
                                       "compare_ref",
                                       "compare_run",
                                       "compare_baseline",
                                       "compare_missing"};

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
    std::string* field = name == "op"                 ? &a->op
                         : name == "x"                ? &a->x
                         : name == "weight"           ? &a->weight
                         : name == "w"                ? &a->w
                         : name == "dy"               ? &a->dy
                         : name == "targets"          ? &a->targets
                         : name == "json"             ? &a->json_path
                         : name == "junit"            ? &a->junit_path
                         : name == "record"           ? &a->record_path
                         : name == "baseline"         ? &a->baseline_path
                         : name == "case"             ? &a->case_name
                         : name == "project"          ? &a->project
                         : name == "branch"           ? &a->branch
                         : name == "ref"              ? &a->ref
                         : name == "compare_branch"   ? &a->compare_branch
                         : name == "compare_ref"      ? &a->compare_ref
                         : name == "compare_run"      ? &a->compare_run
                         : name == "compare_baseline" ? &a->compare_baseline
                         : name == "compare_missing"  ? &a->compare_missing
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

constexpr char kVerifyHistoryFlags[] =
    R"(  --project=PROJECT   record the run in the server's history (logitd
                      --history) under PROJECT and --case, with
                      --branch=BRANCH and --ref=REF (a commit) if given;
                      `logitctl runs` lists the recorded runs
  --compare_branch=B | --compare_ref=R | --compare_run=ID | --compare_baseline=N
                      with --project: compare the candidates with that
                      recorded run of the project and case (a branch's or
                      ref's latest, or the run promoted as N: logitctl runs
                      promote RUN N): bits identical, different (both within
                      bounds) or different (outside bounds), the figures'
                      deltas, and whether the platform or inputs differ
  --compare_missing=fail|record
                      when no recorded run is selected: fail (exit 2, the
                      default) or record this run without a comparison (a
                      branch's first run in CI)

)";

constexpr char kVerifyExitCodes[] =
    R"(exit codes: 0 every candidate passed (within_bounds or bitwise_equal_to_logitd,
              sampled or not),
            1 one failed (outside_bounds or outside_precision_class), the
              recorded run broke a rule of its project (an ALERT line each;
              logitctl rules) or could not be recorded (NOT RECORDED), or
              the server failed the call (INTERNAL, a deadline),
            2 usage or input error (the server's INVALID_ARGUMENT, NOT_FOUND,
              OUT_OF_RANGE, FAILED_PRECONDITION, RESOURCE_EXHAUSTED among
              them), or the server could not be reached or refused the
              credentials (the rule of every logitctl command)
)";

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
                      operation), to keep several calls in one file; with
                      --project, the case the server records the run under
)" + std::string(kVerifyHistoryFlags) +
         std::string(kVerifyExitCodes);
}

int VerifyUsageError(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kProgram, message.c_str());
  return kVerifyExitUsage;
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

// The server's history: the labels to record the run under (--project,
// --case, --branch, --ref) and the run to compare with (--compare_*).
absl::Status HistoryArgs(const VerifyCommandArgs& a, client::VerifyArgs* call) {
  if (a.project.empty() && !(a.branch.empty() && a.ref.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        a.branch.empty() ? "--ref" : "--branch",
        ": given without --project (the server records a run under a project and a case)"));
  }
  if (!a.project.empty()) {
    if (a.case_name.empty()) {
      return absl::InvalidArgumentError(
          "--project: needs --case=CASE, the case the server records the run under");
    }
    call->record = client::RunLabels{a.project, a.case_name, a.branch, a.ref};
  }
  if (a.compare_missing != "fail" && a.compare_missing != "record") {
    return absl::InvalidArgumentError(
        absl::StrCat("--compare_missing: expected fail or record, got '", a.compare_missing, "'"));
  }
  const int selectors = !a.compare_branch.empty() + !a.compare_ref.empty() +
                        !a.compare_run.empty() + !a.compare_baseline.empty();
  if (selectors > 1) {
    return absl::InvalidArgumentError(
        "--compare_branch, --compare_ref, --compare_run and --compare_baseline exclude each other");
  }
  if (selectors == 1) {
    if (a.project.empty()) {
      return absl::InvalidArgumentError(
          "--compare_*: needs --project and --case (the runs it compares with are theirs)");
    }
    client::BaselineSelector sel{a.compare_branch, a.compare_ref, 0, a.compare_baseline,
                                 a.compare_missing == "record"};
    if (!a.compare_run.empty() &&
        (!absl::SimpleAtoi(a.compare_run, &sel.run_id) || sel.run_id <= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--compare_run: expected a run id (logitctl runs), got '", a.compare_run, "'"));
    }
    call->compare = sel;
  }
  return absl::OkStatus();
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
  return HistoryArgs(a, call);
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

int RunVerifyCommand(const std::string& server, const std::vector<std::string>& args) {
  const absl::Time start = absl::Now();
  absl::StatusOr<VerifyCommandArgs> parsed = ParseArgs(args);
  if (!parsed.ok()) return VerifyUsageError(std::string(parsed.status().message()));
  const VerifyCommandArgs& a = *parsed;
  if (a.help) {
    std::fputs(VerifyUsage().c_str(), stdout);
    return 0;
  }
  client::VerifyArgs call;
  std::vector<std::string> outputs;
  if (absl::Status s = CheckCombination(a, &call, &outputs); !s.ok()) {
    return VerifyUsageError(std::string(s.message()));
  }
  std::optional<Baseline> baseline;
  if (!a.baseline_path.empty()) {
    absl::StatusOr<Baseline> b = ReadBaseline(a.baseline_path);
    if (!b.ok()) return VerifyUsageError(std::string(b.status().message()));
    baseline = *std::move(b);
  }
  if (!a.report_dir.empty()) {
    if (absl::Status s = PrepareReportDir(a.report_dir); !s.ok()) {
      return VerifyUsageError(std::string(s.message()));
    }
  }
  VerifyTensors held;
  if (absl::Status s = LoadTensors(a, outputs, &held, &call); !s.ok()) {
    return VerifyUsageError(std::string(s.message()));
  }
  call.alpha = a.alpha;
  call.sample_rows = a.sample_rows;
  call.sample_seed = a.sample_seed;

  Report report;
  report.tool = kProgram;
  report.started_at = absl::FormatTime(absl::RFC3339_sec, start, absl::UTCTimeZone());
  report.address = server;
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
    if (report.error.empty()) return VerifyUsageError(std::string(client.status().message()));
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
  if (result->run_id > 0) {
    std::printf("recorded as run %lld in the server's history (project %s, case %s)\n",
                static_cast<long long>(result->run_id), a.project.c_str(), a.case_name.c_str());
  }
  if (result->comparison.has_value()) PrintComparison(*result->comparison);
  PrintAlerts(result->alerts);
  if (!result->record_error.empty()) {
    std::printf("NOT RECORDED: %s (no rule was checked)\n", result->record_error.c_str());
  }
  // An alert, or a run asked to be recorded that was not, fails the run as
  // a failing verdict does: exit 1.
  const int code = ExitCodeFor(report.results, false);
  return finish(code == 0 && (!result->alerts.empty() || !result->record_error.empty()) ? 1 : code);
}

}  // namespace logitd::validate
