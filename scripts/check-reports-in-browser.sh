#!/usr/bin/env bash
# The report pages opened in a real browser: starts logitd (cpu backend) on a
# free loopback port, writes a `logitctl validate --report` page and two
# `logitctl verify --report` pages (a passing and a failing candidate), checks
# each with scripts/check-report.py (parsed, every case with its verdict) and
# scripts/check-report-browser.py (headless Chromium: no console error, every
# plot laid out, the verdict visible), the kept H200 example page too, and
# keeps their screenshots in build/report-screenshots; then the history's
# pages (scripts/check-history-browser.py), screenshots in
# build/history-screenshots.
#
#   scripts/check-reports-in-browser.sh BUILD_DIR      e.g. build/ci
#
# Installs Debian's chromium when missing (with sudo unless root) and Playwright
# for Python into the Python client's venv (LOGITD_PYENV, default build/pyenv).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:?usage: scripts/check-reports-in-browser.sh BUILD_DIR}
logitd=$build/server/logitd
logitctl=$build/client/logitctl/logitctl
venv=${LOGITD_PYENV:-$root/build/pyenv}
shots=$root/build/report-screenshots

if ! command -v chromium >/dev/null; then
  echo "reports-in-browser: installing chromium"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends chromium >/dev/null
fi
source "$root/scripts/lib/venv.sh"
make_python_venv reports-in-browser python3 "$venv"
py=$venv/bin/python
"$py" -m pip -q --disable-pip-version-check install playwright numpy ml_dtypes safetensors

work=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$logitd" --backend=cpu --address=127.0.0.1:0 --port_file="$work/port" --history="$work/history.sqlite3" \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do [ -s "$work/port" ] && break; sleep 0.1; done
server=127.0.0.1:$(tr -dc '0-9' <"$work/port")

# Tensors: X, W, a conforming fp32 candidate and the same rounded to bf16.
"$py" - "$work" <<'PY'
import sys
import ml_dtypes, numpy as np
from safetensors.numpy import save_file
d, rng = sys.argv[1], np.random.default_rng(7)
x = rng.standard_normal((16, 1024)).astype(ml_dtypes.bfloat16)
w = rng.standard_normal((96, 1024)).astype(ml_dtypes.bfloat16)
y = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
save_file({"x": x}, f"{d}/x.safetensors")
save_file({"w": w}, f"{d}/w.safetensors")
save_file({"y": y}, f"{d}/good.safetensors")
save_file({"y": y.astype(ml_dtypes.bfloat16).astype(np.float32)}, f"{d}/bf16.safetensors")
PY

"$logitctl" --server="$server" validate --suite=special_values,determinism,backward_contract \
  --quick --json="$work/validate.json" --report="$work/validate" >/dev/null
"$logitctl" --server="$server" verify --op=logits --x="$work/x.safetensors" \
  --w="$work/w.safetensors" --candidate="$work/good.safetensors" \
  --json="$work/verify-pass.json" --report="$work/verify-pass" >/dev/null
rc=0
"$logitctl" --server="$server" verify --op=logits --x="$work/x.safetensors" \
  --w="$work/w.safetensors" --candidate="$work/bf16.safetensors" \
  --json="$work/verify-fail.json" --report="$work/verify-fail" >/dev/null || rc=$?
if [ "$rc" -ne 1 ]; then
  echo "reports-in-browser: bf16 logits passed off as fp32 should exit 1, got $rc" >&2
  exit 1
fi

example=docs/examples/compare-cpu-cuda-h200
python3 scripts/check-report.py "$example/index.html" "$example/report.json" >/dev/null
for page in validate verify-pass verify-fail; do
  json=$work/$page.json
  python3 scripts/check-report.py "$work/$page/index.html" "$json" >/dev/null
done
rm -rf "$shots"
"$py" scripts/check-report-browser.py --screenshots "$shots" "$example/index.html" \
  "$work/validate/index.html" "$work/verify-pass/index.html" "$work/verify-fail/index.html"
echo "reports-in-browser: 4 pages checked; screenshots in $shots"

# The history's pages (the metrics port's /history), over 120 recorded runs.
"$py" -c "import logitd" 2>/dev/null || "$py" -m pip -q --disable-pip-version-check install ./client/python
"$py" scripts/check-history-browser.py --logitd "$logitd" --screenshots "$root/build/history-screenshots"
