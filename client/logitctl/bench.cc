#include "client/logitctl/bench.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/logitctl/bench_config.h"
#include "client/logitctl/bench_report.h"
#include "client/logitctl/common.h"
#include "logitd/bf16.h"
#include "logitd/status_macros.h"
#include "logitd/tensor.h"
#include "nlohmann/json.hpp"

namespace logitd::logitctl {
namespace {

using client::Client;
using client::TimingTrailer;

using Rpc = BenchRpc;
using Config = BenchConfig;

// --- inputs -----------------------------------------------------------------

std::uint64_t SplitMix64(std::uint64_t* state) {
  std::uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1) on a 2^-23 grid.
float Uniform(std::uint64_t* state) {
  const std::int64_t r = static_cast<std::int64_t>(SplitMix64(state) >> 40) - (1 << 23);
  return static_cast<float>(r) * 0x1p-23f;
}

Tensor RandomTensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed) {
  Tensor t(dtype, std::move(shape));
  std::uint64_t state = seed;
  if (dtype == DType::kBf16) {
    Bf16Bits* p = t.data<Bf16Bits>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = FloatToBf16(Uniform(&state));
  } else {
    float* p = t.data<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = Uniform(&state);
  }
  return t;
}

// One worker's request tensors, sent again with every request.
struct Inputs {
  Tensor x;
  Tensor dy;
  Tensor targets;
  // --shm: X at offset 0 of the worker's region, Y at y_offset.
  std::shared_ptr<client::SharedRegion> region;
  std::string region_handle;
  std::uint64_t y_offset = 0;
  // --shm_digest_once: X's digest, taken when X was written to the region.
  std::optional<std::uint64_t> x_xxh3;
  // The logits result (or dW), received into the same memory call after call.
  mutable Tensor y;
  // Verify: logitd's own outputs of the operation, the candidates.
  std::map<std::string, Tensor> candidates;
};

Inputs MakeInputs(const Config& c, int worker) {
  const std::uint64_t seed = c.seed + 1000003ull * static_cast<std::uint64_t>(worker + 1);
  Inputs in;
  if (c.rpc == Rpc::kBaseline || c.rpc == Rpc::kFetchGradient) return in;
  in.x = RandomTensor(DType::kBf16, {c.m, c.k}, seed);
  if (c.rpc == Rpc::kBackward) in.dy = RandomTensor(c.out_dtype, {c.m, c.v}, seed + 1);
  if (c.rpc == Rpc::kCrossEntropy || c.rpc == Rpc::kLogProbs || c.rpc == Rpc::kVerifyCrossEntropy ||
      c.rpc == Rpc::kVerifyLogProbs) {
    in.targets = Tensor(DType::kInt64, {c.m});
    std::uint64_t state = seed + 2;
    std::int64_t* t = in.targets.data<std::int64_t>();
    for (std::int64_t i = 0; i < c.m; ++i) {
      t[i] = static_cast<std::int64_t>(SplitMix64(&state) % static_cast<std::uint64_t>(c.v));
    }
  }
  return in;
}

// --- measuring ----------------------------------------------------------------

// The trailer's fields, in the order of kBenchTimingParts.
std::array<std::optional<std::int64_t>, 7> PartsOf(const TimingTrailer& t) {
  return {t.queue_us, t.receive_us, t.h2d_us, t.compute_us, t.d2h_us, t.send_us, t.total_us};
}

struct Tally {
  std::vector<double> latency_s;
  std::map<absl::StatusCode, std::int64_t> errors;
  std::map<absl::StatusCode, std::string> first_message;
  std::array<double, 7> part_sum{};
  std::array<std::int64_t, 7> part_count{};
  // total_us minus the parts, for requests whose trailer has a total.
  double unaccounted_sum = 0;
  std::int64_t unaccounted_count = 0;
  // Each timed request's latency and server split: where the slowest went.
  struct Timed {
    double seconds = 0;
    std::array<std::optional<std::int64_t>, 7> parts;
  };
  std::vector<Timed> timed;

