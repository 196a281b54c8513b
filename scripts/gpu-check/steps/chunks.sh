# shellcheck shell=bash
# --- chunk size: the one-client M=1024 logits call at several --chunk_bytes --
# One server per size (server and client chunks equal), each run with its
# Probe, so each ratio comes from one run.
step_chunks() {
  if skipped rpc || skipped chunks; then note chunks skip "GPU_CHECK_SKIP"; return; fi
  if ! have_server_and_client; then
    note chunks skip "logitd or logitctl was not built (see build.log)"
    return
  fi
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
}
