// logitctl: the command-line client of a logitd server. Reads and writes
// safetensors files, streams them through logitd::client::Client, and hands
// `logitctl validate` to the validation harness.
//
// Exit codes: 0 success; 1 the server answered with an error status; 2 a usage
// or local input error, or the server could not be reached.
//
// This file holds the usage text and the dispatch. The commands are in one
// file per group (commands.h), what they share in common.h, the flags in
// flags.cc and the reading of argv in command_line.cc.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/logitctl/bench.h"
#include "client/logitctl/command_line.h"
#include "client/logitctl/commands.h"
#include "client/logitctl/common.h"
#include "client/logitctl/flags.h"
#include "client/logitctl/stress.h"
#include "logitd/client.h"
#include "logitd/reference/blas_kernels.h"
#ifdef LOGITCTL_HAVE_VALIDATE
#include "client/validate/cli.h"
#endif

namespace logitd::logitctl {
namespace {

constexpr char kUsage[] =
    R"(logitctl: command-line client of a logitd server

usage: logitctl [common flags] COMMAND [args] [flags]

commands:
  info [--json]                      server backend, device, versions and limits
  weights register FILE --tensor=NAME [--name=NAME]
                                     upload a [V, K] weight (fp32 is rounded to bf16)
  weights load PATH --tensor=NAME [--name=NAME]
                                     the server reads a [V, K] weight from PATH, relative
                                     to its --weights_dir (fp32/fp16 rounded to bf16)
  weights list                       weights the server holds
  weights release HANDLE [--force]   release one registration; the weight and its
                                     gradient buffer go with the last
  logits --x=FILE[:TENSOR] --weight=HANDLE --out=FILE [--out_dtype=fp32|bf16] [--alpha=1]
         [--shm] [--nopipeline] [--connections=1]
                                     Y = alpha * X.W^T, written as tensor "logits";
                                     --shm: X and Y through shared memory (server
                                     --allow_shm, same host and user); --nopipeline:
                                     the call run whole, not in row blocks (same bits);
                                     --connections=N: spread over N connections (same bits)
  backward --dy=FILE[:TENSOR] --x=FILE[:TENSOR] --weight=HANDLE --out=FILE
           [--dx_dtype=bf16|fp32] [--dw_dtype=fp32|bf16] [--no_dx] [--no_dw] [--accumulate]
                                     dX = bf16(dY).W and dW = bf16(dY)^T.X, tensors "dx", "dw"
  grad fetch HANDLE --out=FILE [--zero]
                                     the accumulated fp32 dW, written as tensor "dw"
  grad zero HANDLE                   zero the accumulated dW
  cast --in=FILE[:TENSOR] --out=FILE [--shm]
                                     the server's fp32 -> bf16 cast (round to nearest even);
                                     --shm: through shared memory
  cross-entropy --x=FILE[:TENSOR] --targets=FILE[:TENSOR] --weight=HANDLE --out=FILE
           [--reduction=mean|sum|none] [--ignore_index=-100] [--z_loss=0] [--logit_softcap=0]
           [--grad_scale=1] [--lse] [--dx] [--dw] [--dx_dtype=bf16|fp32] [--accumulate] [--shm]
           [--nopipeline]
                                     fused loss of the logits X.W^T against int32/int64
                                     targets, without the [M, V] logits; tensors "loss"
                                     ([M] for none, else [1]), "lse", "dx", "dw";
                                     --shm: every tensor through shared memory;
                                     --nopipeline: the call run whole (same bits)
  logprobs --x=FILE[:TENSOR] --weight=HANDLE --out=FILE [--targets=FILE[:TENSOR]]
           [--top_k=0] [--temperature=1] [--logit_softcap=0] [--entropy] [--lse] [--rank]
           [--vocab_size=0] [--ignore_index=-100] [--nopipeline] [--connections=1]
                                     per-token log-probs of the fp32 logits without the
                                     [M, V] logits: tensors "logprob" (with --targets),
                                     "lse", "entropy", "topk_ids", "topk_logprobs", "rank";
                                     --nopipeline: the call run whole (same bits);
                                     --connections=N: spread over N connections (same bits)
  stress [--clients=16] [--duration=SECONDS (default 60)] [--stress_max_m=4096]
         [--stress_max_v=128256] [--stress_max_k=4096] [--stress_max_output_bytes=1073741824]
         [--stress_slow_call=120] [--seed=1234] [--json]
                                     correctness soak: every tensor RPC from --clients
                                     connections with random and odd shapes, every result
                                     checked (exact on integer inputs, else inside the fp32
                                     bound); reports calls, errors, wrong results, hung calls
                                     and device memory before/after; exit 1 on any of them
  bench [--rpc=logits|backward|cross-entropy|logprobs|fetch-gradient|baseline|
               verify-logits|verify-cross-entropy|verify-logprobs]
        [--m=16 --k=4096 --v=32768] [--out_dtype=fp32|bf16] [--concurrency=1] [--channels=1]
        [--requests=N | --duration=SECONDS (default 10)] [--warmup=1] [--nobaseline]
        [--seed=1234] [--json] [--shm] [--nopipeline] [--connections=1]
                                     load test: registers a random bf16 weight, runs the
                                     RPC from --concurrency threads and reports requests/s,
                                     latency p50/p90/p99/max, payload GB/s each way, errors
                                     by status code and the server's time split; then the
                                     same bytes over the Probe RPC (plain gRPC) and the
                                     efficiency ratio. backward takes --no_dx --no_dw
                                     --accumulate, cross-entropy --dx --dw --accumulate
                                     --reduction (also verify-cross-entropy),
                                     logprobs --top_k --entropy --lse --rank --temperature;
                                     fetch-gradient reads the fp32 dW [V, K] back;
                                     baseline alone moves the bytes of the logits call;
                                     --shm (logits, logprobs): X, and the logits, through
                                     shared memory (server --allow_shm); verify-* verifies
                                     logitd's own outputs (--sample_rows=N: rows checked)
                                     against the operation's own call: the verify cost
                                     (verify-logprobs: log-prob, lse and entropy, with
                                     --temperature)
  verify --op=logits|backward|cross-entropy|logprobs --x=FILE[:TENSOR]
         (--weight=HANDLE | --w=FILE[:TENSOR]) [--dy=FILE[:TENSOR]] [--targets=FILE[:TENSOR]]
         --candidate=[NAME=]FILE[:TENSOR] [--candidate=...] [--alpha=1]
         [--reduction=mean|sum|none] [--temperature=1] [--sample_rows=0 [--sample_seed=0]]
         [--json=FILE] [--junit=FILE] [--report=DIR]
         [--project=P --case=C [--branch=B] [--ref=R]]
                                     another implementation's outputs (y; dx, dw; loss, lse,
                                     dx, dw; logprob, lse, entropy, topk_ids, topk_logprobs,
                                     rank) judged against the contract: every element
                                     against its fp64 reference and proven bound, its
                                     errors against fp32 accumulation's (the precision
                                     class), and against logitd's own output; exit 1 when
                                     one fails (outside_bounds or outside_precision_class),
                                     2 for a usage or input error, the server's refusal of
                                     a shape among them (logitctl verify --help);
                                     --project: recorded in the server's history
  runs [--project=P] [--case=C] [--branch=B] [--limit=20] [--before=RUN] [--json]
       [--backend=cpu|cuda] [--device=D] [--since=TIME] [--until=TIME]
                                     the runs the server recorded for this caller
                                     (verify --project=P --case=C, validate --project=P),
                                     newest first: their labels, verdicts and candidates'
                                     verdicts; TIME in RFC 3339 (2026-12-01T00:00:00Z)
  history ...                        the same as runs ...
  runs projects                      this caller's projects: cases, runs, alerts, latest (--json)
  runs cases --project=P             the project's cases: runs, alerts, the latest run (--json)
  runs show RUN                      one recorded run: labels, platform, candidates' figures,
                                     the run it was compared with, alerts (--json)
  runs promote RUN NAME              name a recorded run a baseline of its project and case
                                     (verify --compare_baseline=NAME; never pruned)
  runs delete-project PROJECT        remove the project from the history: its runs,
                                     baselines and rules
  rules --project=P                  the project's rules, a line each
  rules set --project=P [RULE ...]   replace them (none: no rules). RULE: CHECK[=LIMIT]
                                     [case=C] [branch=B] [candidate=Y], one argument, CHECK
                                     bits_unchanged, max_worst_fraction_growth=F (F >= 1) or
                                     max_p99_ulp=N; a recorded run that breaks one is an
                                     alert (logitctl verify exits 1)
  validate [args]                    the validation harness
  help                               this text