  void Add(const absl::Status& status, double seconds, const std::optional<TimingTrailer>& t) {
    if (!status.ok()) {
      ++errors[status.code()];
      first_message.emplace(status.code(), std::string(status.message()));
      return;
    }
    latency_s.push_back(seconds);
    if (!t.has_value()) return;
    const auto parts = PartsOf(*t);
    timed.push_back({seconds, parts});
    double accounted = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].has_value()) continue;
      part_sum[i] += static_cast<double>(*parts[i]);
      ++part_count[i];
      if (i + 1 < parts.size()) accounted += static_cast<double>(*parts[i]);
    }
    // In row blocks the phases overlap: their sum says nothing of a gap.
    if (t->total_us.has_value() && !t->pipeline_rows.has_value()) {
      unaccounted_sum += static_cast<double>(*t->total_us) - accounted;
      ++unaccounted_count;
    }
  }

  void Merge(Tally&& o) {
    latency_s.insert(latency_s.end(), o.latency_s.begin(), o.latency_s.end());
    timed.insert(timed.end(), o.timed.begin(), o.timed.end());
    for (const auto& [code, n] : o.errors) errors[code] += n;
    for (auto& [code, msg] : o.first_message) first_message.emplace(code, std::move(msg));
    for (std::size_t i = 0; i < part_sum.size(); ++i) {
      part_sum[i] += o.part_sum[i];
      part_count[i] += o.part_count[i];
    }
    unaccounted_sum += o.unaccounted_sum;
    unaccounted_count += o.unaccounted_count;
  }

  std::int64_t error_count() const {
    std::int64_t n = 0;
    for (const auto& [code, count] : errors) n += count;
    return n;
  }
};

// One call of the benchmarked RPC; fills the call's trailer when it has one.
using CallFn = std::function<absl::Status(Client&, const Inputs&, std::optional<TimingTrailer>*)>;

// Logits: X and Y streamed (Y received into the worker's tensor), or both
// in the worker's shared-memory region.
CallFn LogitsCall(const Config& c, const std::string& handle) {
  return [&c, handle](Client& cl, const Inputs& in, std::optional<TimingTrailer>* trailer) {
    client::LogitsOptions options;
    options.out_dtype = c.out_dtype;
    options.pipeline = c.pipeline;
    options.connections = c.connections;
    if (c.shm) {
      client::LogitsShmArgs args;
      args.x = client::TensorInput::Shm(
          client::ShmSlot{in.region_handle, in.region.get(), 0, false, in.x_xxh3}, DType::kBf16,
          in.x.shape());
      args.y = client::TensorOutput::Shm(
          client::ShmSlot{in.region_handle, in.region.get(), in.y_offset, c.shm_skip_digest});
      absl::StatusOr<client::LogitsShmResult> r = cl.LogitsShm(args, handle, options);
      if (!r.ok()) return r.status();
      *trailer = r->timing.trailer;
      return absl::OkStatus();
    }
    client::Timing timing;
    // Each worker receives into the same tensor every call, as a caller
    // that repeats a call would: fresh pages per 128 MiB result measure
    // the kernel's page zeroing, not the service.
    if (absl::Status s = cl.LogitsInto(in.x, handle, &in.y, options, &timing); !s.ok()) {
      return s;
    }
    *trailer = timing.trailer;
    return absl::OkStatus();
  };
}

// LogProbs: X streamed or from the worker's region.
CallFn LogProbsCall(const Config& c, const std::string& handle) {
  return [&c, handle](Client& cl, const Inputs& in, std::optional<TimingTrailer>* trailer) {
    absl::StatusOr<client::LogProbsResult> r;
    if (c.shm) {
      // X from the worker's region; the targets and the per-token
      // outputs (a few bytes a token) travel in the stream.
      client::LogProbsShmArgs args;
      args.x = client::TensorInput::Shm(
          client::ShmSlot{in.region_handle, in.region.get(), 0, false, in.x_xxh3}, DType::kBf16,
          in.x.shape());
      args.targets = in.targets;
      r = cl.LogProbsShm(args, handle, c.logprobs);
    } else {
      r = cl.LogProbs(in.x, &in.targets, handle, c.logprobs);
    }
    if (!r.ok()) return r.status();
    *trailer = r->timing.trailer;
    return absl::OkStatus();
  };
}

