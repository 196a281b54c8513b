#!/usr/bin/env bash
# Installs the Python client (client/python) into a virtual environment under
# build/ and runs its pytest suite against a real logitd server binary, which
# the tests start on a free loopback port with the cpu backend.
#
#   scripts/test-python.sh LOGITD_BIN [PYTEST_ARGS...]
#   e.g. scripts/test-python.sh build/default/server/logitd -k cast
#
# Environment: PYTHON (interpreter for the venv, default python3),
# LOGITD_PYENV (venv directory, default build/pyenv; reused when present).
# Exits non-zero when a test fails, and also when every test was skipped or
# the server tests did not run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() { echo "usage: scripts/test-python.sh LOGITD_BIN [PYTEST_ARGS...]" >&2; }

bin=${1:-}
if [ -z "$bin" ]; then
  usage
  echo "test-python: no logitd binary given (build one with scripts/test.sh or cmake, e.g. build/default/server/logitd)" >&2
  exit 2
fi
shift
if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
  echo "test-python: '$bin' is not an executable logitd binary" >&2
  exit 2
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

python=${PYTHON:-python3}
venv=${LOGITD_PYENV:-$root/build/pyenv}

source "$root/scripts/lib/venv.sh"
make_python_venv test-python "$python" "$venv"

pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
echo "test-python: installing ./client/python into $venv"
# The in-tree build directory is ours; start it clean so no stale module is packaged.
rm -rf client/python/build
# tritonclient[grpc]: Triton's own client, for the Open Inference Protocol tests (test_oip.py).
"${pip[@]}" install ./client/python "pytest>=7" "tritonclient[grpc]"
rm -rf client/python/build

report="$root/build/pytest-python.xml"
rc=0
(
  cd client/python
  LOGITD_BIN="$bin" "$venv/bin/python" -m pytest tests -ra --junitxml="$report" "$@"
) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "test-python: pytest failed (exit $rc)" >&2
  exit "$rc"
fi

# pytest exits 0 when everything was skipped: insist that tests ran, and that
# none was skipped for want of the server.
"$venv/bin/python" "$root/scripts/lib/junit_ran.py" test-python "$report" LOGITD_BIN
