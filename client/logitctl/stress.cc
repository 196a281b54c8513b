#include "client/logitctl/stress.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/logitctl/common.h"
#include "client/logitctl/stress_checks.h"
#include "client/logitctl/stress_verify.h"
#include "logitd/bf16.h"
#include "logitd/reference/numerics.h"
#include "logitd/status_macros.h"
#include "logitd/tensor.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::int32_t, clients, 16, "stress: worker threads, each on its own connection");
ABSL_FLAG(std::int64_t, stress_max_m, 4096, "stress: largest M (tokens) of a call");
ABSL_FLAG(std::int64_t, stress_max_v, 128256, "stress: largest vocabulary V of the weights used");
ABSL_FLAG(std::int64_t, stress_max_k, 4096, "stress: largest hidden size K of the weights used");
ABSL_FLAG(std::uint64_t, stress_max_output_bytes, std::uint64_t{1} << 30,
          "stress: largest tensor one call returns, bytes (M is cut to fit)");
ABSL_FLAG(double, stress_slow_call, 120,
          "stress: a call that takes longer than this many seconds counts as hung");

ABSL_DECLARE_FLAG(double, duration);
ABSL_DECLARE_FLAG(std::uint64_t, seed);
ABSL_DECLARE_FLAG(bool, json);

namespace logitd::logitctl {
namespace {

using client::Client;
using stress::Agrees;
using stress::OwnGradient;
using stress::RandomTargets;
using stress::RandomTensor;
using stress::Sample;
using stress::SampleRows;
using stress::Samples;
using stress::StepGamma;
using stress::StressWeight;
using stress::Value;

// fp32's unit roundoff.
constexpr double kU = kFp32UnitRoundoff;

struct Outcome {
  std::int64_t calls = 0;
  std::int64_t wrong = 0;
  std::int64_t slow = 0;
  std::map<std::string, std::int64_t> errors;  // by status code
  std::vector<double> seconds;
  std::string first_problem;
};

class Stress {
 public:
  Stress(std::vector<std::unique_ptr<Client>> clients, std::vector<StressWeight> weights)
      : clients_(std::move(clients)), weights_(std::move(weights)) {}

  void Worker(int index, absl::Time until);
  std::map<std::string, Outcome> Totals() {
    absl::MutexLock lock(&mu_);
    return totals_;
  }

 private:
  // Records one call of `rpc`; `problem` empty when its result was right.
  void Record(const std::string& rpc, const absl::Status& status, double seconds,
              const std::string& problem);

  std::int64_t PickM(std::mt19937_64& rng, std::int64_t bytes_per_row) const {
    const std::int64_t max_m = absl::GetFlag(FLAGS_stress_max_m);
    const auto max_out = static_cast<std::int64_t>(absl::GetFlag(FLAGS_stress_max_output_bytes));
    const std::int64_t cap = std::max<std::int64_t>(1, std::min(max_m, max_out / bytes_per_row));
    // Log-uniform: small M (decode steps) as often as large (prefill, training).
    const double u = std::uniform_real_distribution<double>(0.0, std::log(cap + 1.0))(rng);
    return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::exp(u)), 1, cap);
  }

  std::string DoLogits(Client& c, const StressWeight& w, DType out, std::mt19937_64& rng,
                       absl::Status* status);
  std::string DoBackward(Client& c, const StressWeight& w, std::mt19937_64& rng,
                         absl::Status* status);
  std::string DoCast(Client& c, std::mt19937_64& rng, absl::Status* status);
  std::string DoCrossEntropy(Client& c, const StressWeight& w, std::mt19937_64& rng,
                             absl::Status* status);
  std::string DoLogProbs(Client& c, const StressWeight& w, std::mt19937_64& rng,
                         absl::Status* status);

  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<StressWeight> weights_;
  absl::Mutex mu_;
  std::map<std::string, Outcome> totals_ ABSL_GUARDED_BY(mu_);
};

void Stress::Record(const std::string& rpc, const absl::Status& status, double seconds,
                    const std::string& problem) {
  absl::MutexLock lock(&mu_);
  Outcome& o = totals_[rpc];
  ++o.calls;
  o.seconds.push_back(seconds);
  if (seconds > absl::GetFlag(FLAGS_stress_slow_call)) ++o.slow;
  std::string described;
  if (!status.ok()) {
    ++o.errors[absl::StatusCodeToString(status.code())];
    described = absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
  } else if (!problem.empty()) {
    ++o.wrong;
    described = problem;
  }
  if (!described.empty()) {
    if (o.first_problem.empty()) o.first_problem = described;
    std::cerr << "stress: " << rpc << ": " << described << "\n";
  }
}