// Verify of the worker's candidates: the server forms the references and
// logitd's own outputs and judges them.
CallFn VerifyCall(const Config& c, const std::string& handle) {
  return [&c, handle](Client& cl, const Inputs& in, std::optional<TimingTrailer>* trailer) {
    client::VerifyArgs args;
    args.operation = c.rpc == Rpc::kVerifyLogits         ? client::VerifyOperation::kLogits
                     : c.rpc == Rpc::kVerifyCrossEntropy ? client::VerifyOperation::kCrossEntropy
                                                         : client::VerifyOperation::kLogProbs;
    args.weight_handle = handle;
    args.x = in.x;
    if (c.rpc == Rpc::kVerifyCrossEntropy) {
      args.targets = in.targets;
      args.cross_entropy = c.cross_entropy;
    }
    if (c.rpc == Rpc::kVerifyLogProbs) {
      args.targets = in.targets;
      args.logprobs = c.logprobs;
    }
    for (const auto& [name, t] : in.candidates) args.candidates.emplace(name, t);
    args.sample_rows = c.sample_rows;
    absl::StatusOr<client::VerifyResult> r = cl.Verify(args);
    if (!r.ok()) return r.status();
    if (!r->passed()) {
      return absl::InternalError(absl::StrCat("verify: logitd's own output got ", r->verdict));
    }
    *trailer = r->timing.trailer;
    return absl::OkStatus();
  };
}

CallFn MakeCall(const Config& c, Rpc rpc, const std::string& handle) {
  switch (rpc) {
    case Rpc::kVerifyLogits:
    case Rpc::kVerifyCrossEntropy:
    case Rpc::kVerifyLogProbs:
      return VerifyCall(c, handle);
    case Rpc::kLogits:
      return LogitsCall(c, handle);
    case Rpc::kBackward:
      return [&c, handle](Client& cl, const Inputs& in, std::optional<TimingTrailer>* trailer) {
        absl::StatusOr<client::BackwardResult> r = cl.Backward(in.dy, in.x, handle, c.backward);
        if (!r.ok()) return r.status();
        *trailer = r->timing.trailer;
        return absl::OkStatus();
      };
    case Rpc::kCrossEntropy:
      return [&c, handle](Client& cl, const Inputs& in, std::optional<TimingTrailer>* trailer) {
        absl::StatusOr<client::CrossEntropyResult> r =
            cl.CrossEntropy(in.x, in.targets, handle, c.cross_entropy);
        if (!r.ok()) return r.status();
        *trailer = r->timing.trailer;
        return absl::OkStatus();
      };
    case Rpc::kLogProbs:
      return LogProbsCall(c, handle);
    case Rpc::kFetchGradient:
      return [handle](Client& cl, const Inputs& in, std::optional<TimingTrailer>* trailer) {
        // Into the same tensor every call, as for logits.
        absl::StatusOr<client::GradientResult> r = cl.FetchGradientInto(handle, false, &in.y);
        if (!r.ok()) return r.status();
        *trailer = r->trailer;
        return absl::OkStatus();
      };
    case Rpc::kBaseline:
      break;
  }
  // The transport floor: the same bytes each way, the server's chunk size.
  return [&c](Client& cl, const Inputs& /*in*/, std::optional<TimingTrailer>* trailer) {
    client::ProbeOptions options;
    options.request_bytes = c.up_bytes;
    options.response_bytes = c.down_bytes;
    options.chunk_bytes = 0;
    absl::StatusOr<client::ProbeResult> r = cl.Probe(options);
    if (!r.ok()) return r.status();
    *trailer = r->trailer;
    return absl::OkStatus();
  };
}

struct Phase {
  std::string name;  // "logits", "baseline", ...
  Tally tally;
  double wall_s = 0;
};

// Runs `requests` calls (or calls for `duration` when requests is 0) from
// c.concurrency workers, worker i on clients[i % clients.size()].
Phase RunPhase(const Config& c, absl::string_view name, const CallFn& call,
               const std::vector<std::unique_ptr<Client>>& clients,
               const std::vector<Inputs>& inputs, std::int64_t requests, absl::Duration duration,
               std::int64_t per_client = 0) {
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> go{false};
  std::vector<Tally> tallies(static_cast<std::size_t>(c.concurrency));
  std::vector<std::thread> workers;
  absl::Time deadline = absl::InfiniteFuture();
  for (int i = 0; i < c.concurrency; ++i) {
    workers.emplace_back([&, i] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      Client& cl = *clients[static_cast<std::size_t>(i) % clients.size()];
      const Inputs& in = inputs[static_cast<std::size_t>(i)];
      Tally& tally = tallies[static_cast<std::size_t>(i)];
      for (std::int64_t own = 0;; ++own) {
        if (per_client > 0) {
          if (own >= per_client) break;
        } else if (requests > 0) {
          if (next.fetch_add(1) >= requests) break;
        } else if (absl::Now() >= deadline) {
          break;
        }
        std::optional<TimingTrailer> trailer;
        const absl::Time t0 = absl::Now();
        const absl::Status s = call(cl, in, &trailer);
        tally.Add(s, absl::ToDoubleSeconds(absl::Now() - t0), trailer);
      }
    });
  }
  const absl::Time start = absl::Now();
  deadline = start + duration;
  go.store(true, std::memory_order_release);
  for (std::thread& t : workers) t.join();
  Phase phase;
  phase.name = std::string(name);
  phase.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  for (Tally& t : tallies) phase.tally.Merge(std::move(t));
  return phase;
}

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const std::size_t rank =
      static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size(), std::max<std::size_t>(rank, 1)) - 1];
}

