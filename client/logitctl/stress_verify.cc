#include "client/logitctl/stress_verify.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "logitd/tensor.h"

namespace logitd::logitctl::stress {
namespace {

using client::VerifyOperation;

// The call whose outputs are verified: its arguments, with the server's
// outputs as the candidates.
struct OwnCall {
  VerifyOperation op = VerifyOperation::kLogits;
  std::string name;  // "logits", "cross-entropy", "logprobs"
  Tensor x, targets;
  std::map<std::string, Tensor> outputs;
};

absl::Status RunOwnCall(client::Client& c, const StressWeight& w, OwnCall* call) {
  switch (call->op) {
    case VerifyOperation::kLogits: {
      absl::StatusOr<Tensor> y = c.Logits(call->x, w.handle);
      if (!y.ok()) return y.status();
      call->outputs["y"] = *std::move(y);
      return absl::OkStatus();
    }
    case VerifyOperation::kCrossEntropy: {
      client::CrossEntropyOptions o;
      o.reduction = client::Reduction::kNone;
      o.want_lse = true;
      absl::StatusOr<client::CrossEntropyResult> r =
          c.CrossEntropy(call->x, call->targets, w.handle, o);
      if (!r.ok()) return r.status();
      call->outputs["loss"] = std::move(r->loss);
      if (r->lse.has_value()) call->outputs["lse"] = *std::move(r->lse);
      return absl::OkStatus();
    }
    default: {
      client::LogProbsOptions o;
      o.want_lse = true;
      o.want_entropy = true;
      absl::StatusOr<client::LogProbsResult> r = c.LogProbs(call->x, &call->targets, w.handle, o);
      if (!r.ok()) return r.status();
      for (const auto& [name, t] : {std::pair{"logprob", &r->logprob}, std::pair{"lse", &r->lse},
                                    std::pair{"entropy", &r->entropy}}) {
        if (t->has_value()) call->outputs[name] = std::move(**t);
      }
      return absl::OkStatus();
    }
  }
}

client::VerifyArgs ArgsOf(const OwnCall& call, const StressWeight& w,
                          const std::map<std::string, Tensor>& candidates) {
  client::VerifyArgs a;
  a.operation = call.op;
  a.weight_handle = w.handle;
  a.x = call.x;
  if (call.op != VerifyOperation::kLogits) a.targets = call.targets;
  a.cross_entropy.reduction = client::Reduction::kNone;
  for (const auto& [name, t] : candidates) a.candidates[name] = t;
  return a;
}

std::string Rows(const std::vector<std::int64_t>& rows) { return absl::StrJoin(rows, ", "); }

// One element of one of the call's outputs set to 1e30 in `row` (a row
// args checks): outside the proven bound, and listed first. What is wrong,
// or empty.
std::string MovedElementIsFound(client::Client& c, const StressWeight& w, const OwnCall& call,
                                const client::VerifyArgs& args, std::int64_t row,
                                const std::string& shape, std::mt19937_64& rng,
                                absl::Status* status) {
  auto it = call.outputs.begin();
  std::advance(it, static_cast<long>(rng() % call.outputs.size()));
  std::string name = it->first;
  // An ignored token's loss and log-prob are 0 whatever the logits: its lse.
  if (call.op != VerifyOperation::kLogits && call.targets.data<std::int64_t>()[row] == -100) {
    name = "lse";
  }
  std::map<std::string, Tensor> candidates;
  for (const auto& [n, t] : call.outputs) candidates[n] = t.Clone();
  const std::int64_t cols = call.op == VerifyOperation::kLogits ? w.v : 1;
  const std::int64_t col = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cols));
  Tensor& bad = candidates[name];
  if (bad.dtype() != DType::kFp32) return "";
  bad.data<float>()[row * cols + col] = 1e30f;
  client::VerifyArgs bad_args = ArgsOf(call, w, candidates);
  bad_args.sample_rows = args.sample_rows;
  bad_args.sample_seed = args.sample_seed;
  absl::StatusOr<client::VerifyResult> r = c.Verify(bad_args);
  if (!r.ok()) {
    *status = r.status();
    return "";
  }
  const client::CandidateVerdict* v = r->Find(name);
  const std::vector<std::int64_t> where =
      cols > 1 ? std::vector<std::int64_t>{row, col} : std::vector<std::int64_t>{row};
  if (r->verdict != "outside_bounds" || v == nullptr || v->outside_bound != 1 ||
      v->first_outside.empty() || v->first_outside[0].index != where) {
    return absl::StrCat(name, "[", Rows(where), "] = 1e30 judged ", r->verdict,
                        v != nullptr ? absl::StrCat(" with ", v->outside_bound, " outside") : "",
                        " (", shape, ")");
  }
  return "";
}

}  // namespace

