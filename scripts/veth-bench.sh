#!/usr/bin/env bash
# One client's bytes per second with 1, 2, 4 and 8 streams, on loopback and
# across a veth pair between two network namespaces (which behaves like a
# link to another host: its own interface, its own addresses, no loopback
# shortcut in the kernel), against the same server. Runs as root (it makes
# a namespace and a veth pair, and removes them when it ends).
#
#   usage: scripts/veth-bench.sh LOGITD LOGITCTL OUT_DIR [logitd flags...]
#
# The server runs in the namespace and listens on its veth address and on
# loopback there; the client runs outside for the veth rows and inside for
# the loopback rows. Each row is a `logitctl bench` run whose JSON is kept in
# OUT_DIR; veth.txt is the table of both. Environment:
#   VETH_M, VETH_K, VETH_V   the Logits shape (default 8192 x 4096 x 32768:
#                           1 GiB of fp32 Y; 8192 x 16 x 32768 on a cpu server)
#   VETH_REQUESTS           requests per stream and row (default 4)
#   VETH_BACKEND            logitd --backend (default cpu)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/port-file.sh
source "$(dirname "$(readlink -f "$0")")/lib/port-file.sh"
if [ $# -lt 3 ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
logitd=$(readlink -f "$1")
logitctl=$(readlink -f "$2")
out=$3
shift 3
mkdir -p "$out"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "veth-bench: needs root and iproute2 (ip) to make a namespace and a veth pair" >&2
  exit 2
fi
backend=${VETH_BACKEND:-cpu}
if [ "$backend" = cpu ]; then k_default=16; else k_default=4096; fi
m=${VETH_M:-8192} k=${VETH_K:-$k_default} v=${VETH_V:-32768}
requests=${VETH_REQUESTS:-4}
ns=logitd-veth-$$
host_if=lvh$$ ns_if=lvn$$
host_ip=10.213.0.1 ns_ip=10.213.0.2

server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  ip link del "$host_if" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$ns"
ip link add "$host_if" type veth peer name "$ns_if"
ip link set "$ns_if" netns "$ns"
ip addr add "$host_ip/30" dev "$host_if"
ip link set "$host_if" up
ip netns exec "$ns" ip addr add "$ns_ip/30" dev "$ns_if"
ip netns exec "$ns" ip link set "$ns_if" up
ip netns exec "$ns" ip link set lo up
echo "veth-bench: $host_if ($host_ip) <-> $ns_if ($ns_ip) in namespace $ns, mtu $(cat /sys/class/net/$host_if/mtu)"

# One server, on every address of the namespace: the veth rows reach it
# from outside, the loopback rows from inside.
port_file=$(mktemp)
rm -f "$port_file"
ip netns exec "$ns" "$logitd" --backend="$backend" --address=0.0.0.0:0 --port_file="$port_file" \
  --insecure_allow_remote "$@" >"$out/veth_server.log" 2>&1 &
server_pid=$!
wait_for_port_file "$port_file" "$server_pid" || true  # no port is reported below
port=$(tr -dc '0-9' <"$port_file" 2>/dev/null || true)
rm -f "$port_file"
if [ -z "$port" ]; then
  echo "veth-bench: logitd did not start (see $out/veth_server.log)" >&2
  exit 1
fi

status=0
row() {  # row LINK NAME ARGS...: one bench run over LINK (loopback or veth)
  local link=$1 name=$2
  shift 2
  local run=()
  if [ "$link" = loopback ]; then
    run=(ip netns exec "$ns" "$logitctl" --server="127.0.0.1:$port")
  else
    run=("$logitctl" --server="$ns_ip:$port")
  fi
  if ! timeout 300 "${run[@]}" bench --m="$m" --k="$k" --v="$v" "$@" --json \
      >"$out/veth_${link}_${name}.json" 2>>"$out/veth.log"; then
    echo "veth-bench: $link $name failed (see veth.log)" >&2
    status=1
  fi
}
for link in loopback veth; do
  for n in 1 2 4 8; do
    row "$link" "probe_streams_${n}_one_connection" --rpc=baseline --concurrency="$n" --channels=1 \
      --requests=$((requests * n))
    row "$link" "probe_streams_${n}_connections" --rpc=baseline --concurrency="$n" --channels="$n" \
      --requests=$((requests * n))
    row "$link" "logits_connections_${n}" --rpc=logits --connections="$n" --requests="$requests" \
      --nobaseline
  done
done

python3 - "$out" <<'EOF' | tee "$out/veth.txt"
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "veth_*_*.json"))):
    base = os.path.basename(path)[len("veth_"):-len(".json")]
    link, _, name = base.partition("_")
    try:
        phase = json.load(open(path))["phases"][0]
    except (ValueError, KeyError, IndexError):
        continue
    rows.setdefault(name, {})[link] = phase
print("| run | loopback GB/s down | veth GB/s down | loopback p50 ms | veth p50 ms |")
print("|---|---|---|---|---|")
for name in sorted(rows, key=lambda n: (n.split("_")[0], int("".join(c for c in n.split("_")[2] if c.isdigit()) or 0) if len(n.split("_")) > 2 else 0, n)):
    r = rows[name]
    def f(link, key, sub=None):
        p = r.get(link)
        if p is None:
            return "-"
        v = p[key][sub] if sub else p[key]
        return "%.2f" % v
    print("| %s | %s | %s | %s | %s |" % (name, f("loopback", "down_gb_s"), f("veth", "down_gb_s"),
                                          f("loopback", "latency_ms", "p50"), f("veth", "latency_ms", "p50")))
EOF
exit "$status"
