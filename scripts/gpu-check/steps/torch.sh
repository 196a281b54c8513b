# shellcheck shell=bash
# --- benchmarks: PyTorch's GEMMs on the same shapes (bench/torch_baseline.py) -----
step_torch() {
  find_python
  find_capi
  if skipped bench || skipped gemm; then
    # The gemm step's "bench skip" stands for both; alone, this step says so itself.
    selected gemm || note torch skip "GPU_CHECK_SKIP"
    return
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
}
