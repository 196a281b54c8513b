# shellcheck shell=bash
# --- compute-sanitizer over the GPU paths -----------------------------------
# memcheck over the backend under mixed small and odd shapes; racecheck and
# synccheck over the backend's own kernels (cast, cross-entropy).

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

step_sanitize() {
  if skipped sanitize; then note sanitize skip "GPU_CHECK_SKIP"; return; fi
  sanitizer=$(find_sanitizer)
  if [ -z "$sanitizer" ]; then note sanitize skip "no compute-sanitizer"; return; fi
  : >"$out/sanitize.log"
  sanitize_rc=0
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
}
