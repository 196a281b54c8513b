# shellcheck shell=bash
# --- the service at the RPC level: logitctl bench against the cuda backend ----
# Issue 8's shapes, server and client on this machine over loopback; every run
# ends with the Probe RPC (plain gRPC, same bytes) so the ratios come from one
# run. nvidia-smi samples GPU utilisation during the 16-client run. Also
# scrapes the metrics endpoint of this (cuda-enabled) build.

bench() {  # bench NAME ARGS...: one logitctl bench run, its JSON to rpc_NAME.json
  local name=$1; shift
  echo "=== bench $name: $*" >>"$out/rpc.log"
  # `times` in the subshell: the CPU time of logitctl (and timeout) alone.
  (
    timeout "${RPC_BENCH_TIMEOUT:-120}" "$logitctl_bin" --server="127.0.0.1:$port" bench "$@" \
      --json >"$out/rpc_$name.json" 2>>"$out/rpc.log"
    rc=$?
    times >"$out/rpc_times_$name.txt"
    exit $rc
  ) || { local rc=$?; rpc_rc=1; echo "exit $rc" >>"$out/rpc.log"; }
  python3 -c 'import json,sys
for p in json.load(open(sys.argv[1]))["phases"]:
  s=p.get("server_avg",{})
  print("  %-9s req/s %8.2f p50 %9.3f p99 %9.3f ms  down %7.3f GB/s  server compute %s send %s total %s us" % (
    p["rpc"], p["requests_per_s"], p["latency_ms"]["p50"], p["latency_ms"]["p99"], p["down_gb_s"],
    s.get("compute_us"), s.get("send_us"), s.get("total_us")))
  w=p.get("server_slowest") or {}
  if w:
    print("  %-9s slowest 1%%: %d requests, %.3f ms; server queue %s receive %s h2d %s compute %s d2h %s send %s total %s us" % (
      "", w["requests"], w["latency_ms"], w.get("queue_us"), w.get("receive_us"), w.get("h2d_us"),
      w.get("compute_us"), w.get("d2h_us"), w.get("send_us"), w.get("total_us")))' "$out/rpc_$name.json" \
    >>"$out/rpc.log" 2>&1 || true
}
busy() {  # busy NAME ARGS...: a bench run with nvidia-smi sampling GPU utilisation
  local name=$1 smi_pid=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 \
      >"$out/rpc_util_$name.txt" 2>/dev/null &
    smi_pid=$!
  fi
  accounted "$@"
  if [ -n "$smi_pid" ]; then
    kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null
    echo "  GPU utilisation during $name (nvidia-smi, 100 ms samples): $(sort -n "$out/rpc_util_$name.txt" | awk '{s+=$1; a[NR]=$1} END {if (NR) printf "mean %.1f%% median %s%% over %d samples", s/NR, a[int((NR+1)/2)], NR}')" >>"$out/rpc.log"
  fi
}

# CPU time while a bench run lasts: the whole machine's busy share, the
# server's and the client's seconds, and each per completed request (from
# /proc/stat, /proc/PID/stat and the subshell's `times`). Where the 16-client
# rows lose against the Probe, this says whether the machine's cores are the
# limit, and which side spends them.
machine_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }
process_ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
accounted() {  # accounted NAME ARGS...: bench, then the CPU line
  local name=$1 busy0 idle0 busy1 idle1 srv0 srv1
  read -r busy0 idle0 < <(machine_ticks)
  srv0=$(process_ticks "$server_pid")
  bench "$@"
  read -r busy1 idle1 < <(machine_ticks)
  srv1=$(process_ticks "$server_pid")
  python3 - "$out/rpc_$name.json" "$out/rpc_times_$name.txt" "$busy0" "$idle0" "$busy1" \
    "$idle1" "$srv0" "$srv1" "$(getconf CLK_TCK)" "$(nproc)" "$name" >>"$out/rpc.log" 2>&1 <<'PY' || true
import json, re, sys
j, t, b0, i0, b1, i1, s0, s1, hz, cores, name = sys.argv[1:]
hz = float(hz)
def secs(x):
    m = re.match(r"(\d+)m([\d.]+)s", x)
    return int(m.group(1)) * 60 + float(m.group(2))
lines = open(t).read().split("\n")
client = sum(secs(x) for x in lines[1].split())  # children: user + system
done = sum(p["requests"] for p in json.load(open(j))["phases"])
busy = (float(b1) - float(b0)) / max(1.0, (float(b1) - float(b0)) + (float(i1) - float(i0)))
server = (float(s1) - float(s0)) / hz
print("  CPU during %s: machine %.0f%% busy of %s cores; server %.2f s, client %.2f s; "
      "per request server %.1f ms, client %.1f ms (%d requests)" % (
      name, 100 * busy, cores, server, client, 1e3 * server / max(done, 1),
      1e3 * client / max(done, 1), done))
PY
}