common flags:
  --server=HOST:PORT (default 127.0.0.1:50051)  --timeout=SECONDS (default 600, 0 = none)
  --chunk_bytes=N (default 4190208: 4 MiB less 4 KiB)
  --token=TOKEN | --token_file=FILE  bearer token (default: $LOGITD_TOKEN)
  --ca=PEM [--cert=PEM --key=PEM]    TLS (mutual with --cert and --key)
  --lb=pick_first|round_robin        load balancing over the addresses of --server

FILE[:TENSOR] names a tensor in a safetensors file; the tensor may be left out
when the file holds exactly one.

exit codes (every command): 0 ok; 1 a check failed, or the server failed the
            operation (INTERNAL, DATA_LOSS, a deadline); 2 a usage or input
            error: the command line, a file, what the server refuses of what
            was sent (INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE,
            FAILED_PRECONDITION, RESOURCE_EXHAUSTED), or a server that cannot
            be reached or refuses the credentials
)";

int CmdBench(const std::vector<std::string>& words) {
  absl::StatusOr<client::ClientOptions> options = ConnectionOptions();
  if (!options.ok()) return InputError(options.status());
  return RunBench(words, *options, absl::GetFlag(FLAGS_server));
}

int CmdStress(const std::vector<std::string>& words) {
  absl::StatusOr<client::ClientOptions> options = ConnectionOptions();
  if (!options.ok()) return InputError(options.status());
  return RunStress(words, *options, absl::GetFlag(FLAGS_server));
}

