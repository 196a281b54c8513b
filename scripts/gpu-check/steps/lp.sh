# shellcheck shell=bash
# --- LogProbs against PyTorch (same process, same tensors) --------------------
step_lp() {
  find_python
  find_capi
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
}
