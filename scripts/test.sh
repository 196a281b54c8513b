#!/usr/bin/env bash
# The test command: installs the Debian packages logitd needs (idempotent),
# configures the `ci` preset (Release, test-only fault injection compiled in,
# the cuda backend compiled when nvcc is present), builds everything, runs the
# whole CTest suite (GPU tests skip themselves where no device is visible),
# then the Python client's pytest suite and the wire-protocol conformance
# suite against the freshly built server.
#   usage: scripts/test.sh [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
jobs=$(nproc)
cmake --preset ci
cmake --build --preset ci -j "$jobs"
ctest --preset ci -j "$jobs" "$@"

# The Python client's tests, against the logitd binary just built.
bash scripts/test-python.sh build/ci/server/logitd

# The wire-protocol conformance suite (stubs generated from the proto, stock
# channel options), large outputs included.
bash scripts/conformance.sh --bin build/ci/server/logitd -m "large or not large"
# Again with a bearer token required: the same contract behind authentication.
LOGITD_CONFORMANCE_TOKEN=conformance-token bash scripts/conformance.sh --bin build/ci/server/logitd
