# shellcheck shell=bash
# --- golden baselines across server restarts ---------------------------------
# A baseline recorded against a fresh server is compared after each of
# GOLDEN_RESTARTS restarts: with no flag (the default per-user algorithm cache,
# here under XDG_STATE_HOME=$gdir/state; every restart must pass), then with
# --algo_cache=none (the count that differ is reported). Then the fresh
# container's case: an empty state directory against the default baseline,
# which passes or fails naming both algorithms and both results' bounds.
# Last, every suite once with --baseline after a restart with no flag.

golden_round() {  # golden_round LABEL VALIDATE_ARGS...; SERVER_ARGS in golden_server_args
  if XDG_STATE_HOME="$golden_state" start_server "$out/golden_server.log" \
      "${golden_server_args[@]}"; then
    echo "=== $1: logitctl validate $*" >>"$out/golden.log"
    timeout "${VALIDATE_TIMEOUT:-300}" "$(find_bin logitctl)" validate --server="127.0.0.1:$port" \
      "${@:2}" >>"$out/golden.log" 2>&1
    round_rc=$?
  else
    round_rc=2
  fi
  stop_server
  echo "=== $1: exit $round_rc" >>"$out/golden.log"
  return $round_rc
}

step_golden() {
  if skipped golden; then note golden skip "GPU_CHECK_SKIP"; return; fi
  if ! have_server_and_client; then note golden skip "logitd or logitctl was not built"; return; fi
  gdir=$(mktemp -d)
  : >"$out/golden.log"
  golden_rc=0
  restarts=${GOLDEN_RESTARTS:-5}
  golden_state="$gdir/state"
  for mode in default none; do
    golden_server_args=()
    [ "$mode" = none ] && golden_server_args=(--algo_cache=none)
    golden_round "$mode record" --suite=golden --record="$gdir/golden_$mode.json" || golden_rc=1
    differ=0
    for i in $(seq 1 "$restarts"); do
      golden_round "$mode restart $i" --suite=golden --baseline="$gdir/golden_$mode.json" \
        || differ=$((differ + 1))
    done
    echo "golden ($mode): $differ of $restarts restarts differ from the baseline" >>"$out/golden.log"
    eval "differ_$mode=$differ"
  done
  golden_server_args=()
  golden_state="$gdir/fresh"
  if golden_round "fresh state directory" --suite=golden --baseline="$gdir/golden_default.json"; then
    fresh="passes"
  else
    fresh="differs ($(grep -c "other GEMM algorithms" "$out/golden.log") cases name both algorithms)"
  fi
  golden_state="$gdir/state"
  golden_round "all suites" --baseline="$gdir/golden_default.json" --json "$out/validate_baseline.json" \
    || golden_rc=1
  cp "$gdir/state/logitd/algo_cache.json" "$out/algo_cache.json" 2>/dev/null
  if [ "$golden_rc" -eq 0 ] && [ "$differ_default" -eq 0 ]; then
    note golden ok "no flag: 0 of $restarts restarts differ; --algo_cache=none: $differ_none of $restarts; a fresh state directory $fresh; all suites pass with --baseline"
  else
    note golden FAIL "no flag: $differ_default of $restarts restarts differ; --algo_cache=none: $differ_none; see golden.log"
  fi
  grep -E "^golden|FAILED|differ" "$out/golden.log" | head -20
  rm -rf "$gdir"
}