step_rpc() {
  if skipped rpc; then note rpc skip "GPU_CHECK_SKIP"; return; fi
  if ! have_server_and_client; then
    note rpc skip "logitd or logitctl was not built (see build.log)"
    return
  fi
  logitctl_bin=$(find_bin logitctl)
  metrics_port_file=$(mktemp)
  rm -f "$metrics_port_file"
  : >"$out/rpc_server.log"
  if start_server "$out/rpc_server.log" --allow_shm --metrics_address=127.0.0.1:0 \
    --metrics_port_file="$metrics_port_file"; then
    rpc_rc=0
    rpc_runs
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
    if [ "$rpc_rc" -eq 0 ]; then note rpc ok "rpc.log, rpc_*.json, rpc_targets.txt"
    else note rpc FAIL "see rpc.log"; fi
  else
    note rpc FAIL "logitd --backend=cuda --allow_shm did not start (see rpc_server.log)"
  fi
  stop_server
  rm -f "$metrics_port_file"
  [ "${RPC_BENCH_SET:-all}" = c16 ] && return
  # The same shared-memory calls against a server that reads inputs in place.
  : >"$out/rpc_in_place_server.log"
  if start_server "$out/rpc_in_place_server.log" --allow_shm --shm_in_place; then
    echo "=== server --shm_in_place" >>"$out/rpc.log"
    bench lp_m8192_c1_shm_in_place --rpc=logprobs --k=4096 --v=128256 --top_k=5 --entropy --lse \
      --baseline=false --m=8192 --requests=12 --shm
    # X hashed once as it was written (ShmSlot.xxh3): the client's share of the call.
    bench lp_m8192_c1_shm_in_place_digest_once --rpc=logprobs --k=4096 --v=128256 --top_k=5 \
      --entropy --lse --baseline=false --m=8192 --requests=12 --shm --shm_digest_once
    bench m8192_shm_in_place --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6 --shm \
      --baseline=false
    stop_server
  else
    echo "  logitd --shm_in_place did not start (see rpc_in_place_server.log)" >>"$out/rpc.log"
  fi
  # Issue 32's targets, each against the Probe or the kernel of this run.
  python3 "$root/scripts/gpu-check/rpc_targets.py" "$out" >"$out/rpc_targets.txt" 2>&1 || true
  cat "$out/rpc_targets.txt" >>"$out/rpc.log"
}

