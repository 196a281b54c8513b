# shellcheck shell=bash
# --- PyTorch's outputs judged by Verify (scripts/gpu-check/verify_torch.py) ---
step_verify() {
  if skipped verify; then note verify skip "GPU_CHECK_SKIP"; return; fi
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
