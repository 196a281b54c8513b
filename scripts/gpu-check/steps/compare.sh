# shellcheck shell=bash
# --- A/B: the cpu backend against the cuda backend ----------------------------
# `logitctl validate --compare`: every suite's requests to both servers, per
# output the bitwise-equal fraction, ULP distances and each side's error as a
# fraction of its bound; exit 0 when both sides are inside their bounds.
step_compare() {
  if skipped validate || skipped compare; then note compare skip "GPU_CHECK_SKIP"; return; fi
  if ! have_server_and_client; then
    note compare skip "logitd or logitctl was not built (see build.log)"
    return
  fi
  : >"$out/compare.log"
  server_backend=cpu
  start_server "$out/compare_cpu.log"
  cpu_pid=$server_pid cpu_port=$port
  # shellcheck disable=SC2034  # read by start_server
  server_backend=cuda
  if [ -n "$cpu_port" ] && start_server "$out/compare.log"; then
    # shellcheck disable=SC2086
    timeout "${COMPARE_TIMEOUT:-300}" "$(find_bin logitctl)" validate --server="127.0.0.1:$port" \
      ${COMPARE_ARGS---quick} --compare="127.0.0.1:$cpu_port" --json "$out/compare.json" --report "$out/compare" \
      >>"$out/compare.log" 2>&1
    compare_rc=$?
    if [ $compare_rc -eq 0 ]; then note compare ok "cuda against cpu: both inside their bounds (compare/)"
    else note compare FAIL "exit $compare_rc (see compare.log)"; fi
  else
    note compare FAIL "a server did not start (see compare.log, compare_cpu.log)"
  fi
  stop_server
  kill "$cpu_pid" 2>/dev/null; wait "$cpu_pid" 2>/dev/null
}
