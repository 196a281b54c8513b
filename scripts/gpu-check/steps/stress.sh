# shellcheck shell=bash
# --- stress: many clients, every tensor RPC, random and odd shapes ------------
# `logitctl stress` with 16 clients for STRESS_SECONDS: every result checked,
# 0 errors, wrong results and hung calls required. Then a subset (4 clients,
# small shapes) with logitd under compute-sanitizer memcheck: 0 reports.

step_stress() {
  if skipped stress; then note stress skip "GPU_CHECK_SKIP"; return; fi
  if ! have_server_and_client; then note stress skip "logitd or logitctl was not built"; return; fi
  : >"$out/stress.log"
  stress_secs=${STRESS_SECONDS:-300}
  mem_before=$(gpu_memory)
  mem_during="(no server)"
  if start_server "$out/stress_server.log"; then
    timeout $((stress_secs + 240)) "$(find_bin logitctl)" --server="127.0.0.1:$port" stress \
      --clients=16 --duration="$stress_secs" --json >"$out/stress.txt" 2>>"$out/stress.log"
    stress_rc=$?
    mem_during=$(gpu_memory)
  else
    stress_rc=2
  fi
  stop_server
  mem_after=$(gpu_memory)
  line=$(grep -E "^stress: [0-9]+ calls" "$out/stress.txt" | head -1)
  echo "GPU memory used: before $mem_before, at the end of the run $mem_during, after the server stopped $mem_after" >>"$out/stress.log"
  if [ "$stress_rc" -eq 0 ]; then note stress ok "$line; GPU memory $mem_before -> $mem_during -> $mem_after"
  else note stress FAIL "exit $stress_rc: $line (see stress.log)"; fi
  sanitizer=$(find_sanitizer)
  if [ -n "$sanitizer" ] && ! skipped sanitize; then stress_under_sanitizer; fi
}

# The subset under memcheck, noted as stress-san.
stress_under_sanitizer() {
  : >"$out/stress_sanitizer.log"
  server_wrapper=("$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20)
  if start_server "$out/stress_sanitizer.log"; then
    timeout $((${STRESS_SANITIZER_SECONDS:-60} + 240)) "$(find_bin logitctl)" \
      --server="127.0.0.1:$port" stress --clients=4 --duration="${STRESS_SANITIZER_SECONDS:-60}" \
      --stress_max_m=256 --stress_max_v=4097 --stress_max_k=1000 >>"$out/stress_sanitizer.log" 2>&1
    san_stress_rc=$?
  else
    san_stress_rc=2
  fi
  stop_server
  # shellcheck disable=SC2034  # read by start_server
  server_wrapper=()
  san_line=$(grep -E "ERROR SUMMARY" "$out/stress_sanitizer.log" | tail -1)
  calls_line=$(grep -E "^stress: [0-9]+ calls" "$out/stress_sanitizer.log" | tail -1)
  # Judged by the tool's summary: logitd ends through _Exit after its
  # shutdown grace, whose status compute-sanitizer cannot always read
  # ("couldn't find exit code", exit 1).
  if [ "$san_stress_rc" -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$out/stress_sanitizer.log"; then
    note stress-san ok "${san_line:-no summary} (${calls_line})"
  else
    note stress-san FAIL "stress exit $san_stress_rc, sanitizer exit $server_rc: ${san_line:-no summary}"
  fi
}
