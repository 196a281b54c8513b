#!/usr/bin/env bash
# Runs the wire-protocol conformance suite (tests/conformance) against a logitd
# server: one already running, or a binary the suite starts itself on a free
# loopback port (cpu backend, a temporary --weights_dir and --history file, --allow_shm).
#
#   scripts/conformance.sh HOST:PORT [PYTEST_ARGS...]
#   scripts/conformance.sh --bin PATH/TO/logitd [PYTEST_ARGS...]
#   e.g. scripts/conformance.sh --bin build/ci/server/logitd -k malformed
#        scripts/conformance.sh gpu-box:50051 -m large    # the >2 GiB test only
#
# The suite uses only stubs generated from proto/logitd/v1/logitd.proto and a
# channel without options (the 4 MiB default receive limit of any gRPC client).
#
# Environment: PYTHON (interpreter for the venv, default python3),
# LOGITD_CONFORMANCE_VENV (venv directory, default build/conformance-venv;
# reused when present), LOGITD_CONFORMANCE_TOKEN (bearer token for a server
# with --auth_tokens), LOGITD_CONFORMANCE_JUNIT (keep the JUnit report there).
# Exits non-zero when a test fails, and also when every test was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
  echo "usage: scripts/conformance.sh HOST:PORT [PYTEST_ARGS...]" >&2
  echo "       scripts/conformance.sh --bin PATH/TO/logitd [PYTEST_ARGS...]" >&2
}

target=()
case "${1:-}" in
  -h | --help)
    usage
    exit 0
    ;;
  "")
    usage
    exit 2
    ;;
  --bin)
    bin=${2:-}
    if [ -z "$bin" ] || [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
      usage
      echo "conformance: '--bin ${bin}' does not name an executable logitd binary" >&2
      exit 2
    fi
    bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
    shift 2
    export LOGITD_BIN="$bin"
    unset LOGITD_CONFORMANCE_SERVER
    ;;
  --bin=*)
    echo "conformance: write '--bin PATH', not '--bin=PATH'" >&2
    exit 2
    ;;
  -*)
    usage
    echo "conformance: the first argument is HOST:PORT or --bin PATH, got '$1'" >&2
    exit 2
    ;;
  *)
    target=(--server "$1")
    shift
    ;;
esac

python=${PYTHON:-python3}
venv=${LOGITD_CONFORMANCE_VENV:-$root/build/conformance-venv}

source "$root/scripts/lib/venv.sh"
make_python_venv conformance "$python" "$venv"

if ! "$venv/bin/python" -c 'import grpc, grpc_tools, google.protobuf, numpy, xxhash, pytest' >/dev/null 2>&1; then
  echo "conformance: installing grpcio, grpcio-tools, protobuf, numpy, xxhash and pytest into $venv"
  "$venv/bin/python" -m pip -q --disable-pip-version-check install \
    grpcio grpcio-tools protobuf numpy xxhash "pytest>=7"
fi

report=${LOGITD_CONFORMANCE_JUNIT:-}
if [ -z "$report" ]; then
  report=$(mktemp "${TMPDIR:-/tmp}/logitd-conformance.XXXXXX.xml")
  trap 'rm -f "$report"' EXIT
fi

rc=0
"$venv/bin/python" -m pytest tests/conformance -p no:cacheprovider -ra \
  --junitxml="$report" "${target[@]}" "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "conformance: pytest failed (exit $rc)" >&2
  exit "$rc"
fi

# pytest exits 0 when everything was skipped: insist that tests ran.
"$venv/bin/python" "$root/scripts/lib/junit_ran.py" conformance "$report"