int CmdValidate(const std::vector<std::string>& args) {
#ifdef LOGITCTL_HAVE_VALIDATE
  return validate::RunValidateCommand(absl::GetFlag(FLAGS_server), args);
#else
  std::cerr << "logitctl: validate: this logitctl was built without the validation harness "
               "(target logitd_validate)\n";
  return kExitUsage;
#endif
}

int CmdVerify(const std::vector<std::string>& args) {
#ifdef LOGITCTL_HAVE_VALIDATE
  return validate::RunVerifyCommand(absl::GetFlag(FLAGS_server), args);
#else
  std::cerr << "logitctl: verify: this logitctl was built without the validation harness "
               "(target logitd_validate)\n";
  return kExitUsage;
#endif
}

int Main(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  absl::StatusOr<CommandLine> cl = ParseCommandLine(args);
  if (!cl.ok()) return UsageError(cl.status().message());
  if (cl->help) {
    std::cout << kUsage;
    return kExitOk;
  }
  const std::vector<std::string>& w = cl->words;
  if (w.empty()) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string& cmd = w[0];
  if (cmd == "help") {
    std::cout << kUsage;
    return kExitOk;
  }
  if (cmd == "validate") return CmdValidate(cl->validate_args);
  if (cmd == "verify") return CmdVerify(cl->validate_args);
  if (cmd == "info") return CmdInfo(w);
  if (cmd == "weights") {
    const std::string sub = w.size() > 1 ? w[1] : "";
    if (sub == "register") return CmdWeightsRegister(w);
    if (sub == "load") return CmdWeightsLoad(w);
    if (sub == "list") return CmdWeightsList(w);
    if (sub == "release") return CmdWeightsRelease(w);
    return UsageError("usage: weights register|load|list|release ...");
  }
  if (cmd == "logits") return CmdLogits(w);
  if (cmd == "backward") return CmdBackward(w);
  if (cmd == "grad") return CmdGrad(w);
  if (cmd == "cast") return CmdCast(w);
  if (cmd == "cross-entropy") return CmdCrossEntropy(w);
  if (cmd == "logprobs") return CmdLogProbs(w);
  if (cmd == "bench") return CmdBench(w);
  if (cmd == "stress") return CmdStress(w);
  if (cmd == "runs" || cmd == "history") return CmdRuns(w);
  if (cmd == "rules") return CmdRules(w);
  return UsageError(absl::StrCat("unknown command '", cmd, "'"));
}

}  // namespace
}  // namespace logitd::logitctl

int main(int argc, char** argv) {
  // validate and verify form fp64 references with OpenBLAS: with the
  // kernels this CPU runs (it may execute logitctl again to get them).
  (void)logitd::UseBestBlasKernels(argv);
  return logitd::logitctl::Main(argc, argv);
}