// The server's split averaged over the slowest 1% of the timed requests (at
// least one), by the client's latency, with their count and latency: which
// phase a p99 spends its time in (queue, receive, compute, send).
nlohmann::json SlowestSplit(const Tally& tally) {
  if (tally.timed.empty()) return nullptr;
  std::vector<Tally::Timed> timed = tally.timed;
  const std::size_t n = std::max<std::size_t>(1, timed.size() / 100);
  std::partial_sort(
      timed.begin(), timed.begin() + static_cast<std::ptrdiff_t>(n), timed.end(),
      [](const Tally::Timed& a, const Tally::Timed& b) { return a.seconds > b.seconds; });
  nlohmann::json out = nlohmann::json::object();
  out["requests"] = n;
  double latency = 0;
  for (std::size_t r = 0; r < n; ++r) latency += timed[r].seconds;
  out["latency_ms"] = latency / static_cast<double>(n) * 1e3;
  for (std::size_t i = 0; i < kBenchTimingParts.size(); ++i) {
    double sum = 0;
    std::int64_t count = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (!timed[r].parts[i].has_value()) continue;
      sum += static_cast<double>(*timed[r].parts[i]);
      ++count;
    }
    out[absl::StrCat(kBenchTimingParts[i], "_us")] =
        count == 0 ? nlohmann::json(nullptr) : nlohmann::json(sum / static_cast<double>(count));
  }
  return out;
}

nlohmann::json Summary(const Config& c, Phase& p) {
  std::vector<double>& lat = p.tally.latency_s;
  std::sort(lat.begin(), lat.end());
  const double completed = static_cast<double>(lat.size());
  const double wall = p.wall_s > 0 ? p.wall_s : 1e-9;
  nlohmann::json j;
  j["rpc"] = p.name;
  j["requests"] = static_cast<std::int64_t>(lat.size()) + p.tally.error_count();
  j["completed"] = lat.size();
  j["error_count"] = p.tally.error_count();
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [code, n] : p.tally.errors) {
    errors[absl::StatusCodeToString(code)] = {{"count", n},
                                              {"first_message", p.tally.first_message[code]}};
  }
  j["errors"] = errors;
  j["wall_s"] = p.wall_s;
  j["requests_per_s"] = completed / wall;
  double mean = 0;
  for (double s : lat) mean += s;
  if (!lat.empty()) mean /= completed;
  j["latency_ms"] = {{"p50", Percentile(lat, 0.50) * 1e3},
                     {"p90", Percentile(lat, 0.90) * 1e3},
                     {"p99", Percentile(lat, 0.99) * 1e3},
                     {"max", lat.empty() ? 0 : lat.back() * 1e3},
                     {"mean", mean * 1e3}};
  j["request_bytes"] = c.up_bytes;
  j["response_bytes"] = c.down_bytes;
  j["up_gb_s"] = completed * static_cast<double>(c.up_bytes) / wall / 1e9;
  j["down_gb_s"] = completed * static_cast<double>(c.down_bytes) / wall / 1e9;
  j["total_gb_s"] = completed * static_cast<double>(c.up_bytes + c.down_bytes) / wall / 1e9;
  nlohmann::json server = nlohmann::json::object();
  for (std::size_t i = 0; i < kBenchTimingParts.size(); ++i) {
    const std::string key = absl::StrCat(kBenchTimingParts[i], "_us");
    if (p.tally.part_count[i] == 0) {
      server[key] = nullptr;  // not measured by this server for this call
    } else {
      server[key] = p.tally.part_sum[i] / static_cast<double>(p.tally.part_count[i]);
    }
  }
  server["unaccounted_us"] = p.tally.unaccounted_count == 0
                                 ? nlohmann::json(nullptr)
                                 : nlohmann::json(p.tally.unaccounted_sum /
                                                  static_cast<double>(p.tally.unaccounted_count));
  j["server_avg"] = server;
  j["server_slowest"] = SlowestSplit(p.tally);
  return j;
}

