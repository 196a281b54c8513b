# shellcheck shell=bash
# --- the Open Inference Protocol under load: perf_analyzer against logitctl bench --
# Triton's perf_analyzer (PERF_ANALYZER: its path; it ships in tritonclient's
# manylinux wheel and needs libb64 and libcudart.so.12 on LD_LIBRARY_PATH:
# scripts/fetch-perf-analyzer.sh puts all three in one folder)
# calls model "head" (a registered random [32768, 4096] weight) over the OIP;
# logitctl bench calls the same shape over logitd's own RPC, in the same run.
# M=16 over plain gRPC; M=1024 through system shared memory (its 128 MiB of
# logits are over the 4 MiB message limit).

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

step_oip() {
  if skipped oip || skipped rpc; then note oip skip "GPU_CHECK_SKIP"; return; fi
  if [ -z "${PERF_ANALYZER:-}" ] || [ ! -x "${PERF_ANALYZER:-}" ]; then
    note oip skip "PERF_ANALYZER is not set to an executable perf_analyzer"
    return
  fi
  if ! have_server_and_client; then
    note oip skip "logitd or logitctl was not built (see build.log)"
    return
  fi
  : >"$out/oip.log"
  oip_rc=0
  if start_server "$out/oip_server.log" --allow_shm &&
    make_head "$out/oip_head.safetensors" >>"$out/oip.log" 2>&1 &&
    "$(find_bin logitctl)" --server="127.0.0.1:$port" weights register "$out/oip_head.safetensors" \
      --tensor=w --name=head >>"$out/oip.log" 2>&1; then
    rm -f "$out/oip_head.safetensors"
    oip_runs
    if [ $oip_rc -eq 0 ]; then note oip ok "oip.log, oip_*.csv"
    else note oip FAIL "see oip.log"; fi
  else
    note oip FAIL "the server or the weight did not come up (see oip.log, oip_server.log)"
  fi
  stop_server
}

# Each perf_analyzer run next to logitctl bench on the same shape.
oip_runs() {
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
}
