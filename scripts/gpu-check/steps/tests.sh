# shellcheck shell=bash
# --- GPU tests ------------------------------------------------------------
step_tests() {
  if skipped tests; then note tests skip "GPU_CHECK_SKIP"; return; fi
  # shellcheck disable=SC2086
  ctest ${GPU_CHECK_CTEST:---preset gpu} --test-dir "$build" --output-on-failure --timeout 900 \
    >"$out/tests.log" 2>&1
  tests_rc=$?
  line=$(grep -E "tests passed|tests failed" "$out/tests.log" | tail -1)
  skipped_count=$(grep -c "(Skipped)" "$out/tests.log" || true)
  if [ $tests_rc -eq 0 ]; then note tests ok "$line ($skipped_count skipped)"
  else note tests FAIL "$line"; grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Not Run" "$out/tests.log" | head -20; fi
}