std::string Stress::DoLogits(Client& c, const StressWeight& w, DType out, std::mt19937_64& rng,
                             absl::Status* status) {
  const std::int64_t m = PickM(rng, w.v * static_cast<std::int64_t>(ElementSize(out)));
  const Tensor x = RandomTensor(DType::kBf16, {m, w.k}, w.integer, rng);
  client::LogitsOptions o;
  o.out_dtype = out;
  // Row blocks most of the time, and a call of many rows over up to three
  // connections (the same bits either way).
  o.pipeline = rng() % 4 != 0;
  o.connections = 1 + static_cast<int>(rng() % 3);
  absl::StatusOr<Tensor> y = c.Logits(x, w.handle, o);
  if (!y.ok()) {
    *status = y.status();
    return "";
  }
  if (y->shape() != std::vector<std::int64_t>{m, w.v} || y->dtype() != out) {
    return absl::StrCat("y has shape ", ShapeString(y->shape()), ", expected [", m, ", ", w.v, "]");
  }
  for (const Sample& s : Samples(m, w.v, rng)) {
    double ref = 0, abs_sum = 0;
    for (std::int64_t l = 0; l < w.k; ++l) {
      const double t = Value(x, s.i * w.k + l) * Value(w.w, s.j * w.k + l);
      ref += t;
      abs_sum += std::fabs(t);
    }
    if (!Agrees(*y, s.i * w.v + s.j, ref, abs_sum, w.k, w.integer)) {
      return absl::StrFormat("y[%d, %d] = %.9g, reference %.9g (M=%d, V=%d, K=%d, %s out)", s.i,
                             s.j, Value(*y, s.i * w.v + s.j), ref, m, w.v, w.k, DTypeName(out));
    }
  }
  return "";
}

std::string Stress::DoBackward(Client& c, const StressWeight& w, std::mt19937_64& rng,
                               absl::Status* status) {
  const std::int64_t m = PickM(rng, w.v * 4);
  const bool dy_bf16 = rng() % 2 == 0;
  const Tensor dy = RandomTensor(dy_bf16 ? DType::kBf16 : DType::kFp32, {m, w.v}, w.integer, rng);
  const Tensor x = RandomTensor(DType::kBf16, {m, w.k}, w.integer, rng);
  client::BackwardOptions o;
  o.dx_dtype = rng() % 2 == 0 ? DType::kBf16 : DType::kFp32;
  o.dw_dtype = rng() % 3 == 0 ? DType::kBf16 : DType::kFp32;
  o.want_dw =
      static_cast<std::uint64_t>(w.v * w.k) * 4 <= absl::GetFlag(FLAGS_stress_max_output_bytes);
  absl::StatusOr<client::BackwardResult> r = c.Backward(dy, x, w.handle, o);
  if (!r.ok()) {
    *status = r.status();
    return "";
  }
  if (!r->dx.has_value() || (o.want_dw && !r->dw.has_value()))
    return "an asked-for output is missing";
  // G = bf16(dY), the contract's one cast.
  auto g = [&](std::int64_t i, std::int64_t j) {
    const double d = Value(dy, i * w.v + j);
    return static_cast<double>(Bf16ToFloat(FloatToBf16(static_cast<float>(d))));
  };
  for (const Sample& s : Samples(m, w.k, rng)) {
    double ref = 0, abs_sum = 0;
    for (std::int64_t r2 = 0; r2 < w.v; ++r2) {
      const double t = g(s.i, r2) * Value(w.w, r2 * w.k + s.j);
      ref += t;
      abs_sum += std::fabs(t);
    }
    if (!Agrees(*r->dx, s.i * w.k + s.j, ref, abs_sum, w.v, w.integer)) {
      return absl::StrFormat("dx[%d, %d] = %.9g, reference %.9g (M=%d, V=%d, K=%d)", s.i, s.j,
                             Value(*r->dx, s.i * w.k + s.j), ref, m, w.v, w.k);
    }
  }
  if (o.want_dw) {
    for (const Sample& s : Samples(w.v, w.k, rng)) {
      double ref = 0, abs_sum = 0;
      for (std::int64_t i = 0; i < m; ++i) {
        const double t = g(i, s.i) * Value(x, i * w.k + s.j);
        ref += t;
        abs_sum += std::fabs(t);
      }
      if (!Agrees(*r->dw, s.i * w.k + s.j, ref, abs_sum, m, w.integer)) {
        return absl::StrFormat("dw[%d, %d] = %.9g, reference %.9g (M=%d, V=%d, K=%d)", s.i, s.j,
                               Value(*r->dw, s.i * w.k + s.j), ref, m, w.v, w.k);
      }
    }
  }
  return "";
}

