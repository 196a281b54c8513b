# shellcheck shell=bash
# --- one client's streams on loopback and across a veth pair ------------------
# scripts/veth-bench.sh against logitd --backend=cuda: the Probe from 1, 2, 4
# and 8 streams (one connection, and as many) and the 1 GiB Logits call over
# 1, 2, 4 and 8 connections, each on loopback and from another network
# namespace. Needs root and iproute2; skipped without them.
step_veth() {
  if skipped rpc || skipped veth; then note veth skip "GPU_CHECK_SKIP"; return; fi
  if ! have_server_and_client; then
    note veth skip "logitd or logitctl was not built (see build.log)"
    return
  fi
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
    note veth skip "needs root and iproute2 (ip) for a namespace and a veth pair"
    return
  fi
  if VETH_BACKEND="${server_backend:-cuda}" timeout "${VETH_TIMEOUT:-400}" \
      "$root/scripts/veth-bench.sh" "$(find_bin logitd)" "$(find_bin logitctl)" "$out" \
      >"$out/veth_step.log" 2>&1; then
    note veth ok "veth.txt, veth_*.json"
  else
    note veth FAIL "see veth_step.log, veth.log"
  fi
}
