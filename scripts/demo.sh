#!/usr/bin/env bash
# The main job: installs what logitd needs, builds it, starts `logitd` on the
# embedded default backend (--backend=auto: cuda when a GPU is visible, else
# cpu) on a free loopback port, and runs the validation harness against it.
#   usage: scripts/demo.sh [extra `logitctl validate` flags, e.g. --suite=integer_exact]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target logitd logitctl

bin=build/default
work=$(mktemp -d)
"$bin/server/logitd" --backend=auto --address=127.0.0.1:0 --port_file="$work/port" \
  2>"$work/logitd.log" &
server=$!
cleanup() { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

for _ in $(seq 1 300); do
  [ -s "$work/port" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/logitd.log" >&2; exit 2; }
  sleep 0.1
done
[ -s "$work/port" ] || { echo "logitd did not start" >&2; cat "$work/logitd.log" >&2; exit 2; }
addr="127.0.0.1:$(head -n1 "$work/port")"
head -n 3 "$work/logitd.log" >&2

"$bin/client/logitctl/logitctl" --server="$addr" info
"$bin/client/logitctl/logitctl" --server="$addr" validate --quick "$@"