// The report --json prints and PrintBenchText renders.
nlohmann::json MakeReport(const Config& c, const client::ClientOptions& options,
                          const std::string& server, const client::ServerInfo& info,
                          const nlohmann::json& phases) {
  nlohmann::json report;
  report["config"] = {{"rpc", std::string(RpcName(c.rpc))},
                      {"m", c.m},
                      {"k", c.k},
                      {"v", c.v},
                      {"out_dtype", c.out_dtype == DType::kFp32 ? "fp32" : "bf16"},
                      {"pipeline", c.pipeline},
                      {"connections", c.connections},
                      {"concurrency", c.concurrency},
                      {"channels", c.channels},
                      {"requests", c.requests},
                      {"duration_s", c.requests > 0 ? 0.0 : absl::ToDoubleSeconds(c.duration)},
                      {"warmup", c.warmup},
                      {"seed", c.seed},
                      {"shm", c.shm},
                      {"shm_skip_digest", c.shm_skip_digest},
                      {"shm_digest_once", c.shm_digest_once},
                      {"sample_rows", c.sample_rows},
                      {"request_bytes", c.up_bytes},
                      {"response_bytes", c.down_bytes},
                      {"client_chunk_bytes", options.chunk_bytes},
                      {"server", server}};
  report["server_info"] = {{"version", info.version},
                           {"build_id", info.build_id},
                           {"backend", info.backend},
                           {"device_name", info.device_name},
                           {"blas_version", info.blas_version},
                           {"chunk_bytes", info.chunk_bytes},
                           {"max_request_bytes", info.max_request_bytes}};
  report["phases"] = phases;
  report["efficiency"] = nullptr;
  report["verify_cost"] = nullptr;
  if (IsVerify(c.rpc)) {
    // A verify's median latency over its operation's, same inputs, same run.
    if (phases.size() == 2 && phases[1]["latency_ms"]["p50"].get<double>() > 0) {
      report["verify_cost"] = phases[0]["latency_ms"]["p50"].get<double>() /
                              phases[1]["latency_ms"]["p50"].get<double>();
    }
    return report;
  }
  if (phases.size() == 2 && phases[1]["total_gb_s"].get<double>() > 0) {
    report["efficiency"] =
        phases[0]["total_gb_s"].get<double>() / phases[1]["total_gb_s"].get<double>();
  }
  return report;
}

// Verify's candidates: logitd's own outputs of the worker's inputs.
absl::Status OwnOutputs(const Config& c, Client& cl, const std::string& handle, Inputs* in) {
  if (c.rpc == Rpc::kVerifyLogits) {
    client::LogitsOptions options;
    options.out_dtype = c.out_dtype;
    LOGITD_ASSIGN_OR_RETURN(Tensor y, cl.Logits(in->x, handle, options));
    in->candidates.emplace("y", std::move(y));
    return absl::OkStatus();
  }
  if (c.rpc == Rpc::kVerifyLogProbs) {
    LOGITD_ASSIGN_OR_RETURN(client::LogProbsResult r,
                            cl.LogProbs(in->x, &in->targets, handle, c.logprobs));
    if (r.logprob.has_value()) in->candidates.emplace("logprob", *std::move(r.logprob));
    if (r.lse.has_value()) in->candidates.emplace("lse", *std::move(r.lse));
    if (r.entropy.has_value()) in->candidates.emplace("entropy", *std::move(r.entropy));
    return absl::OkStatus();
  }
  LOGITD_ASSIGN_OR_RETURN(client::CrossEntropyResult r,
                          cl.CrossEntropy(in->x, in->targets, handle, c.cross_entropy));
  in->candidates.emplace("loss", std::move(r.loss));
  if (r.lse.has_value()) in->candidates.emplace("lse", *std::move(r.lse));
  return absl::OkStatus();
}

