#!/usr/bin/env bash
# One full round on a GPU machine: configure and build (system packages, or
# the dependency prefix carried in deps/deps.tar.xz), run the GPU tests, run
# `logitctl validate` against `logitd --backend=cuda` on a loopback port, run
# the kernel benchmark and the PyTorch baseline, and print a summary last.
#
#   usage: scripts/gpu-check.sh [OUT_DIR] [STEP...]   (OUT_DIR default: out/gpu-check)
#          scripts/gpu-check.sh --help                (the steps)
#
# With no STEP every step runs. With some (scripts/gpu-check.sh OUT stress
# golden), only those run, after the same setup and build, in the order below
# whatever the order given; "bench" stands for gemm torch ce lp cutlass. The
# first argument is OUT_DIR unless it names a step, so `scripts/gpu-check.sh
# stress` writes to out/gpu-check (a directory named like a step: ./stress); a
# relative OUT_DIR is taken from the repository root. GPU_CHECK_SKIP applies
# to a named step too, and so does each "not when ... is skipped" below. The
# summary has the same lines either way, for the steps that ran.
#
# Steps, one file each in scripts/gpu-check/steps/ (what they share, the setup
# and the servers they start, is in scripts/gpu-check/lib.sh):
#   sweep     every GEMM configuration the tuner may pick (logitd_gemm_sweep)
#   tests     the GPU tests (ctest)
#   sanitize  compute-sanitizer over the GPU tests' kernels
#   golden    golden baselines across server restarts
#   stress    logitctl stress; then under memcheck, noted stress-san (not when sanitize is skipped)
#   validate  logitctl validate and its report page, noted report
#   compare   the cpu backend against the cuda backend (not when validate is skipped)
#   verify    PyTorch's fp32-out, fp32, TF32 and bf16 logits and its gradients judged by Verify
#   rpc       logitctl bench at the RPC level and the metrics endpoint; rpc_targets.txt reads
#             issue 32's targets off its rows (scripts/gpu-check/rpc_targets.py)
#   oip       perf_analyzer over the Open Inference Protocol (not when rpc is skipped)
#   chunks    the M=1024 logits call at several --chunk_bytes (not when rpc is skipped)
#   veth      one client's streams on loopback and across a veth pair (scripts/veth-bench.sh;
#             root only; not when rpc is skipped)
#   example   the Python client's examples
#   gemm      logitd_kernel_bench, noted bench
#   torch     bench/torch_baseline.py (not when gemm is skipped)
#   ce        bench/ce_bench.py       lp  bench/logprobs_bench.py
#   cutlass   the CUTLASS probes against cuBLASLt
# (not when bench is skipped: gemm, torch, ce, lp, cutlass)
#
# Environment:
#   GPU_CHECK_BUILD    build directory (default /tmp/logitd-gpu-build)
#   GPU_CHECK_TARGETS  space-separated targets to build (default: everything)
#   GPU_CHECK_SKIP     any of: sweep tests sanitize golden stress validate compare verify rpc oip chunks veth example
#                      bench torch gemm ce lp cutlass
#                      ("bench" skips every benchmark, "gemm" the GEMM ones, "ce" the
#                      cross-entropy one, "lp" the LogProbs one, "cutlass" the CUTLASS probes)
#   GPU_CHECK_CTEST    ctest arguments choosing the tests (default: --preset gpu, the tests
#                      labelled gpu; see CMakePresets.json)
#   SWEEP_SECONDS      time budget of the sweep (default 120)
#   SWEEP_TOKENS       the sweep's token counts M (default 1,4,5,8,300,1729)
#   SWEEP_SETS         the sweep's candidate sets (default offered,forced,tuner)
#   GPU_CHECK_WHEELS   a directory of wheels for what the example's python lacks
#                      (xxhash, ml_dtypes, grpcio-tools)
#   VALIDATE_TIMEOUT   seconds allowed for `logitctl validate` (default 300; a device
#                      call is limited to 600 s in all)
#   BENCH_SHAPES       seed | train | all (default all)
#   BENCH_REPS         samples per variant (default 30)
#   CE_BENCH           1 (default) runs bench/ce_bench.py, the fused cross-entropy
#                      against eager PyTorch; 0 skips it
#   CE_BENCH_SHAPES    MxKxV[,MxKxV...] (default 4096x4096x128256,8192x2304x256000)
#   CE_BENCH_REPS      timed calls per variant (default 10)
#   CE_BENCH_COMPILE   1 adds torch.compile of the same (compiling takes minutes)
#   CE_BENCH_TOKEN_CHUNKS  N[,N...]: also time the token walk at these chunk sizes
#   CE_BENCH_TIMEOUT   seconds allowed for it (default 240; 600 with CE_BENCH_COMPILE=1)
#   LP_BENCH_SHAPES    MxKxV[,...] for bench/logprobs_bench.py (default: its own)
#   LP_BENCH_REPS      timed calls per variant (default 10); LP_BENCH_COMPILE=1 adds
#                      torch.compile; LP_BENCH_TIMEOUT seconds (default 300)
#   RPC_BENCH_REQUESTS requests per M=1024 logitctl bench run (default 30)
#   RPC_BENCH_TIMEOUT  seconds allowed per logitctl bench run (default 120)
#   RPC_BENCH_SET      all (default) | logprobs: the rpc step's LogProbs rows alone | c16: the
#                      16-client M=1024 Logits rows (row blocks, whole) and the Probe, then the
#                      one-client M=8192 ones, each with its CPU time, RPC_BENCH_ROUNDS times (3) |
#                      in_place: the rows of the server that reads shared-memory inputs in place
#   COMPARE_ARGS       validate arguments of the compare step (default --quick; the cpu
#                      side of the full suites takes minutes); COMPARE_TIMEOUT (default 300)
#   PERF_ANALYZER      Triton's perf_analyzer, for the oip step (skipped without it)
#   CE_BENCH_ARGS      more bench/ce_bench.py arguments (e.g. --no-vocab-walk)
#   GPU_CHECK_CUTLASS_DIR  CUTLASS headers for the cutlass step (default: unpacked from
#                      deps/nvidia_cutlass-*.whl by scripts/fetch-cutlass.sh; skipped without either)
#   CUTLASS_PROBE_RUNS op:MxNxK ... (op: logits, dx, dw; default: the token walk's products
#                      at 4096x4096x128256 and 8192x2304x256000); CUTLASS_PROBE_ARGS more
#                      arguments (--exact, --stream-k); CUTLASS_PROBE_TIMEOUT s per run (90)
#   VETH_TIMEOUT       seconds allowed for the veth step (default 400); VETH_M, VETH_K, VETH_V,
#                      VETH_REQUESTS as scripts/veth-bench.sh
#   VERIFY_SHAPES      MxKxV[,...] of the verify step (default 64x4096x32768,256x8192x65536,64x4096x1024);
#                      VERIFY_TIMEOUT seconds allowed for it (default 400); VERIFY_TORCH=0 skips
#                      PyTorch's candidates, PROBE=0 the accumulation probe
#   VERIFY_COST_SHAPE, VERIFY_COST_RUNS, VERIFY_COST_BASELINE, VERIFY_COST_REQUESTS  the
#                      verify step's cost runs (scripts/gpu-check/steps/verify.sh)
#   SANITIZE_TIMEOUT   seconds allowed per compute-sanitizer run (default 240)
#   GOLDEN_RESTARTS    server restarts compared against a golden baseline (default 5), with the
#                      algorithm cache file kept and again without one
#   STRESS_SECONDS     length of the 16-client stress run (default 300)
#   STRESS_SANITIZER_SECONDS  length of its subset under compute-sanitizer memcheck (default 60)
# Writes to OUT_DIR: build.log sweep.log tests.log sanitize.log golden.log stress.log
# stress.txt (table and JSON) stress_sanitizer.log validate.log example.log validate.json
# report/ (validate --report) report_check.log compare.log compare.json compare/ (cuda against cpu)
# rl_logprob.txt rl_logprob.json rl_logprob.png (with matplotlib)
# rpc.log rpc_*.json rpc_server.log rpc_util_*.txt rpc_metrics.txt bench_logitd.json
# bench_torch.json bench.log bench_ce.json bench_ce.md bench_ce.log cutlass.log cutlass.txt summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD

