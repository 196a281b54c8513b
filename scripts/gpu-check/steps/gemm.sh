# shellcheck shell=bash
# --- benchmarks: the GEMM engine alone (logitd_kernel_bench) ---------------------
# Noted as "bench"; GPU_CHECK_SKIP=bench or gemm skips it and the torch step.
step_gemm() {
  find_capi
  if skipped bench || skipped gemm; then note bench skip "GPU_CHECK_SKIP"; return; fi
  bench_bin=$(find_bin logitd_kernel_bench)
  if [ -z "$bench_bin" ]; then
    note bench FAIL "logitd_kernel_bench was not built"
  else
    if "$bench_bin" --json "$out/bench_logitd.json" --shapes "${BENCH_SHAPES:-all}" \
      --reps "${BENCH_REPS:-30}" >"$out/bench.log" 2>&1; then
      note bench ok "bench_logitd.json"
    else note bench FAIL "see bench.log"; tail -5 "$out/bench.log"; fi
  fi
}
