# shellcheck shell=bash
# --- the harness against the cuda backend -------------------------------
step_validate() {
  if skipped validate; then note validate skip "GPU_CHECK_SKIP"; return; fi
  logitd_bin=$(find_bin logitd)
  logitctl_bin=$(find_bin logitctl)
  if [ -z "$logitd_bin" ] || [ -z "$logitctl_bin" ]; then
    note validate skip "logitd or logitctl was not built (see build.log)"
    return
  fi
  : >"$out/validate.log"
  if start_server "$out/validate.log"; then
    echo "=== logitctl validate --server=127.0.0.1:$port" >>"$out/validate.log"
    timeout "${VALIDATE_TIMEOUT:-300}" "$logitctl_bin" validate --server="127.0.0.1:$port" \
      --json "$out/validate.json" --report "$out/report" >>"$out/validate.log" 2>&1
    validate_rc=$?
    if [ $validate_rc -eq 0 ]; then note validate ok "all selected checks passed"
    else note validate FAIL "exit $validate_rc (see validate.log)"; fi
    # The report page, opened headless: parsed as HTML and as XML (every
    # inline SVG well formed), every case of the JSON on it with its verdict.
    if python3 scripts/check-report.py "$out/report/index.html" "$out/validate.json" \
      >"$out/report_check.log" 2>&1; then
      note report ok "$(head -1 "$out/report_check.log")"
    else note report FAIL "see report_check.log"; cat "$out/report_check.log"; fi
  else
    note validate FAIL "logitd --backend=cuda did not start (see validate.log)"
  fi
  stop_server
}