# The order of a full round. A step may use what an earlier one left: the
# benchmarks run with the example's PYTHONPATH.
all_steps=(sweep tests sanitize golden stress validate compare verify rpc oip chunks veth example
           gemm torch ce lp cutlass)
bench_steps="gemm torch ce lp cutlass"

usage() {
  echo "usage: scripts/gpu-check.sh [OUT_DIR] [STEP...]   (OUT_DIR default: out/gpu-check)"
  echo "steps: ${all_steps[*]} (bench: $bench_steps)"
}
is_step() { [[ " ${all_steps[*]} bench " == *" $1 "* ]]; }

out_arg=""
if [ $# -gt 0 ] && ! is_step "$1" && [[ "$1" != -* ]]; then out_arg=$1; shift; fi
only=""
for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    bench) only+=" $bench_steps" ;;
    *) if is_step "$arg"; then only+=" $arg"
       else echo "gpu-check: no step '$arg'" >&2; usage >&2; exit 2; fi ;;
  esac
done

out=${out_arg:-$root/out/gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# shellcheck source-path=SCRIPTDIR source=gpu-check/lib.sh
source "$root/scripts/gpu-check/lib.sh"
for step in "${all_steps[@]}"; do
  # shellcheck source=/dev/null
  source "$root/scripts/gpu-check/steps/$step.sh"
done

setup_deps
setup_build
for step in "${all_steps[@]}"; do
  if selected "$step"; then "step_$step"; fi
done

write_summary
grep -q " FAIL " "$out/summary.txt" && exit 1
exit 0