// The server's side of the benchmark: a random weight registered (and,
// for fetch-gradient, one accumulated dW), each worker's inputs, and with
// --shm a region per worker with X written into it once. *what names the
// step that failed.
absl::Status Prepare(const Config& c, Client& cl, std::string* handle, std::vector<Inputs>* inputs,
                     std::string* what) {
  if (c.rpc != Rpc::kBaseline) {
    std::cerr << "logitctl: bench: registering a random bf16 weight [" << c.v << ", " << c.k
              << "] (seed " << c.seed << ")\n";
    const Tensor w = RandomTensor(DType::kBf16, {c.v, c.k}, c.seed);
    *what = "register weight";
    LOGITD_ASSIGN_OR_RETURN(const client::WeightInfo reg, cl.RegisterWeight(w, "logitctl-bench"));
    *handle = reg.handle;
  }
  if (c.rpc == Rpc::kFetchGradient) {
    // One accumulating call gives the weight a gradient buffer of random
    // values, as training would, rather than one never written.
    std::cerr << "logitctl: bench: accumulating one dW of M=" << c.m << " rows\n";
    client::BackwardOptions accumulate;
    accumulate.want_dx = false;
    accumulate.accumulate_dw = true;
    *what = "accumulating a gradient";
    LOGITD_RETURN_IF_ERROR(cl.Backward(RandomTensor(DType::kFp32, {c.m, c.v}, c.seed + 1),
                                       RandomTensor(DType::kBf16, {c.m, c.k}, c.seed + 2), *handle,
                                       accumulate)
                               .status());
  }
  for (int i = 0; i < c.concurrency; ++i) inputs->push_back(MakeInputs(c, i));
  if (IsVerify(c.rpc)) {
    *what = "logitd's own outputs, the candidates";
    for (Inputs& in : *inputs) LOGITD_RETURN_IF_ERROR(OwnOutputs(c, cl, *handle, &in));
  }
  if (!c.shm) return absl::OkStatus();
  // One region per worker, X written into it once, registered once.
  for (Inputs& in : *inputs) {
    in.y_offset = (in.x.nbytes() + 63) / 64 * 64;
    const std::uint64_t y_bytes = c.rpc == Rpc::kLogits ? c.down_bytes : 0;
    *what = "shared-memory region";
    LOGITD_ASSIGN_OR_RETURN(client::SharedRegion region,
                            client::SharedRegion::Create(in.y_offset + y_bytes));
    in.region = std::make_shared<client::SharedRegion>(std::move(region));
    std::copy_n(in.x.bytes(), in.x.nbytes(), in.region->data());
    if (c.shm_digest_once) in.x_xxh3 = in.x.Digest();
    *what = "register shared memory";
    LOGITD_ASSIGN_OR_RETURN(in.region_handle, cl.RegisterShm(*in.region));
  }
  return absl::OkStatus();
}

// What Prepare registered, released (a failure is reported, not fatal).
void Release(Client& cl, const std::string& handle, const std::vector<Inputs>& inputs) {
  for (const Inputs& in : inputs) {
    if (in.region_handle.empty()) continue;
    if (absl::Status s = cl.ReleaseShm(in.region_handle); !s.ok()) {
      std::cerr << "logitctl: bench: releasing shared memory: " << s.message() << "\n";
    }
  }
  if (!handle.empty()) {
    if (absl::StatusOr<std::uint64_t> r = cl.ReleaseWeight(handle); !r.ok()) {
      std::cerr << "logitctl: bench: releasing the weight: " << r.status().message() << "\n";
    }
  }
}

// The phases a run measures, in order: the RPC, then the operation a
// verify is measured against or the Probe baseline of the same bytes; and
// the configuration of the last one (its bytes, and a verify's outputs).
absl::Status PhasesOf(const Config& c, std::vector<Rpc>* phases, Config* operation) {
  std::vector<Rpc>& rpcs = *phases;
  rpcs = {c.rpc};
  if (c.rpc == Rpc::kVerifyLogits) {
    rpcs.push_back(Rpc::kLogits);  // what a verify costs against the call itself
  } else if (c.rpc == Rpc::kVerifyCrossEntropy) {
    rpcs.push_back(Rpc::kCrossEntropy);
  } else if (c.rpc == Rpc::kVerifyLogProbs) {
    rpcs.push_back(Rpc::kLogProbs);
  } else if (c.rpc != Rpc::kBaseline && c.baseline) {
    rpcs.push_back(Rpc::kBaseline);
  }
  // The operation's own phase of a verify bench counts the operation's bytes.
  Config& op = *operation;
  op = c;
  op.rpc = rpcs.back();
  LOGITD_RETURN_IF_ERROR(ReadRpcOptions(&op));
  op.cross_entropy.want_lse = c.cross_entropy.want_lse;
  if (c.rpc == Rpc::kVerifyCrossEntropy) {
    // The same outputs as the candidates: the loss and lse.
    op.down_bytes += static_cast<std::uint64_t>(c.m) * 4;
  }
  if (c.rpc == Rpc::kVerifyLogProbs) {
    // The same outputs as the candidates: log-prob, lse and entropy.
    op.logprobs = c.logprobs;
    op.down_bytes = static_cast<std::uint64_t>(c.m) * 4 * 3;
  }
  return absl::OkStatus();
}

}  // namespace