std::string Stress::DoCast(Client& c, std::mt19937_64& rng, absl::Status* status) {
  const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % (1u << 20));
  Tensor in(DType::kFp32, {n});
  std::uniform_int_distribution<std::uint32_t> bits;
  for (std::int64_t i = 0; i < n; ++i) {
    // Any bit pattern but the test-only device-fault triggers.
    std::uint32_t b = bits(rng);
    if ((b & 0x7fffffffu) == 0x7fbadbadu || (b & 0x7fffffffu) == 0x7fbadbacu) b ^= 1;
    in.data<float>()[i] = BitsToFloat(b);
  }
  absl::StatusOr<Tensor> out = c.CastToBf16(in);
  if (!out.ok()) {
    *status = out.status();
    return "";
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (out->data<Bf16Bits>()[i] != FloatToBf16(in.data<float>()[i])) {
      return absl::StrFormat("cast[%d] of 0x%08x gave 0x%04x, expected 0x%04x", i,
                             FloatBits(in.data<float>()[i]), out->data<Bf16Bits>()[i],
                             FloatToBf16(in.data<float>()[i]));
    }
  }
  return "";
}

std::string Stress::DoCrossEntropy(Client& c, const StressWeight& w, std::mt19937_64& rng,
                                   absl::Status* status) {
  const std::int64_t m = std::min<std::int64_t>(PickM(rng, w.k * 4), 4096);
  const Tensor x = RandomTensor(DType::kBf16, {m, w.k}, w.integer, rng);
  const Tensor targets = RandomTargets(m, w.v, rng);
  client::CrossEntropyOptions o;
  o.reduction = client::Reduction::kNone;
  o.want_lse = true;
  o.want_dx = rng() % 2 == 0;
  o.want_dw = rng() % 4 == 0 && static_cast<std::uint64_t>(w.v * w.k) * 4 <=
                                    absl::GetFlag(FLAGS_stress_max_output_bytes);
  o.pipeline = rng() % 4 != 0;
  absl::StatusOr<client::CrossEntropyResult> r = c.CrossEntropy(x, targets, w.handle, o);
  if (!r.ok()) {
    *status = r.status();
    return "";
  }
  if (r->loss.numel() != m || !r->lse.has_value() || (o.want_dx && !r->dx.has_value()) ||
      (o.want_dw && !r->dw.has_value())) {
    return "an asked-for output is missing or has the wrong size";
  }
  // A few whole rows of logits in fp64: loss and lse within a few fp32
  // roundings of lse; dX within bf16 rounding of G.
  for (const auto& [i, z, lse, err] : SampleRows(x, w, m, rng)) {
    const std::int64_t t = targets.data<std::int64_t>()[i];
    const double loss = t == -100 ? 0.0 : lse - z[static_cast<std::size_t>(t)];
    const double tol = 2 * err + 8 * kU * (std::fabs(lse) + std::fabs(loss) + 1);
    const double got_lse = r->lse->data<float>()[i];
    const double got_loss = r->loss.data<float>()[i];
    if (!(std::fabs(got_lse - lse) <= tol) || !(std::fabs(got_loss - loss) <= tol)) {
      return absl::StrFormat(
          "token %d: loss %.9g lse %.9g, reference %.9g and %.9g (M=%d, V=%d, K=%d)", i, got_loss,
          got_lse, loss, lse, m, w.v, w.k);
    }
    if (o.want_dx) {
      for (std::int64_t j = 0; j < w.k; j += std::max<std::int64_t>(1, w.k / 16)) {
        // Each G = bf16(p - onehot) carries its bf16 rounding, the fp32
        // rounding of p and of p - 1 (which cancels when p is near 1), and
        // the logits' own error carried into p.
        double ref = 0, bound = 0;
        for (std::int64_t r2 = 0; r2 < w.v; ++r2) {
          const double p = t == -100 ? 0.0 : std::exp(z[static_cast<std::size_t>(r2)] - lse);
          const double gr = p - (r2 == t ? 1.0 : 0.0);
          const double wv = std::fabs(Value(w.w, r2 * w.k + j));
          ref += gr * Value(w.w, r2 * w.k + j);
          bound += wv * (std::ldexp(std::fabs(gr), -8) + 8 * kU * (p + (r2 == t ? 1.0 : 0.0)) +
                         4 * err * p);
        }
        const double got = Value(*r->dx, i * w.k + j);
        // dX in bf16 (the default) is rounded once more at the end.
        const double out_rounding =
            r->dx->dtype() == DType::kBf16 ? std::ldexp(std::fabs(ref) + bound, -8) : 0.0;
        if (!(std::fabs(got - ref) <= bound + StepGamma(w.v) * bound + out_rounding + 1e-30)) {
          return absl::StrFormat("dx[%d, %d] = %.9g, reference %.9g (M=%d, V=%d, K=%d)", i, j, got,
                                 ref, m, w.v, w.k);
        }
      }
    }
  }
  if (o.want_dw) {
    for (std::int64_t i = 0; i < r->dw->numel();
         i += std::max<std::int64_t>(1, r->dw->numel() / 64)) {
      if (!std::isfinite(r->dw->data<float>()[i])) return absl::StrCat("dw[", i, "] is not finite");
    }
  }
  return "";
}