std::string VerifyOwnOutputs(client::Client& c, const StressWeight& w, std::int64_t m,
                             std::mt19937_64& rng, std::string* rpc, absl::Status* status) {
  OwnCall call;
  const int pick = static_cast<int>(rng() % 3);
  call.op = pick == 0   ? VerifyOperation::kLogits
            : pick == 1 ? VerifyOperation::kCrossEntropy
                        : VerifyOperation::kLogProbs;
  call.name = pick == 0 ? "logits" : pick == 1 ? "cross-entropy" : "logprobs";
  *rpc = absl::StrCat("Verify(", call.name, ")");
  call.x = RandomTensor(DType::kBf16, {m, w.k}, w.integer, rng);
  call.targets = RandomTargets(m, w.v, rng);
  if (*status = RunOwnCall(c, w, &call); !status->ok()) return "";
  if (call.outputs.empty()) return "the call returned no output to verify";

  // Its own outputs: they pass, every row or a seeded sample.
  client::VerifyArgs args = ArgsOf(call, w, call.outputs);
  const bool sampled = m > 2 && rng() % 3 == 0;
  if (sampled) {
    args.sample_rows = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(m - 1));
    args.sample_seed = rng() % 2 == 0 ? 0 : 1 + rng() % 1000;
  }
  absl::StatusOr<client::VerifyResult> own = c.Verify(args);
  if (!own.ok()) {
    *status = own.status();
    return "";
  }
  const std::string shape = absl::StrCat("M=", m, ", V=", w.v, ", K=", w.k);
  if (!own->passed() || own->candidates.size() != call.outputs.size()) {
    std::string worst;
    for (const client::CandidateVerdict& v : own->candidates) {
      if (v.passed() || v.first_outside.empty()) continue;
      const client::VerifyElement& e = v.first_outside[0];
      absl::StrAppend(&worst, "; ", v.name, "[", Rows(e.index), "] ", e.candidate, " against ",
                      e.reference, " (bound ", e.bound, ", logitd's ", e.logitd, ")");
    }
    return absl::StrCat("logitd's own ", call.name, " outputs judged ", own->verdict, " (", shape,
                        ")", worst);
  }
  const std::vector<std::int64_t>& checked = own->rows_checked;
  // (A sample of one or two rows is the first and the last.)
  if (sampled &&
      (own->verdict.find("_sampled") == std::string::npos || checked.empty() ||
       static_cast<std::int64_t>(checked.size()) > std::max<std::int64_t>(2, args.sample_rows))) {
    return absl::StrCat("a sample of ", args.sample_rows, " rows judged ", own->verdict,
                        " with rows_checked [", Rows(checked), "] (", shape, ")");
  }
  if (rng() % 3 != 0) return "";

  const std::int64_t row =
      sampled ? checked[rng() % checked.size()] : static_cast<std::int64_t>(rng() % m);
  return MovedElementIsFound(c, w, call, args, row, shape, rng, status);
}

}  // namespace logitd::logitctl::stress
