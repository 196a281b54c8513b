# shellcheck shell=bash
# --- PyTorch's outputs judged by Verify (scripts/gpu-check/verify_torch.py) ---
step_verify() {
  if skipped verify; then note verify skip "GPU_CHECK_SKIP"; return; fi
  if [ "${VERIFY_TORCH:-1}" = 1 ]; then verify_torch; else note verify skip "VERIFY_TORCH=0"; fi
  verify_cost
  if [ "${PROBE:-1}" = 1 ]; then accumulation_probe; else note probe skip "PROBE=0"; fi
}

verify_torch() {
  find_python
  if [ -z "$python" ]; then note verify skip "no python3 with torch"; return; fi
  if ! have_server_and_client; then note verify skip "logitd or logitctl was not built"; return; fi
  : >"$out/verify.log"
  # The candidates' calls are large (logitd's own output beside each, and the weight read back).
  if start_server "$out/verify.log" --max_request_bytes=8000000000; then
    if PYTHONUNBUFFERED=1 timeout "${VERIFY_TIMEOUT:-400}" "$python" \
      scripts/gpu-check/verify_torch.py --logitctl "$(find_bin logitctl)" \
      --server "127.0.0.1:$port" --out "$(mktemp -d)" --json "$out/verify.json" \
      ${VERIFY_SHAPES:+--shapes "$VERIFY_SHAPES"} >>"$out/verify.log" 2>&1; then
      note verify ok "every PyTorch candidate got its expected verdict (verify.log)"
    else
      note verify FAIL "see verify.log"
    fi
    grep "^|" "$out/verify.log"
  else
    note verify FAIL "logitd --backend=cuda did not start (see verify.log)"
  fi
  stop_server
}

# What a Verify of logitd's own output costs against the call itself, at
# VERIFY_COST_SHAPE (MxKxV, default 4096x4096x128256): logits every row and
# 64 rows, the cross-entropy every row and 64 rows (its loss per token, as
# a sampled verify needs), LogProbs every row (logitctl bench --rpc=verify-*).
# With VERIFY_COST_BASELINE (a directory holding the logitd of another
# tree, scripts/gpu-check/build-tree.sh), each run goes to both servers,
# this build's first, so the two are compared on one machine.
# VERIFY_COST_RUNS: "rpc rows [flag]" entries separated by ';' (default the
# five above).
verify_cost() {
  if [ "${VERIFY_COST:-1}" != 1 ]; then note verify-cost skip "VERIFY_COST=0"; return; fi
  local shape=${VERIFY_COST_SHAPE:-4096x4096x128256} m k v line failed=0 which
  IFS=x read -r m k v <<<"$shape"
  : >"$out/verify-cost.log"
  local servers=("this:$(find_bin logitd)")
  [ -n "${VERIFY_COST_BASELINE:-}" ] && servers+=("baseline:$VERIFY_COST_BASELINE/logitd")
  local runs=("verify-logits 0" "verify-logits 64" "verify-cross-entropy 0"
    "verify-cross-entropy 64 --reduction=none" "verify-logprobs 0")
  [ -n "${VERIFY_COST_RUNS:-}" ] && IFS=';' read -r -a runs <<<"$VERIFY_COST_RUNS"
  for run in "${runs[@]}"; do
    read -r rpc rows extra <<<"$run"
    for entry in "${servers[@]}"; do
      which=${entry%%:*}
      server_bin=${entry#*:}
      if ! start_server "$out/verify-cost.log" --max_request_bytes=16000000000 --log_level=debug; then
        note verify-cost FAIL "$which logitd --backend=cuda did not start (see verify-cost.log)"
        failed=1
        continue
      fi
      # shellcheck disable=SC2086 # extra: zero or one flag
      if ! "$(find_bin logitctl)" --server="127.0.0.1:$port" bench --rpc="$rpc" --m="$m" --k="$k" \
        --v="$v" --requests="${VERIFY_COST_REQUESTS:-3}" --warmup=1 --sample_rows="$rows" $extra \
        >>"$out/verify-cost.log" 2>&1; then
        failed=1
      fi
      line=$(grep "^verify cost:" "$out/verify-cost.log" | tail -1)
      echo "$shape $rpc sample_rows=$rows ($which): ${line:-no result}"
      # The server's stages of the last call (its debug log).
      grep "verify VERIFY_" "$out/verify-cost.log" | tail -1
      stop_server
    done
  done
  unset server_bin
  if [ $failed = 0 ]; then note verify-cost ok "$(grep -c "^verify cost:" "$out/verify-cost.log") runs (verify-cost.log)"
  else note verify-cost FAIL "see verify-cost.log"; fi
}

# How the device's GEMMs accumulate against the bound's and the
# precision-class test's models (bench/accumulation_probe.py).
accumulation_probe() {
  find_python
  if [ -z "$python" ]; then note probe skip "no python3 with torch"; return; fi
  if PYTHONUNBUFFERED=1 timeout "${PROBE_TIMEOUT:-300}" "$python" bench/accumulation_probe.py \
    --ks "${PROBE_KS:-1024,4096,16384}" --json "$out/probe.json" >"$out/probe.log" 2>&1; then
    note probe ok "every path within the proven bound (probe.log)"
  else
    note probe FAIL "see probe.log"
  fi
  cat "$out/probe.log"
}