std::string Stress::DoLogProbs(Client& c, const StressWeight& w, std::mt19937_64& rng,
                               absl::Status* status) {
  const std::int64_t m = std::min<std::int64_t>(PickM(rng, w.k * 4), 4096);
  const Tensor x = RandomTensor(DType::kBf16, {m, w.k}, w.integer, rng);
  const Tensor targets = RandomTargets(m, w.v, rng);
  client::LogProbsOptions o;
  o.top_k = rng() % 3 == 0 ? 0 : 1 + static_cast<std::int64_t>(rng() % 64);
  o.top_k = std::min(o.top_k, w.v);
  o.want_entropy = true;
  o.want_lse = true;
  o.want_rank = rng() % 2 == 0;
  o.pipeline = rng() % 4 != 0;
  o.connections = 1 + static_cast<int>(rng() % 3);
  absl::StatusOr<client::LogProbsResult> r = c.LogProbs(x, &targets, w.handle, o);
  if (!r.ok()) {
    *status = r.status();
    return "";
  }
  if (!r->logprob.has_value() || !r->lse.has_value() || !r->entropy.has_value() ||
      r->logprob->numel() != m || (o.want_rank && !r->rank.has_value()) ||
      (o.top_k > 0 && (!r->topk_ids.has_value() || r->topk_ids->numel() != m * o.top_k))) {
    return "an asked-for output is missing or has the wrong size";
  }
  // A few whole rows against fp64, each result within what the logits'
  // gamma_K bound err allows: lse 1 err, logprob 2, entropy 2 H err (first
  // order); a top-k entry's z within 2 err of the reference's at its place;
  // the rank between the entries surely and possibly above the target.
  for (const auto& [i, z, lse, err] : SampleRows(x, w, m, rng)) {
    double h = 0;
    for (double zj : z) h -= std::exp(zj - lse) * (zj - lse);
    const std::int64_t t = targets.data<std::int64_t>()[i];
    const double logprob = t == -100 ? 0.0 : z[static_cast<std::size_t>(t)] - lse;
    const double tol = 2 * err + 8 * kU * (std::fabs(lse) + std::fabs(logprob) + 1);
    const double got_lse = r->lse->data<float>()[i];
    const double got_lp = r->logprob->data<float>()[i];
    const double got_h = r->entropy->data<float>()[i];
    if (!(std::fabs(got_lse - lse) <= tol) || !(std::fabs(got_lp - logprob) <= tol) ||
        !(std::fabs(got_h - h) <= 2 * h * err + tol)) {
      return absl::StrFormat(
          "token %d: logprob %.9g lse %.9g entropy %.9g, reference %.9g, %.9g and %.9g "
          "(M=%d, V=%d, K=%d)",
          i, got_lp, got_lse, got_h, logprob, lse, h, m, w.v, w.k);
    }
    std::vector<double> sorted = z;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    for (std::int64_t j = 0; j < o.top_k; ++j) {
      const std::int32_t id = r->topk_ids->data<std::int32_t>()[i * o.top_k + j];
      if (id < 0 || id >= w.v) return absl::StrFormat("token %d: top-k id %d outside V", i, id);
      const double zj = z[static_cast<std::size_t>(id)];
      const double got = r->topk_logprobs->data<float>()[i * o.top_k + j];
      if (!(std::fabs(zj - sorted[static_cast<std::size_t>(j)]) <= 2 * err) ||
          !(std::fabs(got - (zj - lse)) <= tol)) {
        return absl::StrFormat(
            "token %d: top-%d entry %d (id %d, log-prob %.9g) is not the "
            "reference's (z %.9g against %.9g)",
            i, o.top_k, j, id, got, zj, sorted[static_cast<std::size_t>(j)]);
      }
    }
    if (!o.want_rank) continue;
    const std::int64_t rank = r->rank->data<std::int64_t>()[i];
    std::int64_t surely = 0, maybe = 0;
    for (std::int64_t j = 0; t != -100 && j < w.v; ++j) {
      if (j == t) continue;
      surely += z[static_cast<std::size_t>(j)] > z[static_cast<std::size_t>(t)] + 2 * err;
      maybe += z[static_cast<std::size_t>(j)] >= z[static_cast<std::size_t>(t)] - 2 * err;
    }
    if (t == -100 ? rank != -1 : (rank < surely || rank > maybe)) {
      return absl::StrFormat("token %d: rank %d of target %d, expected in [%d, %d]", i, rank, t,
                             t == -100 ? -1 : surely, t == -100 ? -1 : maybe);
    }
  }
  return "";
}

