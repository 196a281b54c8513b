# shellcheck shell=bash
# --- every GEMM configuration the tuner may pick, alone, on odd shapes -----
# logitd_gemm_sweep runs each in a child process with a hang watchdog; it
# exits non-zero when a configuration the tuner lists hangs, faults, fails
# or gives a wrong result (the "offered" and "forced" sets are for evidence).
step_sweep() {
  if skipped sweep; then note sweep skip "GPU_CHECK_SKIP"; return; fi
  sweep_bin=$(find_bin logitd_gemm_sweep)
  if [ -z "$sweep_bin" ]; then
    note sweep FAIL "logitd_gemm_sweep was not built"
  elif timeout $((${SWEEP_SECONDS:-120} + 60)) "$sweep_bin" --max_seconds="${SWEEP_SECONDS:-120}" \
    --timeout_ms=2000 ${SWEEP_TOKENS:+--tokens="$SWEEP_TOKENS"} \
    ${SWEEP_SETS:+--sets="$SWEEP_SETS"} >"$out/sweep.log" 2>&1; then
    note sweep ok "$(grep -E '^tuner ' "$out/sweep.log" | tr -s ' ')"
  else
    note sweep FAIL "exit $? (see sweep.log)"
  fi
  sed -n '/^sweep summary/,$p' "$out/sweep.log" 2>/dev/null
}