# The bench runs against the started server (RPC_BENCH_SET picks them).
rpc_runs() {
  r=${RPC_BENCH_REQUESTS:-30}
  # in_place: only the rows of the server that reads inputs in place (below).
  [ "${RPC_BENCH_SET:-all}" = in_place ] && return
  if [ "${RPC_BENCH_SET:-all}" = c16 ]; then
    # The 16-client M=1024 Logits rows and the Probe, each alone and with
    # its CPU time, and the one-client 1 GiB call and its Probe, in turn,
    # RPC_BENCH_ROUNDS times (default 3).
    local round
    for round in $(seq 1 "${RPC_BENCH_ROUNDS:-3}"); do
      c16=(--m=1024 --k=4096 --v=32768 --concurrency=16 --channels=16 --duration=10)
      accounted "c16_logits_$round" --rpc=logits "${c16[@]}" --baseline=false
      accounted "c16_logits_whole_$round" --rpc=logits "${c16[@]}" --baseline=false --nopipeline
      accounted "c16_probe_$round" --rpc=baseline "${c16[@]}"
      m8k=(--m=8192 --k=4096 --v=32768 --requests=4)
      accounted "m8192_logits_$round" --rpc=logits "${m8k[@]}" --baseline=false
      accounted "m8192_logits_whole_$round" --rpc=logits "${m8k[@]}" --baseline=false --nopipeline
      accounted "m8192_probe_$round" --rpc=baseline "${m8k[@]}"
    done
    return
  fi
  if [ "${RPC_BENCH_SET:-all}" = all ]; then
    bench m1024_c1 --rpc=logits --m=1024 --k=4096 --v=32768 --requests="$r"
    bench m1024_c1_whole --rpc=logits --m=1024 --k=4096 --v=32768 --requests="$r" --nopipeline
    bench m1024_c4 --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=4 --channels=4 --requests="$r"
    bench m1024_c4_whole --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=4 --channels=4 \
      --requests="$r" --nopipeline
    bench m16_c1 --rpc=logits --m=16 --k=4096 --v=32768 --duration=5
    bench m16_c1_shm --rpc=logits --m=16 --k=4096 --v=32768 --duration=5 --shm --baseline=false
    bench m16_c1_shm_nodigest --rpc=logits --m=16 --k=4096 --v=32768 --duration=5 --shm \
      --shm_skip_digest --baseline=false
    busy m1024_c16 --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 --channels=16 --duration=10
    busy m1024_c16_whole --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 --channels=16 \
      --duration=10 --nopipeline
    busy m1024_c16_shm --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 --channels=16 \
      --duration=10 --shm --baseline=false
    busy m1024_c16_shm_nodigest --rpc=logits --m=1024 --k=4096 --v=32768 --concurrency=16 \
      --channels=16 --duration=10 --shm --shm_skip_digest --baseline=false
    df -h /dev/shm >>"$out/rpc.log" 2>&1
    bench m8192_grpc --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6
    bench m8192_grpc_whole --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6 --nopipeline
    # One call spread over several connections (LogitsOptions.connections).
    for n in 2 4 8; do
      bench "m8192_grpc_connections_$n" --rpc=logits --m=8192 --k=4096 --v=32768 --requests=6 \
        --connections="$n" --baseline=false
    done
    # What more than one stream moves: the Probe with a 1 GiB response from
    # 1, 2, 4 and 8 calls at once, over one connection and over as many.
    for n in 1 2 4 8; do
      bench "streams_${n}_one_connection" --rpc=baseline --m=8192 --k=4096 --v=32768 \
        --concurrency="$n" --channels=1 --requests=$((4 * n))
      bench "streams_${n}_connections" --rpc=baseline --m=8192 --k=4096 --v=32768 \
        --concurrency="$n" --channels="$n" --requests=$((4 * n))
    done
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
  bench lp_m8192_c1_whole "${lp[@]}" --m=8192 --requests=12 --nopipeline
  bench lp_m8192_c1_shm "${lp[@]}" --m=8192 --requests=12 --shm
  # One call spread over several connections (LogProbsOptions.connections).
  for n in 2 4 8; do
    bench "lp_m8192_c1_connections_$n" "${lp[@]}" --m=8192 --requests=12 --connections="$n"
  done
  # CrossEntropy without dW (loss, lse, dX), in row blocks and whole; 16 clients.
  busy ce_m1024_c16 --rpc=cross-entropy --k=4096 --v=128256 --dx --m=1024 --concurrency=16 \
    --channels=16 --duration=10 --baseline=false
  bench ce_m8192_c1 --rpc=cross-entropy --k=4096 --v=128256 --dx --m=8192 --requests=6 \
    --baseline=false
  bench ce_m8192_c1_whole --rpc=cross-entropy --k=4096 --v=128256 --dx --m=8192 --requests=6 \
    --baseline=false --nopipeline
  bench lp_m16_c1 "${lp[@]}" --m=16 --duration=5
  if [ "${RPC_BENCH_SET:-all}" = all ]; then
    bench backward_m1024 --rpc=backward --m=1024 --k=4096 --v=32768 --requests=6
    bench fetch_gradient --rpc=fetch-gradient --m=1024 --k=4096 --v=32768 --requests=6
  fi
}