void Stress::Worker(int index, absl::Time until) {
  Client& c = *clients_[static_cast<std::size_t>(index)];
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 7919 + static_cast<std::uint64_t>(index));
  OwnGradient own;
  own.w.v = 257 + index * 13;
  own.w.k = 96 + index * 7;
  own.w.integer = true;
  own.w.w = RandomTensor(DType::kBf16, {own.w.v, own.w.k}, true, rng);
  {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<client::WeightInfo> info =
        c.RegisterWeight(own.w.w, absl::StrCat("stress-own-", index));
    Record("RegisterWeight", info.status(), absl::ToDoubleSeconds(absl::Now() - t0), "");
    if (!info.ok()) return;
    own.w.handle = info->handle;
  }
  own.expected.assign(static_cast<std::size_t>(own.w.v * own.w.k), 0.0);

  while (absl::Now() < until) {
    const int pick = static_cast<int>(rng() % 100);
    const StressWeight& w = weights_[rng() % weights_.size()];
    absl::Status status;
    std::string problem;
    std::string rpc;
    const absl::Time t0 = absl::Now();
    if (pick < 25) {
      rpc = "Logits(fp32)";
      problem = DoLogits(c, w, DType::kFp32, rng, &status);
    } else if (pick < 35) {
      rpc = "Logits(bf16)";
      problem = DoLogits(c, w, DType::kBf16, rng, &status);
    } else if (pick < 55) {
      rpc = "Backward";
      problem = DoBackward(c, w, rng, &status);
    } else if (pick < 65) {
      rpc = "Backward(accumulate)";
      status = own.Accumulate(c, rng);
    } else if (pick < 70) {
      rpc = "FetchGradient";
      problem = own.Fetch(c, &status);
    } else if (pick < 75) {
      rpc = "Cast";
      problem = DoCast(c, rng, &status);
    } else if (pick < 85) {
      rpc = "LogProbs";
      problem = DoLogProbs(c, w, rng, &status);
    } else if (pick < 93) {
      rpc = "CrossEntropy";
      problem = DoCrossEntropy(c, w, rng, &status);
    } else {
      problem = stress::VerifyOwnOutputs(c, w, PickM(rng, w.v * 4), rng, &rpc, &status);
    }
    Record(rpc, status, absl::ToDoubleSeconds(absl::Now() - t0), problem);
  }
  (void)c.ReleaseWeight(own.w.handle, /*force=*/true);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// Prints a row of counts per RPC, the summary line and, with --json, the
