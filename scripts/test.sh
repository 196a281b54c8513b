#!/usr/bin/env bash
# The test command: installs the Debian packages logitd needs (idempotent),
# then builds and runs every test in one of two builds:
#
# 1. Release (the `ci` preset: test-only fault injection compiled in, the
#    cuda backend compiled when nvcc is present, so a CUDA compile error
#    fails here even without a GPU): the server, the CLI, the benchmarks
#    (compiled only) and the tests only this build runs: GPU tests (they
#    skip where no device is visible), large, soak and install tests and the
#    CI gate's shell script (label script). Then
#    the Python client's pytest suite, the report pages in headless
#    Chromium (scripts/check-reports-in-browser.sh) and the wire-protocol
#    conformance suite (twice: plain, and behind a bearer token) against
#    that server.
# 2. AddressSanitizer + UndefinedBehaviorSanitizer (the `asan` preset, cpu
#    backend): every unit, integration and harness test (logitd's code
#    instrumented; the tests' own code and the generated protobuf code not).
#
# Each test runs in one build only; docs/OPERATIONS.md ("The test command")
# has the minutes each step takes.
#   usage: scripts/test.sh [extra ctest args, given to both ctest runs...]
# Environment: LOGITD_SOAK_SECONDS (the soak test's load, default 20 here).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh
jobs=$(nproc)

step() { echo "test.sh: $* ($(date -u +%H:%M:%S))"; }

step "Release build"
cmake --preset ci
cmake --build --preset ci-release -j "$jobs"
LOGITD_SOAK_SECONDS=${LOGITD_SOAK_SECONDS:-20} ctest --preset ci-release -j "$jobs" "$@"

step "the Python client's tests"
bash scripts/test-python.sh build/ci/server/logitd

step "the report pages in a browser"
bash scripts/check-reports-in-browser.sh build/ci

step "the conformance suite"
# Stubs generated from the proto with stock channel options, the >2 GiB Logits
# output included. The 1 GiB outputs of every other call are the Release
# CTest's (DefaultChannelLargeTest, a generated stub on a default channel too);
# the suite's 64 MiB run of the same calls stays.
bash scripts/conformance.sh --bin build/ci/server/logitd -m "large or not large" \
  --deselect tests/conformance/test_large_outputs.py::test_every_call_1_gib_output
# Again with a bearer token required: the same contract behind authentication.
LOGITD_CONFORMANCE_TOKEN=conformance-token bash scripts/conformance.sh --bin build/ci/server/logitd

step "ASan+UBSan build"
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan-ci -j "$jobs" "$@"
step "done"