int RunBench(const std::vector<std::string>& words, const client::ClientOptions& options,
             const std::string& server) {
  if (words.size() != 1) {
    std::cerr << "logitctl: bench takes no arguments, got '" << words[1]
              << "'\nrun 'logitctl help' for usage\n";
    return kExitUsage;
  }
  absl::StatusOr<Config> config = ReadConfig();
  if (!config.ok()) {
    std::cerr << "logitctl: bench: " << config.status().message()
              << "\nrun 'logitctl help' for usage\n";
    return kExitUsage;
  }
  const Config& c = *config;

  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < c.channels; ++i) {
    client::ClientOptions o = options;
    o.own_connection = c.channels > 1;
    absl::StatusOr<std::unique_ptr<Client>> cl = Client::Create(server, std::move(o));
    if (!cl.ok()) {
      std::cerr << "logitctl: bench: " << cl.status().message() << "\n";
      return kExitUsage;
    }
    clients.push_back(*std::move(cl));
  }
  auto server_error = [](absl::string_view what, const absl::Status& s) {
    std::cerr << "logitctl: bench: " << what << ": " << absl::StatusCodeToString(s.code()) << ": "
              << s.message() << "\n";
    return exit_codes::ForStatus(s);
  };
  absl::StatusOr<client::ServerInfo> info = clients[0]->Info();
  if (!info.ok()) return server_error("server info", info.status());

  std::string handle;
  std::vector<Inputs> inputs;
  std::string what;
  if (absl::Status s = Prepare(c, *clients[0], &handle, &inputs, &what); !s.ok()) {
    return server_error(what, s);
  }

  std::vector<Rpc> rpcs;
  Config op;
  if (absl::Status st = PhasesOf(c, &rpcs, &op); !st.ok()) return server_error("options", st);
  nlohmann::json phases = nlohmann::json::array();
  std::int64_t errors = 0;
  for (Rpc rpc : rpcs) {
    const Config& pc = rpc == c.rpc ? c : op;
    const CallFn call = MakeCall(pc, rpc, handle);
    if (c.warmup > 0) {
      // Every client warms up, so that no measured call is the first on its
      // channel (connection, flow-control windows) or on a server context.
      std::cerr << "logitctl: bench: " << RpcName(rpc) << ": warm-up, " << c.warmup
                << " requests per client\n";
      RunPhase(c, RpcName(rpc), call, clients, inputs, 0, absl::ZeroDuration(), c.warmup);
    }
    std::cerr << "logitctl: bench: " << RpcName(rpc) << ": measuring\n";
    Phase p = RunPhase(c, RpcName(rpc), call, clients, inputs, c.requests, c.duration);
    errors += p.tally.error_count();
    // Whatever the report's form, the statuses that make the exit 1 are said
    // on stderr too, each code with its count and first message.
    for (const auto& [code, count] : p.tally.errors) {
      std::cerr << "logitctl: bench: " << RpcName(rpc) << ": " << count << " request"
                << (count == 1 ? "" : "s") << " failed with " << absl::StatusCodeToString(code)
                << ": " << p.tally.first_message[code] << "\n";
    }
    phases.push_back(Summary(pc, p));
  }
  Release(*clients[0], handle, inputs);

  const nlohmann::json report = MakeReport(c, options, server, *info, phases);
  if (c.json) {
    std::cout << report.dump(2) << "\n";
  } else {
    PrintBenchText(report);
  }
  return errors == 0 ? kExitOk : kExitFailed;
}

}  // namespace logitd::logitctl