// report. True when the run passed: calls were made, none failed, was wrong
// or hung, and the server still answered at the end.
bool PrintReport(const std::map<std::string, Outcome>& totals, int clients, double elapsed,
                 const client::ServerInfo& before, const std::optional<client::ServerInfo>& after) {
  std::int64_t calls = 0, errors = 0, wrong = 0, slow = 0;
  nlohmann::ordered_json report;
  report["clients"] = clients;
  report["seconds"] = elapsed;
  report["backend"] = before.backend;
  report["device"] = before.device_name;
  nlohmann::ordered_json per = nlohmann::ordered_json::object();
  std::printf("%-22s %8s %7s %7s %6s %10s %10s\n", "rpc", "calls", "errors", "wrong", "hung",
              "p50 ms", "max ms");
  for (const auto& [rpc, o] : totals) {
    std::int64_t e = 0;
    for (const auto& [code, n] : o.errors) e += n;
    calls += o.calls;
    errors += e;
    wrong += o.wrong;
    slow += o.slow;
    std::printf("%-22s %8lld %7lld %7lld %6lld %10.2f %10.2f\n", rpc.c_str(),
                static_cast<long long>(o.calls), static_cast<long long>(e),
                static_cast<long long>(o.wrong), static_cast<long long>(o.slow),
                1000 * Percentile(o.seconds, 0.5), 1000 * Percentile(o.seconds, 1.0));
    nlohmann::ordered_json r;
    r["calls"] = o.calls;
    r["errors"] = o.errors;
    r["wrong"] = o.wrong;
    r["hung"] = o.slow;
    r["p50_ms"] = 1000 * Percentile(o.seconds, 0.5);
    r["max_ms"] = 1000 * Percentile(o.seconds, 1.0);
    if (!o.first_problem.empty()) r["first_problem"] = o.first_problem;
    per[rpc] = std::move(r);
  }
  report["rpcs"] = std::move(per);
  report["calls"] = calls;
  report["errors"] = errors;
  report["wrong"] = wrong;
  report["hung"] = slow;
  report["device_bytes_in_use_before"] = before.device_bytes_in_use;
  if (after) report["device_bytes_in_use_after"] = after->device_bytes_in_use;
  std::printf(
      "stress: %lld calls in %.1f s from %d clients: %lld errors, %lld wrong results, %lld hung "
      "(over %.0f s); device memory in use %.1f MiB before, %s after\n",
      static_cast<long long>(calls), elapsed, clients, static_cast<long long>(errors),
      static_cast<long long>(wrong), static_cast<long long>(slow),
      absl::GetFlag(FLAGS_stress_slow_call), before.device_bytes_in_use / 1048576.0,
      after ? absl::StrFormat("%.1f MiB", after->device_bytes_in_use / 1048576.0).c_str()
            : "unknown (the server did not answer)");
  if (absl::GetFlag(FLAGS_json)) std::cout << report.dump(1) << "\n";
  return errors == 0 && wrong == 0 && slow == 0 && after.has_value() && calls > 0;
}

// Makes `c`'s first call before the load starts, so that every connection is
// up when the workers begin and an error under load is the server's. gRPC's
// posix TCP client (1.51 here) reads connect(2)'s errno only after other calls
// that may change it (grpc/grpc#35064), so now and then it reports a
// loopback connect that is still in progress as failed ("No such file or
// directory"); that channel's first call then fails with UNAVAILABLE and the
// channel reconnects about a second later by itself. Such a failure is
// reported here and the call made again, up to 3 attempts.
absl::Status ConnectBeforeLoad(Client& c, int index) {
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<client::ServerInfo> info = c.Info();
    if (info.ok()) return absl::OkStatus();
    if (info.status().code() != absl::StatusCode::kUnavailable || attempt == kAttempts) {
      return info.status();
    }
    std::cerr << "stress: client " << index << ": connecting (attempt " << attempt << " of "
              << kAttempts << "): UNAVAILABLE: " << info.status().message()
              << "; trying again in 1.5 s\n";
    absl::SleepFor(absl::Milliseconds(1500));
  }
}

