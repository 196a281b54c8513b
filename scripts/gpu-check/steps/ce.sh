# shellcheck shell=bash
# --- fused cross-entropy against PyTorch (same process, same tensors) ----------
step_ce() {
  find_python
  find_capi
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
}
