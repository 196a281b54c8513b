# shellcheck shell=bash
# --- CUTLASS kernels against cuBLASLt on the cross-entropy's products ---------
# bench/cutlass_gemm_probe.cu: could a GEMM of logitd's own, with the row
# statistics in its epilogue, keep up with the cuBLASLt kernels the walk runs?
# Needs CUTLASS's headers: GPU_CHECK_CUTLASS_DIR, or the pinned nvidia-cutlass
# wheel in deps/ for scripts/fetch-cutlass.sh (the GPU machine has no
# registry). Skipped without them.
step_cutlass() {
  cutlass_wheel=$(find deps -maxdepth 1 -name "nvidia_cutlass-*.whl" 2>/dev/null | head -1)
  if skipped bench || skipped cutlass; then
    note cutlass skip "GPU_CHECK_SKIP"
    return
  fi
  if [ -z "${GPU_CHECK_CUTLASS_DIR:-}" ] && [ -z "$cutlass_wheel" ]; then
    note cutlass skip "no GPU_CHECK_CUTLASS_DIR and no deps/nvidia_cutlass-*.whl"
    return
  fi
  cutlass_dir=${GPU_CHECK_CUTLASS_DIR:-}
  if [ -z "$cutlass_dir" ]; then
    cutlass_dir=$(CUTLASS_WHEEL=$root/$cutlass_wheel scripts/fetch-cutlass.sh /tmp/logitd-cutlass \
      2>>"$out/cutlass.log")
  fi
  if [ -n "$cutlass_dir" ] &&
    cmake -S . -B "$build" -DLOGITD_CUTLASS_DIR="$cutlass_dir" >>"$out/cutlass.log" 2>&1 &&
    ninja -C "$build" -j "$jobs" logitd_cutlass_probe_logits logitd_cutlass_probe_dx \
      logitd_cutlass_probe_dw >>"$out/cutlass.log" 2>&1; then
    cutlass_probes
  else
    note cutlass FAIL "no CUTLASS headers or the probes did not build (see cutlass.log)"
  fi
}

cutlass_probes() {
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
}