// One connection per client, each reaching the server before the load.
absl::Status Connect(int clients, const client::ClientOptions& options, const std::string& server,
                     std::vector<std::unique_ptr<Client>>* conns) {
  for (int i = 0; i < clients; ++i) {
    client::ClientOptions o = options;
    o.own_connection = true;
    LOGITD_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Create(server, std::move(o)));
    conns->push_back(std::move(c));
  }
  for (int i = 0; i < clients; ++i) {
    if (absl::Status s = ConnectBeforeLoad(*(*conns)[static_cast<std::size_t>(i)], i); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("client ", i, " cannot reach the server: ",
                                       absl::StatusCodeToString(s.code()), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// The shared weights: odd and round sizes, small and large, half of them
// integer-valued (exact results), as many as the limits allow.
absl::Status RegisterSharedWeights(Client& c, std::int64_t max_v, std::int64_t max_k,
                                   std::vector<StressWeight>* weights) {
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const std::vector<std::tuple<std::int64_t, std::int64_t, bool>> shapes = {
      {130, 257, true},    {384, 200, false},     {1000, 96, true},    {77, 333, false},
      {4097, 1000, true},  {2048, 40, false},     {32000, 4096, true}, {50257, 63, false},
      {32768, 2048, true}, {128256, 4096, false}, {7, 4097, true},     {151936, 1000, true}};
  for (const auto& [v, k, integer] : shapes) {
    if (v > max_v || k > max_k) continue;
    StressWeight w;
    w.v = v;
    w.k = k;
    w.integer = integer;
    w.w = RandomTensor(DType::kBf16, {v, k}, integer, rng);
    absl::StatusOr<client::WeightInfo> info =
        c.RegisterWeight(w.w, absl::StrCat("stress-", v, "x", k));
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat("registering [", v, ", ", k,
                                       "]: ", absl::StatusCodeToString(info.status().code()), ": ",
                                       info.status().message()));
    }
    w.handle = info->handle;
    weights->push_back(std::move(w));
  }
  return absl::OkStatus();
}

}  // namespace

int RunStress(const std::vector<std::string>& words, const client::ClientOptions& options,
              const std::string& server) {
  if (words.size() != 1) {
    std::cerr << "logitctl: stress takes no arguments, got '" << words[1]
              << "'\nrun 'logitctl help' for usage\n";
    return kExitUsage;
  }
  const int clients = absl::GetFlag(FLAGS_clients);
  const double duration = absl::GetFlag(FLAGS_duration) > 0 ? absl::GetFlag(FLAGS_duration) : 60;
  const std::int64_t max_v = absl::GetFlag(FLAGS_stress_max_v);
  const std::int64_t max_k = absl::GetFlag(FLAGS_stress_max_k);
  if (clients < 1 || clients > 1024 || absl::GetFlag(FLAGS_stress_max_m) < 1 || max_v < 1 ||
      max_k < 1) {
    std::cerr << "logitctl: stress: --clients must be in [1, 1024] and --stress_max_m, "
                 "--stress_max_v, --stress_max_k at least 1\n";
    return kExitUsage;
  }
  std::vector<std::unique_ptr<Client>> conns;
  if (absl::Status s = Connect(clients, options, server, &conns); !s.ok()) {
    std::cerr << "logitctl: stress: " << s.message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<client::ServerInfo> before = conns[0]->Info();
  if (!before.ok()) {
    std::cerr << "logitctl: stress: " << absl::StatusCodeToString(before.status().code()) << ": "
              << before.status().message() << "\n";
    return kExitUsage;
  }

  std::vector<StressWeight> weights;
  if (absl::Status s = RegisterSharedWeights(*conns[0], max_v, max_k, &weights); !s.ok()) {
    std::cerr << "logitctl: stress: " << s.message() << "\n";
    return kExitFailed;
  }
  if (weights.empty()) {
    std::cerr << "logitctl: stress: no weight fits --stress_max_v and --stress_max_k\n";
    return kExitUsage;
  }
  std::vector<std::string> handles;
  for (const auto& w : weights) handles.push_back(w.handle);
  std::cerr << "stress: " << clients << " clients, " << weights.size() << " weights, " << duration
            << " s against " << server << " (" << before->backend << ", " << before->device_name
            << ")\n";

  Stress stress(std::move(conns), std::move(weights));
  const absl::Time start = absl::Now();
  const absl::Time until = start + absl::Seconds(duration);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) threads.emplace_back([&, i] { stress.Worker(i, until); });
  for (auto& t : threads) t.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);

  absl::StatusOr<std::unique_ptr<Client>> last = Client::Create(server, options);
  std::optional<client::ServerInfo> after;
  if (last.ok()) {
    for (const std::string& h : handles) (void)(*last)->ReleaseWeight(h, /*force=*/true);
    absl::StatusOr<client::ServerInfo> info = (*last)->Info();
    if (info.ok()) after = *info;
  }

  const bool ok = PrintReport(stress.Totals(), clients, elapsed, *before, after);
  return ok ? kExitOk : kExitFailed;
}

}  // namespace logitd::logitctl
