#!/usr/bin/env bash
# The main job: installs what logitd needs, builds logitd and logitctl, starts
# `logitd` on the embedded default backend (--backend=auto: cuda when a GPU is
# visible, else cpu) on a free loopback port, and runs the validation harness
# against it. Without a visible GPU the cuda backend is not compiled (no
# device could run it); LOGITD_WITH_CUDA=ON|OFF|AUTO overrides that choice.
#   usage: scripts/demo.sh [extra `logitctl validate` flags, e.g. --suite=integer_exact]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
cuda=${LOGITD_WITH_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    cuda=AUTO
  else
    cuda=OFF
  fi
fi
echo "demo: building logitd and logitctl (build/demo, LOGITD_WITH_CUDA=$cuda)" >&2
cmake --preset demo -DLOGITD_WITH_CUDA="$cuda" >/dev/null
cmake --build --preset demo -j "$(nproc)" --target logitd logitctl

bin=build/demo
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

rc=0
"$bin/client/logitctl/logitctl" --server="$addr" info
"$bin/client/logitctl/logitctl" --server="$addr" validate --quick "$@" || rc=$?
cat >&2 <<EOT

demo: the binaries are $bin/server/logitd and $bin/client/logitctl/logitctl
demo: a precision gate records a golden baseline once and compares later runs with it:
  $bin/client/logitctl/logitctl --server=HOST:PORT validate --suite=golden --record=golden.json
  $bin/client/logitctl/logitctl --server=HOST:PORT validate --baseline=golden.json
EOT
exit "$rc"
