#!/usr/bin/env bash
# One full round on a GPU machine: configure and build (system packages, or
# the dependency prefix carried in deps/deps.tar.xz), run the GPU tests, run
# `logitctl validate` against `logitd --backend=cuda` on a loopback port, run
# the kernel benchmark and the PyTorch baseline, and print a summary last.
#
#   usage: scripts/gpu-check.sh [OUT_DIR]        (default: out/gpu-check)
#
# Environment:
#   GPU_CHECK_BUILD    build directory (default /tmp/logitd-gpu-build)
#   GPU_CHECK_TARGETS  space-separated targets to build (default: everything)
#   GPU_CHECK_SKIP     any of: sweep tests sanitize golden stress validate compare rpc oip chunks example
#                      bench torch gemm ce lp cutlass
#                      ("bench" skips every benchmark, "gemm" the GEMM ones, "ce" the
#                      cross-entropy one, "lp" the LogProbs one, "cutlass" the CUTLASS probes)
#   GPU_CHECK_CTEST    ctest arguments choosing the tests (default: --preset gpu, the tests
#                      labelled gpu; see CMakePresets.json)
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
#   RPC_BENCH_SET      all (default) | logprobs: the rpc step's LogProbs rows alone
#   COMPARE_ARGS       validate arguments of the compare step (default --quick; the cpu
#                      side of the full suites takes minutes); COMPARE_TIMEOUT (default 300)
#   PERF_ANALYZER      Triton's perf_analyzer, for the oip step (skipped without it)
#   CE_BENCH_ARGS      more bench/ce_bench.py arguments (e.g. --no-vocab-walk)
#   GPU_CHECK_CUTLASS_DIR  CUTLASS headers for the cutlass step (default: unpacked from
#                      deps/nvidia_cutlass-*.whl by scripts/fetch-cutlass.sh; skipped without either)
#   CUTLASS_PROBE_RUNS op:MxNxK ... (op: logits, dx, dw; default: the token walk's products
#                      at 4096x4096x128256 and 8192x2304x256000); CUTLASS_PROBE_ARGS more
#                      arguments (--exact, --stream-k); CUTLASS_PROBE_TIMEOUT s per run (90)
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
out=${1:-$root/out/gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${GPU_CHECK_BUILD:-/tmp/logitd-gpu-build}
skip=" ${GPU_CHECK_SKIP:-} "
jobs=$(nproc)

summary=()
note() {  # note STEP STATUS DETAIL
  summary+=("$(printf '%-10s %-5s %s' "$1" "$2" "$3")")
  echo "gpu-check: $1: $2 $3"
}
skipped() { [[ "$skip" == *" $1 "* ]]; }

# The GPU image keeps cmake, ninja and the PyTorch python here.
if [ -d /opt/torch/.venv/bin ]; then export PATH=/opt/torch/.venv/bin:$PATH; fi

# --- dependencies --------------------------------------------------------
prefix_args=()
have_system_grpc=no
for d in /usr/lib/x86_64-linux-gnu/cmake/grpc /usr/lib/cmake/grpc /usr/local/lib/cmake/grpc; do
  if [ -f "$d/gRPCConfig.cmake" ]; then have_system_grpc=yes; fi
done
if [ "$have_system_grpc" = no ]; then
  if [ -f deps/deps.tar.xz ]; then
    if [ ! -d /tmp/dep/sysroot/usr ]; then
      mkdir -p /tmp/dep && tar -xJf deps/deps.tar.xz -C /tmp/dep
    fi
    prefix_args=(-DCMAKE_PREFIX_PATH=/tmp/dep/sysroot/usr
                 -DProtobuf_PROTOC_EXECUTABLE=/tmp/dep/sysroot/usr/bin/protoc-wrap)
    note deps ok "prefix from deps/deps.tar.xz"
  else
    note deps FAIL "no system gRPC and no deps/deps.tar.xz (see docs: make-dep-prefix.sh)"
    printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
    exit 2
  fi
else
  note deps ok "system packages"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>/dev/null | sed 's/^/gpu-check: device: /'

# --- configure and build --------------------------------------------------
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOGITD_ENABLE_TEST_FAULTS=ON \
    -DLOGITD_WITH_CUDA=ON "${prefix_args[@]}" \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
    -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags >"$out/build.log" 2>&1; then
  note configure FAIL "see build.log"
  tail -30 "$out/build.log"
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  exit 1
fi
start=$(date +%s)
# -k 0: one target that fails to build must not stop the others (the summary says which).
# shellcheck disable=SC2086
ninja -C "$build" -k 0 -j "$jobs" ${GPU_CHECK_TARGETS:-} >>"$out/build.log" 2>&1
build_rc=$?
if [ $build_rc -eq 0 ]; then
  note build ok "$(( $(date +%s) - start )) s"
else
  note build FAIL "some targets failed (see build.log); continuing with what was built"
  grep -E "^FAILED:" "$out/build.log" | head -10
fi

find_bin() { find "$build" -type f -name "$1" -perm -u+x 2>/dev/null | head -1; }

# start_server LOG ARGS...: starts `logitd --backend=cuda` (or $server_backend) on a free loopback
# port with ARGS, its output appended to LOG; sets server_pid, and port once it
# listens. Fails (port empty) when it does not start within 60 s.
# With server_wrapper set (an array), the server runs under it.
server_wrapper=()
start_server() {
  local log=$1 port_file
  shift
  port_file=$(mktemp)
  rm -f "$port_file"
  port=""
  "${server_wrapper[@]}" "$(find_bin logitd)" --backend="${server_backend:-cuda}" --address=127.0.0.1:0 \
    --port_file="$port_file" "$@" >>"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 120); do
    [ -s "$port_file" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.5
  done
  [ -s "$port_file" ] && port=$(tr -dc '0-9' <"$port_file")
  rm -f "$port_file"
  [ -n "$port" ]
}
# Stops the server (under a wrapper: the wrapper's children); server_rc is its
# exit status.
stop_server() {
  if [ ${#server_wrapper[@]} -gt 0 ]; then pkill -TERM -P "$server_pid" 2>/dev/null
  else kill "$server_pid" 2>/dev/null; fi
  wait "$server_pid" 2>/dev/null
  server_rc=$?
}
gpu_memory() { nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | head -1; }

# --- every GEMM configuration the tuner may pick, alone, on odd shapes -----
# logitd_gemm_sweep runs each in a child process with a hang watchdog; it
# exits non-zero when a configuration the tuner lists hangs, faults, fails
# or gives a wrong result (the "offered" and "forced" sets are for evidence).
if ! skipped sweep; then
  sweep_bin=$(find_bin logitd_gemm_sweep)
  if [ -z "$sweep_bin" ]; then
    note sweep FAIL "logitd_gemm_sweep was not built"
  elif timeout $((${SWEEP_SECONDS:-120} + 60)) "$sweep_bin" --max_seconds="${SWEEP_SECONDS:-120}" \
    --timeout_ms=2000 >"$out/sweep.log" 2>&1; then
    note sweep ok "$(grep -E '^tuner ' "$out/sweep.log" | tr -s ' ')"
  else
    note sweep FAIL "exit $? (see sweep.log)"
  fi
  sed -n '/^sweep summary/,$p' "$out/sweep.log" 2>/dev/null
else
  note sweep skip "GPU_CHECK_SKIP"
fi

# --- GPU tests ------------------------------------------------------------
if ! skipped tests; then
  # shellcheck disable=SC2086
  ctest ${GPU_CHECK_CTEST:---preset gpu} --test-dir "$build" --output-on-failure --timeout 900 \
    >"$out/tests.log" 2>&1
  tests_rc=$?
  line=$(grep -E "tests passed|tests failed" "$out/tests.log" | tail -1)
  skipped_count=$(grep -c "(Skipped)" "$out/tests.log" || true)
  if [ $tests_rc -eq 0 ]; then note tests ok "$line ($skipped_count skipped)"
  else note tests FAIL "$line"; grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Not Run" "$out/tests.log" | head -20; fi
else
  note tests skip "GPU_CHECK_SKIP"
fi

# --- compute-sanitizer over the GPU paths -----------------------------------
# memcheck over the backend under mixed small and odd shapes; racecheck and
# synccheck over the backend's own kernels (cast, cross-entropy).
if ! skipped sanitize; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -z "$sanitizer" ]; then
    note sanitize skip "no compute-sanitizer"
  else
    : >"$out/sanitize.log"
    sanitize_rc=0
    sanitize() {  # sanitize TOOL TEST FILTER
      local bin
      bin=$(find_bin "$2")
      [ -n "$bin" ] || { echo "=== $2 not built" >>"$out/sanitize.log"; sanitize_rc=1; return; }
      echo "=== compute-sanitizer --tool $1 $2 --gtest_filter=$3" >>"$out/sanitize.log"
      timeout "${SANITIZE_TIMEOUT:-240}" "$sanitizer" --tool "$1" --error-exitcode 99 \
        --print-limit 20 "$bin" --gtest_filter="$3" >>"$out/sanitize.log" 2>&1
      local rc=$?
      echo "=== exit $rc" >>"$out/sanitize.log"
      [ $rc -eq 0 ] || sanitize_rc=1
    }
    sanitize memcheck cuda_device_trust_test '*DeviceTrust*'
    sanitize memcheck cuda_backend_test 'IntegerBackwardTest.*:CudaBackendTest.Cast*'
    sanitize racecheck cuda_cast_kernel_test '*Misalignment*'
    sanitize synccheck cuda_cross_entropy_test 'CrossEntropyTest.ChunkedAgreesWithOneChunk'
    sanitize memcheck cuda_logprobs_test 'LogProbsTest.ExactOnIntegers*:LogProbsTest.TopKOverMany*'
    sanitize racecheck cuda_logprobs_test 'LogProbsTest.TopKOverMany*'
    SANITIZE_TIMEOUT=$((${SANITIZE_TIMEOUT:-240} * 3)) \
      sanitize racecheck cuda_cross_entropy_test 'CrossEntropyTest.ChunkedAgreesWithOneChunk'
    summary_line=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitize.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
    if [ $sanitize_rc -eq 0 ]; then note sanitize ok "$summary_line"
    else note sanitize FAIL "$summary_line (see sanitize.log)"; fi
  fi
else
  note sanitize skip "GPU_CHECK_SKIP"
fi

# --- golden baselines across server restarts ---------------------------------
# A baseline recorded against a fresh server is compared after each of
# GOLDEN_RESTARTS restarts: with no flag (the default per-user algorithm cache,
# here under XDG_STATE_HOME=$gdir/state; every restart must pass), then with
# --algo_cache=none (the count that differ is reported). Then the fresh
# container's case: an empty state directory against the default baseline,
# which passes or fails naming both algorithms and both results' bounds.
# Last, every suite once with --baseline after a restart with no flag.
if ! skipped golden && [ -n "$(find_bin logitd)" ] && [ -n "$(find_bin logitctl)" ]; then
  gdir=$(mktemp -d)
  : >"$out/golden.log"
  golden_rc=0
  restarts=${GOLDEN_RESTARTS:-5}
  golden_round() {  # golden_round LABEL VALIDATE_ARGS...; SERVER_ARGS in golden_server_args
    if XDG_STATE_HOME="$golden_state" start_server "$out/golden_server.log" \
        "${golden_server_args[@]}"; then
      echo "=== $1: logitctl validate $*" >>"$out/golden.log"
      timeout "${VALIDATE_TIMEOUT:-300}" "$(find_bin logitctl)" validate --server="127.0.0.1:$port" \
        "${@:2}" >>"$out/golden.log" 2>&1
      round_rc=$?
    else
      round_rc=2
    fi
    stop_server
    echo "=== $1: exit $round_rc" >>"$out/golden.log"
    return $round_rc
  }
  golden_state="$gdir/state"
  for mode in default none; do
    golden_server_args=()
    [ "$mode" = none ] && golden_server_args=(--algo_cache=none)
    golden_round "$mode record" --suite=golden --record="$gdir/golden_$mode.json" || golden_rc=1
    differ=0
    for i in $(seq 1 "$restarts"); do
      golden_round "$mode restart $i" --suite=golden --baseline="$gdir/golden_$mode.json" \
        || differ=$((differ + 1))
    done
    echo "golden ($mode): $differ of $restarts restarts differ from the baseline" >>"$out/golden.log"
    eval "differ_$mode=$differ"
  done
  golden_server_args=()
  golden_state="$gdir/fresh"
  if golden_round "fresh state directory" --suite=golden --baseline="$gdir/golden_default.json"; then
    fresh="passes"
  else
    fresh="differs ($(grep -c "other GEMM algorithms" "$out/golden.log") cases name both algorithms)"
  fi
  golden_state="$gdir/state"
  golden_round "all suites" --baseline="$gdir/golden_default.json" --json "$out/validate_baseline.json" \
    || golden_rc=1
  cp "$gdir/state/logitd/algo_cache.json" "$out/algo_cache.json" 2>/dev/null
  if [ "$golden_rc" -eq 0 ] && [ "$differ_default" -eq 0 ]; then
    note golden ok "no flag: 0 of $restarts restarts differ; --algo_cache=none: $differ_none of $restarts; a fresh state directory $fresh; all suites pass with --baseline"
  else
    note golden FAIL "no flag: $differ_default of $restarts restarts differ; --algo_cache=none: $differ_none; see golden.log"
  fi
  grep -E "^golden|FAILED|differ" "$out/golden.log" | head -20
  rm -rf "$gdir"
elif ! skipped golden; then
  note golden skip "logitd or logitctl was not built"
else
  note golden skip "GPU_CHECK_SKIP"
fi

# --- stress: many clients, every tensor RPC, random and odd shapes ------------
# `logitctl stress` with 16 clients for STRESS_SECONDS: every result checked,
# 0 errors, wrong results and hung calls required. Then a subset (4 clients,
# small shapes) with logitd under compute-sanitizer memcheck: 0 reports.
if ! skipped stress && [ -n "$(find_bin logitd)" ] && [ -n "$(find_bin logitctl)" ]; then
  : >"$out/stress.log"
  stress_secs=${STRESS_SECONDS:-300}
  mem_before=$(gpu_memory)
  if start_server "$out/stress_server.log"; then
    timeout $((stress_secs + 240)) "$(find_bin logitctl)" --server="127.0.0.1:$port" stress \
      --clients=16 --duration="$stress_secs" --json >"$out/stress.txt" 2>>"$out/stress.log"
    stress_rc=$?
    mem_during=$(gpu_memory)
  else
    stress_rc=2
  fi
  stop_server
  mem_after=$(gpu_memory)
  line=$(grep -E "^stress: [0-9]+ calls" "$out/stress.txt" | head -1)
  echo "GPU memory used: before $mem_before, at the end of the run $mem_during, after the server stopped $mem_after" >>"$out/stress.log"
  if [ "$stress_rc" -eq 0 ]; then note stress ok "$line; GPU memory $mem_before -> $mem_during -> $mem_after"
  else note stress FAIL "exit $stress_rc: $line (see stress.log)"; fi
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -n "$sanitizer" ] && ! skipped sanitize; then
    : >"$out/stress_sanitizer.log"
    server_wrapper=("$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20)
    if start_server "$out/stress_sanitizer.log"; then
      timeout $((${STRESS_SANITIZER_SECONDS:-60} + 240)) "$(find_bin logitctl)" \
        --server="127.0.0.1:$port" stress --clients=4 --duration="${STRESS_SANITIZER_SECONDS:-60}" \
        --stress_max_m=256 --stress_max_v=4097 --stress_max_k=1000 >>"$out/stress_sanitizer.log" 2>&1
      san_stress_rc=$?
    else
      san_stress_rc=2
    fi
    stop_server
    server_wrapper=()
    san_line=$(grep -E "ERROR SUMMARY" "$out/stress_sanitizer.log" | tail -1)
    calls_line=$(grep -E "^stress: [0-9]+ calls" "$out/stress_sanitizer.log" | tail -1)
    # Judged by the tool's summary: logitd ends through _Exit after its
    # shutdown grace, whose status compute-sanitizer cannot always read
    # ("couldn't find exit code", exit 1).
    if [ "$san_stress_rc" -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$out/stress_sanitizer.log"; then
      note stress-san ok "${san_line:-no summary} (${calls_line})"
    else
      note stress-san FAIL "stress exit $san_stress_rc, sanitizer exit $server_rc: ${san_line:-no summary}"
    fi
  fi
elif ! skipped stress; then
  note stress skip "logitd or logitctl was not built"
else
  note stress skip "GPU_CHECK_SKIP"
fi

# --- the harness against the cuda backend -------------------------------
if ! skipped validate; then
  logitd_bin=$(find_bin logitd)
  logitctl_bin=$(find_bin logitctl)
  if [ -z "$logitd_bin" ] || [ -z "$logitctl_bin" ]; then
    note validate skip "logitd or logitctl was not built (see build.log)"
  else
    : >"$out/validate.log"
    if start_server "$out/validate.log"; then
      echo "=== logitctl validate --server=127.0.0.1:$port" >>"$out/validate.log"
      timeout "${VALIDATE_TIMEOUT:-300}" "$logitctl_bin" validate --server="127.0.0.1:$port" \
        --json "$out/validate.json" --report "$out/report" >>"$out/validate.log" 2>&1
      validate_rc=$?
      if [ $validate_rc -eq 0 ]; then note validate ok "all selected checks passed"
      else note validate FAIL "exit $validate_rc (see validate.log)"; fi
      # The report page, opened headless: parsed as HTML and as XML (every
      # inline SVG well formed), every case of the JSON on it with its verdict.
      if python3 scripts/check-report.py "$out/report/index.html" "$out/validate.json" \
        >"$out/report_check.log" 2>&1; then
        note report ok "$(head -1 "$out/report_check.log")"
      else note report FAIL "see report_check.log"; cat "$out/report_check.log"; fi
    else
      note validate FAIL "logitd --backend=cuda did not start (see validate.log)"
    fi
    stop_server
  fi
else
  note validate skip "GPU_CHECK_SKIP"
fi

# --- A/B: the cpu backend against the cuda backend ----------------------------
# `logitctl validate --compare`: every suite's requests to both servers, per
# output the bitwise-equal fraction, ULP distances and each side's error as a
# fraction of its bound; exit 0 when both sides are inside their bounds.
if skipped validate || skipped compare; then
  note compare skip "GPU_CHECK_SKIP"
elif [ -z "$(find_bin logitd)" ] || [ -z "$(find_bin logitctl)" ]; then
  note compare skip "logitd or logitctl was not built (see build.log)"
else
  : >"$out/compare.log"
  server_backend=cpu
  start_server "$out/compare_cpu.log"
  cpu_pid=$server_pid cpu_port=$port
  server_backend=cuda
  if [ -n "$cpu_port" ] && start_server "$out/compare.log"; then
    # shellcheck disable=SC2086
    timeout "${COMPARE_TIMEOUT:-300}" "$(find_bin logitctl)" validate --server="127.0.0.1:$port" \
      ${COMPARE_ARGS---quick} --compare="127.0.0.1:$cpu_port" --json "$out/compare.json" --report "$out/compare" \
      >>"$out/compare.log" 2>&1
    compare_rc=$?
    if [ $compare_rc -eq 0 ]; then note compare ok "cuda against cpu: both inside their bounds (compare/)"
    else note compare FAIL "exit $compare_rc (see compare.log)"; fi
  else
    note compare FAIL "a server did not start (see compare.log, compare_cpu.log)"
  fi
  stop_server
  kill "$cpu_pid" 2>/dev/null; wait "$cpu_pid" 2>/dev/null
fi

# --- the service at the RPC level: logitctl bench against the cuda backend ----
# Issue 8's shapes, server and client on this machine over loopback; every run
# ends with the Probe RPC (plain gRPC, same bytes) so the ratios come from one
# run. nvidia-smi samples GPU utilisation during the 16-client run. Also
# scrapes the metrics endpoint of this (cuda-enabled) build.
if skipped rpc; then
  note rpc skip "GPU_CHECK_SKIP"
elif [ -z "$(find_bin logitd)" ] || [ -z "$(find_bin logitctl)" ]; then
  note rpc skip "logitd or logitctl was not built (see build.log)"
else
  logitctl_bin=$(find_bin logitctl)
  metrics_port_file=$(mktemp)
  rm -f "$metrics_port_file"
  : >"$out/rpc_server.log"
  if start_server "$out/rpc_server.log" --allow_shm --metrics_address=127.0.0.1:0 \
    --metrics_port_file="$metrics_port_file"; then
    rpc_rc=0
    bench() {  # bench NAME ARGS...: one logitctl bench run, its JSON to rpc_NAME.json
      local name=$1; shift
      echo "=== bench $name: $*" >>"$out/rpc.log"
      timeout "${RPC_BENCH_TIMEOUT:-120}" "$logitctl_bin" --server="127.0.0.1:$port" bench "$@" \
        --json >"$out/rpc_$name.json" 2>>"$out/rpc.log" ||
        { local rc=$?; rpc_rc=1; echo "exit $rc" >>"$out/rpc.log"; }
      python3 -c 'import json,sys
for p in json.load(open(sys.argv[1]))["phases"]:
  s=p.get("server_avg",{})
  print("  %-9s req/s %8.2f p50 %9.3f p99 %9.3f ms  down %7.3f GB/s  server compute %s send %s total %s us" % (
    p["rpc"], p["requests_per_s"], p["latency_ms"]["p50"], p["latency_ms"]["p99"], p["down_gb_s"],
    s.get("compute_us"), s.get("send_us"), s.get("total_us")))' "$out/rpc_$name.json" \
        >>"$out/rpc.log" 2>&1 || true
    }
    r=${RPC_BENCH_REQUESTS:-30}
    busy() {  # busy NAME ARGS...: a bench run with nvidia-smi sampling GPU utilisation
      local name=$1 smi_pid=""
      if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 \
          >"$out/rpc_util_$name.txt" 2>/dev/null &
        smi_pid=$!
      fi
      bench "$@"
      if [ -n "$smi_pid" ]; then
        kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null
        echo "  GPU utilisation during $name (nvidia-smi, 100 ms samples): $(sort -n "$out/rpc_util_$name.txt" | awk '{s+=$1; a[NR]=$1} END {if (NR) printf "mean %.1f%% median %s%% over %d samples", s/NR, a[int((NR+1)/2)], NR}')" >>"$out/rpc.log"
      fi
    }
    if [ "${RPC_BENCH_SET:-all}" = all ]; then
      bench m1024_c1 --rpc=logits --m=1024 --k=4096 --v=32768 --requests="$r"
      bench m1024_c4 --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=4 --channels=4 --requests="$r"
      bench m16_c1 --rpc=logits --m=16 --k=4096 --v=32768 --duration=5
      bench m16_c1_shm --rpc=logits --m=16 --k=4096 --v=32768 --duration=5 --shm --baseline=false
      bench m16_c1_shm_nodigest --rpc=logits --m=16 --k=4096 --v=32768 --duration=5 --shm \
        --shm_skip_digest --baseline=false
      busy m1024_c16 --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 --channels=16 --duration=10
      busy m1024_c16_shm --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 --channels=16 \
        --duration=10 --shm --baseline=false
      busy m1024_c16_shm_nodigest --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 \
        --channels=16 --duration=10 --shm --shm_skip_digest --baseline=false
      df -h /dev/shm >>"$out/rpc.log" 2>&1
      bench m8192_grpc --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6
      bench m8192_shm --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6 --shm --baseline=false
      bench m8192_shm_nodigest --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6 --shm \
        --shm_skip_digest --baseline=false
    fi
    # LogProbs over plain gRPC: 16 clients' GPU busy fraction, and one
    # client's tokens/s at M=8192 against the kernel's own rate (the lp step).
    lp=(--rpc=logprobs --k=4096 --v=128256 --top_k=5 --entropy --lse --baseline=false)
    busy lp_m1024_c16 "${lp[@]}" --m=1024 --concurrency=16 --channels=16 --duration=10
    busy lp_m1024_v32k_c16 --rpc=logprobs --k=4096 --v=32768 --top_k=5 --entropy --lse \
      --baseline=false --m=1024 --concurrency=16 --channels=16 --duration=10
    bench lp_m8192_c1 "${lp[@]}" --m=8192 --requests=12
    bench lp_m8192_c1_shm "${lp[@]}" --m=8192 --requests=12 --shm
    bench lp_m16_c1 "${lp[@]}" --m=16 --duration=5
    if [ "${RPC_BENCH_SET:-all}" = all ]; then
      bench backward_m1024 --rpc=backward --m=1024 --k=4096 --v=32768 --requests=6
      bench fetch_gradient --rpc=fetch-gradient --m=1024 --k=4096 --v=32768 --requests=6
    fi
    metrics_port=$(tr -dc '0-9' <"$metrics_port_file" 2>/dev/null)
    if [ -n "$metrics_port" ] && python3 -c 'import sys,urllib.request
body=urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
lines=[l for l in body.splitlines() if l.startswith("logitd_requests_total")]
print("\n".join(lines[:8])); sys.exit(0 if lines else 1)' "$metrics_port" >"$out/rpc_metrics.txt" 2>&1; then
      echo "  metrics endpoint: served ($(wc -l <"$out/rpc_metrics.txt") request counters)" >>"$out/rpc.log"
    else
      rpc_rc=1
      echo "  metrics endpoint: FAILED (port '$metrics_port'; see rpc_metrics.txt, rpc_server.log)" >>"$out/rpc.log"
    fi
    if [ $rpc_rc -eq 0 ]; then note rpc ok "rpc.log, rpc_*.json"
    else note rpc FAIL "see rpc.log"; fi
  else
    note rpc FAIL "logitd --backend=cuda --allow_shm did not start (see rpc_server.log)"
  fi
  stop_server
  rm -f "$metrics_port_file"
fi

# --- the Open Inference Protocol under load: perf_analyzer against logitctl bench --
# Triton's perf_analyzer (PERF_ANALYZER: its path; it ships in tritonclient's
# manylinux wheel and needs libb64 and libcudart.so.12 on LD_LIBRARY_PATH)
# calls model "head" (a registered random [32768, 4096] weight) over the OIP;
# logitctl bench calls the same shape over logitd's own RPC, in the same run.
# M=16 over plain gRPC; M=1024 through system shared memory (its 128 MiB of
# logits are over the 4 MiB message limit).
if skipped oip || skipped rpc; then
  note oip skip "GPU_CHECK_SKIP"
elif [ -z "${PERF_ANALYZER:-}" ] || [ ! -x "${PERF_ANALYZER:-}" ]; then
  note oip skip "PERF_ANALYZER is not set to an executable perf_analyzer"
elif [ -z "$(find_bin logitd)" ] || [ -z "$(find_bin logitctl)" ]; then
  note oip skip "logitd or logitctl was not built (see build.log)"
else
  : >"$out/oip.log"
  oip_rc=0
  # A random bf16 [32768, 4096] weight as safetensors (numpy only).
  make_head() {
    python3 - "$1" <<'PY'
import json, struct, sys
import numpy as np
v, k = 32768, 4096
w = np.random.default_rng(1234).standard_normal((v, k), dtype=np.float32) * (3 / k ** 0.5)
bits = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: any bf16 values do
head = json.dumps({"w": {"dtype": "BF16", "shape": [v, k], "data_offsets": [0, bits.nbytes]}})
head = head.encode() + b" " * (-len(head) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + bits.tobytes())
PY
  }
  if start_server "$out/oip_server.log" --allow_shm &&
    make_head "$out/oip_head.safetensors" >>"$out/oip.log" 2>&1 &&
    "$(find_bin logitctl)" --server="127.0.0.1:$port" weights register "$out/oip_head.safetensors" \
      --tensor=w --name=head >>"$out/oip.log" 2>&1; then
    rm -f "$out/oip_head.safetensors"
    pa() {  # pa NAME ARGS...: one perf_analyzer run, its CSV to oip_NAME.csv
      local name=$1; shift
      echo "=== perf_analyzer $name: $*" >>"$out/oip.log"
      timeout 120 "$PERF_ANALYZER" -m head -u "127.0.0.1:$port" -i grpc --measurement-interval 3000 \
        --stability-percentage 25 -f "$out/oip_$name.csv" "$@" >>"$out/oip.log" 2>&1 ||
        { local rc=$?; oip_rc=1; echo "exit $rc" >>"$out/oip.log"; }
      tail -1 "$out/oip_$name.csv" 2>/dev/null | awk -F, -v n="$name" '{printf "  OIP %-22s concurrency %s: %9.1f req/s  p50 %8.3f ms  p99 %8.3f ms\n", n, $1, $2, $5/1000, $8/1000}' >>"$out/oip.log"
    }
    ours() {  # ours NAME ARGS...: logitctl bench, same shape
      local name=$1; shift
      timeout 120 "$(find_bin logitctl)" --server="127.0.0.1:$port" bench "$@" --baseline=false \
        --json >"$out/oip_ours_$name.json" 2>>"$out/oip.log" || oip_rc=1
      python3 -c 'import json,sys
p=json.load(open(sys.argv[1]))["phases"][0]
print("  own %-22s concurrency %s: %9.1f req/s  p50 %8.3f ms  p99 %8.3f ms" % (sys.argv[2], sys.argv[3],
  p["requests_per_s"], p["latency_ms"]["p50"], p["latency_ms"]["p99"]))' "$out/oip_ours_$name.json" "$name" \
        "$(echo "$*" | grep -o 'concurrency=[0-9]*' | cut -d= -f2 || echo 1)" >>"$out/oip.log" 2>&1 || oip_rc=1
    }
    pa m16_c1 --shape x:16,4096 --concurrency-range 1
    ours m16_c1 --rpc=logits --m=16 --k=4096 --v=32768 --duration=5 --concurrency=1
    pa m16_c16 --shape x:16,4096 --concurrency-range 16
    ours m16_c16 --rpc=logits --m=16 --k=4096 --v=32768 --duration=5 --concurrency=16 --channels=16
    pa m1024_c1_shm --shape x:1024,4096 --concurrency-range 1 --shared-memory system \
      --output-shared-memory-size $((1024 * 32768 * 4))
    ours m1024_c1_shm --rpc=logits --m=1024 --k=4096 --v=32768 --duration=5 --concurrency=1 --shm
    ours m1024_c1_shm_nodigest --rpc=logits --m=1024 --k=4096 --v=32768 --duration=5 --concurrency=1 \
      --shm --shm_skip_digest
    pa m1024_c4_shm --shape x:1024,4096 --concurrency-range 4 --shared-memory system \
      --output-shared-memory-size $((1024 * 32768 * 4))
    ours m1024_c4_shm --rpc=logits --m=1024 --k=4096 --v=32768 --duration=5 --concurrency=4 \
      --channels=4 --shm
    ours m1024_c4_shm_nodigest --rpc=logits --m=1024 --k=4096 --v=32768 --duration=5 --concurrency=4 \
      --channels=4 --shm --shm_skip_digest
    if [ $oip_rc -eq 0 ]; then note oip ok "oip.log, oip_*.csv"
    else note oip FAIL "see oip.log"; fi
  else
    note oip FAIL "the server or the weight did not come up (see oip.log, oip_server.log)"
  fi
  stop_server
fi

# --- chunk size: the one-client M=1024 logits call at several --chunk_bytes --
# One server per size (server and client chunks equal), each run with its
# Probe, so each ratio comes from one run.
if skipped rpc || skipped chunks; then
  note chunks skip "GPU_CHECK_SKIP"
elif [ -z "$(find_bin logitd)" ] || [ -z "$(find_bin logitctl)" ]; then
  note chunks skip "logitd or logitctl was not built (see build.log)"
else
  chunks_rc=0
  : >"$out/chunks.log"
  for cb in 1048576 2097152 4194304 8388608 16777216; do
    if start_server "$out/chunks_server.log" --chunk_bytes="$cb"; then
      echo "=== --chunk_bytes=$cb" >>"$out/chunks.log"
      timeout "${RPC_BENCH_TIMEOUT:-120}" "$(find_bin logitctl)" --server="127.0.0.1:$port" \
        --chunk_bytes="$cb" bench --rpc=logits --m=1024 --k=4096 --v=32768 \
        --requests="${RPC_BENCH_REQUESTS:-30}" --json >"$out/chunks_$cb.json" \
        2>>"$out/chunks.log" || chunks_rc=1
      python3 -c 'import json,sys
d=json.load(open(sys.argv[1])); p={q["rpc"]: q for q in d["phases"]}
print("  logits p50 %.2f ms %.3f GB/s, Probe p50 %.2f ms %.3f GB/s, efficiency %.2f" % (
  p["logits"]["latency_ms"]["p50"], p["logits"]["down_gb_s"], p["baseline"]["latency_ms"]["p50"],
  p["baseline"]["down_gb_s"], p["logits"]["down_gb_s"] / p["baseline"]["down_gb_s"]))' \
        "$out/chunks_$cb.json" >>"$out/chunks.log" 2>&1 || chunks_rc=1
    else
      chunks_rc=1
      echo "=== --chunk_bytes=$cb: logitd did not start" >>"$out/chunks.log"
    fi
    stop_server
  done
  if [ $chunks_rc -eq 0 ]; then note chunks ok "chunks.log, chunks_*.json"
  else note chunks FAIL "see chunks.log"; fi
fi

# The python with torch (the example and the benchmarks need it).
python=""
for p in /opt/torch/.venv/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then python=$p; break; fi
done

# --- the Python client's examples against the cuda backend ------------------
# torch.autograd.Function over Logits/Backward (client/python/examples),
# checked against torch's own result; then rl_logprob_check.py's report of
# what a BF16 head does to RL log-probs against LogProbs' FP32. The client's
# stubs are generated from proto/ with grpcio-tools; without it (or grpcio)
# the step is skipped.
if skipped example; then
  note example skip "GPU_CHECK_SKIP"
elif [ -z "$python" ]; then
  note example skip "no python3 with torch"
else
  pydir=$(mktemp -d)
  # Wheels brought along for what the image lacks (GPU_CHECK_WHEELS: a
  # directory of wheels; the machine has no registry).
  if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    for pair in xxhash:xxhash ml_dtypes:ml_dtypes grpc_tools:grpcio-tools; do
      "$python" -c "import ${pair%%:*}" 2>/dev/null && continue
      "$python" -m pip install -q --no-index --no-deps --find-links "$GPU_CHECK_WHEELS" \
        --target "$pydir" "${pair#*:}" >>"$out/example.log" 2>&1 || true
    done
  fi
  cp -r client/python/src/logitd "$pydir/"
  export PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}"
fi
# The stubs come from grpcio-tools when the python has it, else from the
# dependency prefix's protoc 3.21 and grpc_python_plugin (their generated code
# loads in newer protobuf and grpcio runtimes).
gen_stubs() {  # gen_stubs DIR
  if "$python" -c "import grpc_tools" 2>/dev/null; then
    "$python" -m grpc_tools.protoc -Iproto --python_out="$1" --grpc_python_out="$1" \
      logitd/v1/logitd.proto
  elif [ -x /tmp/dep/sysroot/usr/bin/grpc_python_plugin ]; then
    /tmp/dep/sysroot/usr/bin/protoc-wrap -Iproto --python_out="$1" --grpc_python_out="$1" \
      --plugin=protoc-gen-grpc_python=/tmp/dep/sysroot/usr/bin/grpc_python_plugin \
      logitd/v1/logitd.proto
  else
    echo "neither grpcio-tools nor the prefix's grpc_python_plugin"; return 1
  fi
}
if [ -n "${pydir:-}" ] && ! "$python" -c "import sys, grpc, google.protobuf as pb, numpy, ml_dtypes, xxhash; print('python', sys.version.split()[0], 'grpcio', grpc.__version__, 'protobuf', pb.__version__)" \
  >>"$out/example.log" 2>&1; then
  note example skip "$python lacks one of grpcio, protobuf, numpy, ml_dtypes, xxhash"
elif [ -n "${pydir:-}" ]; then
  if ! gen_stubs "$pydir" \
    >>"$out/example.log" 2>&1; then
    note example FAIL "stub generation failed (see example.log)"
  else
    if start_server "$out/example.log"; then
      example_rc=0
      for shape in "--tokens 16 --hidden 1024 --vocab 8192" "--tokens 512 --hidden 4096 --vocab 32768"; do
        echo "=== autograd_lm_head.py 127.0.0.1:$port $shape" >>"$out/example.log"
        # shellcheck disable=SC2086
        timeout 300 "$python" client/python/examples/autograd_lm_head.py \
          "127.0.0.1:$port" $shape >>"$out/example.log" 2>&1 || example_rc=$?
      done
      # The RL example: the log-prob mismatch of a BF16 head against LogProbs at a
      # Llama-3-size head (table in rl_logprob.txt, summary in rl_logprob.json).
      echo "=== rl_logprob_check.py 127.0.0.1:$port --tokens 8192 --hidden 4096 --vocab 128256" >>"$out/example.log"
      timeout 300 "$python" client/python/examples/rl_logprob_check.py "127.0.0.1:$port" \
        --tokens 8192 --hidden 4096 --vocab 128256 --json "$out/rl_logprob.json" \
        --png "$out/rl_logprob.png" >"$out/rl_logprob.txt" 2>>"$out/example.log" || example_rc=$?
      if [ $example_rc -eq 0 ]; then
        note example ok "autograd example inside its bounds (example.log); RL log-prob check in rl_logprob.txt"
      else note example FAIL "exit $example_rc (see example.log)"; fi
    else
      note example FAIL "logitd --backend=cuda did not start (see example.log)"
    fi
    stop_server
  fi
  rm -rf "$pydir"
fi

# --- benchmarks -------------------------------------------------------------
capi=$(find "$build" -name liblogitd_bench_capi.so 2>/dev/null | head -1)
if ! skipped bench && ! skipped gemm; then
  bench_bin=$(find_bin logitd_kernel_bench)
  if [ -z "$bench_bin" ]; then
    note bench FAIL "logitd_kernel_bench was not built"
  else
    if "$bench_bin" --json "$out/bench_logitd.json" --shapes "${BENCH_SHAPES:-all}" \
      --reps "${BENCH_REPS:-30}" >"$out/bench.log" 2>&1; then
      note bench ok "bench_logitd.json"
    else note bench FAIL "see bench.log"; tail -5 "$out/bench.log"; fi
  fi
  if skipped torch; then
    note torch skip "GPU_CHECK_SKIP"
  elif [ -z "$python" ]; then
    note torch skip "no python3 with torch"
  else
    # logitd's engine joins the PyTorch process when its C library was built,
    # so that the ratios against PyTorch come from one process.
    capi_args=()
    [ -n "$capi" ] && capi_args=(--logitd-lib "$capi")
    if PYTHONUNBUFFERED=1 "$python" bench/torch_baseline.py --json "$out/bench_torch.json" \
      --shapes "${BENCH_SHAPES:-all}" --reps "${BENCH_REPS:-30}" "${capi_args[@]}" \
      >>"$out/bench.log" 2>&1; then
      note torch ok "bench_torch.json (torch $("$python" -c 'import torch;print(torch.__version__)'))"
    else note torch FAIL "see bench.log"; fi
  fi
else
  note bench skip "GPU_CHECK_SKIP"
fi

# --- fused cross-entropy against PyTorch (same process, same tensors) ----------
if skipped bench || skipped ce || [ "${CE_BENCH:-1}" = 0 ]; then
  note ce skip "GPU_CHECK_SKIP or CE_BENCH=0"
elif [ -z "$python" ]; then
  note ce skip "no python3 with torch"
elif [ -z "$capi" ]; then
  note ce FAIL "liblogitd_bench_capi.so was not built"
else
  ce_args=(--json "$out/bench_ce.json" --markdown "$out/bench_ce.md"
           --reps "${CE_BENCH_REPS:-10}" --logitd-lib "$capi")
  [ -n "${CE_BENCH_SHAPES:-}" ] && ce_args+=(--shapes "$CE_BENCH_SHAPES")
  [ -n "${CE_BENCH_TOKEN_CHUNKS:-}" ] && ce_args+=(--token-chunks "$CE_BENCH_TOKEN_CHUNKS")
  # shellcheck disable=SC2206
  [ -n "${CE_BENCH_ARGS:-}" ] && ce_args+=(${CE_BENCH_ARGS})
  ce_timeout=${CE_BENCH_TIMEOUT:-240}
  if [ "${CE_BENCH_COMPILE:-0}" = 1 ]; then
    ce_args+=(--compile)
    ce_timeout=${CE_BENCH_TIMEOUT:-600}
  fi
  if PYTHONUNBUFFERED=1 timeout "$ce_timeout" "$python" bench/ce_bench.py "${ce_args[@]}" \
    >"$out/bench_ce.log" 2>&1; then
    note ce ok "bench_ce.json, bench_ce.md"
  else
    note ce FAIL "see bench_ce.log"
    tail -5 "$out/bench_ce.log"
  fi
fi

# --- LogProbs against PyTorch (same process, same tensors) --------------------
if skipped bench || skipped lp; then
  note lp skip "GPU_CHECK_SKIP"
elif [ -z "$python" ]; then
  note lp skip "no python3 with torch"
elif [ -z "$capi" ]; then
  note lp FAIL "liblogitd_bench_capi.so was not built"
else
  lp_args=(--json "$out/bench_lp.json" --reps "${LP_BENCH_REPS:-10}" --bf16 --logitd-lib "$capi")
  [ -n "${LP_BENCH_SHAPES:-}" ] && lp_args+=(--shapes "$LP_BENCH_SHAPES")
  [ "${LP_BENCH_COMPILE:-0}" = 1 ] && lp_args+=(--compile)
  if PYTHONUNBUFFERED=1 timeout "${LP_BENCH_TIMEOUT:-300}" "$python" bench/logprobs_bench.py \
    "${lp_args[@]}" >"$out/bench_lp.log" 2>&1; then
    note lp ok "bench_lp.json, bench_lp.log"
  else
    note lp FAIL "see bench_lp.log"
    tail -5 "$out/bench_lp.log"
  fi
fi

# --- CUTLASS kernels against cuBLASLt on the cross-entropy's products ---------
# bench/cutlass_gemm_probe.cu: could a GEMM of logitd's own, with the row
# statistics in its epilogue, keep up with the cuBLASLt kernels the walk runs?
# Needs CUTLASS's headers: GPU_CHECK_CUTLASS_DIR, or the pinned nvidia-cutlass
# wheel in deps/ for scripts/fetch-cutlass.sh (the GPU machine has no
# registry). Skipped without them.
cutlass_wheel=$(find deps -maxdepth 1 -name "nvidia_cutlass-*.whl" 2>/dev/null | head -1)
if skipped bench || skipped cutlass; then
  note cutlass skip "GPU_CHECK_SKIP"
elif [ -z "${GPU_CHECK_CUTLASS_DIR:-}" ] && [ -z "$cutlass_wheel" ]; then
  note cutlass skip "no GPU_CHECK_CUTLASS_DIR and no deps/nvidia_cutlass-*.whl"
else
  cutlass_dir=${GPU_CHECK_CUTLASS_DIR:-}
  if [ -z "$cutlass_dir" ]; then
    cutlass_dir=$(CUTLASS_WHEEL=$root/$cutlass_wheel scripts/fetch-cutlass.sh /tmp/logitd-cutlass \
      2>>"$out/cutlass.log")
  fi
  if [ -n "$cutlass_dir" ] &&
    cmake -S . -B "$build" -DLOGITD_CUTLASS_DIR="$cutlass_dir" >>"$out/cutlass.log" 2>&1 &&
    ninja -C "$build" -j "$jobs" logitd_cutlass_probe_logits logitd_cutlass_probe_dx \
      logitd_cutlass_probe_dw >>"$out/cutlass.log" 2>&1; then
    : >"$out/cutlass.txt"
    cutlass_rc=0
    for run in ${CUTLASS_PROBE_RUNS:-logits:1408x128256x4096 logits:1024x256000x2304 \
      dx:1408x4096x128256 dx:1024x2304x256000 dw:128256x4096x1408 dw:256000x2304x1024}; do
      op=${run%%:*}
      dims=${run#*:}
      # shellcheck disable=SC2086
      timeout "${CUTLASS_PROBE_TIMEOUT:-90}" "$(find_bin "logitd_cutlass_probe_$op")" \
        ${dims//x/ } ${CUTLASS_PROBE_ARGS:-} >>"$out/cutlass.txt" 2>&1
      rc=$?
      [ $rc -eq 124 ] && echo "($run did not finish within ${CUTLASS_PROBE_TIMEOUT:-90} s)" >>"$out/cutlass.txt"
      echo >>"$out/cutlass.txt"
      [ $rc -ne 0 ] && cutlass_rc=$rc
    done
    if [ $cutlass_rc -eq 0 ]; then note cutlass ok "cutlass.txt"
    else note cutlass FAIL "a probe exited $cutlass_rc (see cutlass.txt)"; fi
  else
    note cutlass FAIL "no CUTLASS headers or the probes did not build (see cutlass.log)"
  fi
fi

# --- summary ----------------------------------------------------------------
{
  echo
  echo "== gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), out: $out)"
  printf '%s\n' "${summary[@]}"
  if [ -s "$out/bench_logitd.json" ]; then
    py=${python:-python3}
    echo
    "$py" bench/compare.py "$out/bench_logitd.json" "$out/bench_torch.json" 2>&1
  fi
  if [ -s "$out/bench_ce.md" ]; then
    echo
    cat "$out/bench_ce.md"
  fi
  if [ -s "$out/rpc.log" ]; then
    echo
    grep -v "^===" "$out/rpc.log" | head -60
  fi
} | tee "$out/summary.txt"
grep -q " FAIL " "$out/summary.txt" && exit 1
exit 0
