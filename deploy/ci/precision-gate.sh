#!/usr/bin/env bash
# The precision gate's shell, shared by the GitHub Actions and GitLab CI
# examples (and tested against the cpu backend in the project's own CI):
# `logitctl validate` against the shared logitd with the committed baseline,
# writing the reports into OUT, and, when LOGITD_COMPARE_ADDR is set, the same
# suites against a second server too (an upgrade candidate) with every output
# compared.
#
# Environment:
#   LOGITD_ADDR          gRPC target of the server under test (required)
#   LOGITD_PLATFORM      baseline name: baselines/$LOGITD_PLATFORM.json (required
#                        unless GATE_RECORD=1)
#   LOGITD_COMPARE_ADDR  a second server to compare with (optional)
#   GATE_RECORD=1        record OUT/baseline.json instead of comparing with one
#   GATE_ARGS            more `logitctl validate` arguments (e.g. --quick)
#   LOGITCTL             the logitctl binary (default: the first of logitctl on PATH and
#                        build/{gate,default,demo,ci}/client/logitctl/logitctl, what
#                        the CI examples and the README's commands build)
#   BASELINES            the baselines folder (default baselines)
#   GITHUB_STEP_SUMMARY  when set (GitHub Actions), the report's summary.md is
#                        appended to it
#
#   usage: deploy/ci/precision-gate.sh OUT
# Writes OUT/report.json, OUT/report.xml, OUT/report/ (index.html and
# summary.md), OUT/summary.txt and, with LOGITD_COMPARE_ADDR, OUT/compare.json
# and OUT/compare/. Exit code: 0 every check passed (and the comparison found
# both servers within bounds), 1 a check failed, 2 a server could not be
# reached or refused, or bad options (a missing baseline among them).
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: precision-gate.sh OUT" >&2
  exit 2
fi
out=$1
baselines=${BASELINES:-baselines}
logitctl=${LOGITCTL:-}
if [ -z "$logitctl" ]; then
  for candidate in "$(command -v logitctl 2>/dev/null)" build/{gate,default,demo,ci}/client/logitctl/logitctl; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
      logitctl=$candidate
      break
    fi
  done
fi
if [ -z "$logitctl" ] || [ ! -x "$logitctl" ]; then
  echo "precision-gate: no logitctl${LOGITCTL:+ at $LOGITCTL}: set LOGITCTL, or build it" \
    "(cmake --preset default && cmake --build build/default --target logitctl)" >&2
  exit 2
fi
mkdir -p "$out"
if [ -z "${LOGITD_ADDR:-}" ]; then
  echo "precision-gate: set LOGITD_ADDR to the server's gRPC target" >&2
  exit 2
fi
# shellcheck disable=SC2206
extra=(${GATE_ARGS:-})

summarize() {  # summarize REPORT_DIR
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$1/summary.md" ]; then
    cat "$1/summary.md" >>"$GITHUB_STEP_SUMMARY"
  fi
}

if [ "${GATE_RECORD:-0}" = 1 ]; then
  "$logitctl" --server="$LOGITD_ADDR" validate "${extra[@]}" --record="$out/baseline.json" \
    --junit="$out/report.xml" --json="$out/report.json" --report="$out/report" \
    | tee "$out/summary.txt"
  code=${PIPESTATUS[0]}
  summarize "$out/report"
  exit "$code"
fi

if [ -z "${LOGITD_PLATFORM:-}" ]; then
  echo "precision-gate: set LOGITD_PLATFORM (the baseline is $baselines/\$LOGITD_PLATFORM.json)" >&2
  exit 2
fi
"$logitctl" --server="$LOGITD_ADDR" validate "${extra[@]}" \
  --baseline="$baselines/${LOGITD_PLATFORM}.json" \
  --junit="$out/report.xml" --json="$out/report.json" --report="$out/report" \
  | tee "$out/summary.txt"
code=${PIPESTATUS[0]}
summarize "$out/report"
case "$code" in
  0) ;;
  1) echo "precision-gate: precision checks failed (see $out/report/index.html)" >&2 ;;
  *) echo "precision-gate: logitd at $LOGITD_ADDR unreachable or refused, or bad options (exit $code)" >&2 ;;
esac

if [ -n "${LOGITD_COMPARE_ADDR:-}" ]; then
  # The golden suite's baseline belongs to one platform; the comparison runs
  # every other suite against both servers.
  "$logitctl" --server="$LOGITD_ADDR" validate "${extra[@]}" \
    --suite=integer_exact,rounding_error,backward_contract,special_values,cross_entropy,logprobs \
    --compare="$LOGITD_COMPARE_ADDR" --json="$out/compare.json" --report="$out/compare" \
    | tee "$out/compare.txt"
  compare_code=${PIPESTATUS[0]}
  summarize "$out/compare"
  if [ "$compare_code" -ne 0 ]; then
    echo "precision-gate: the comparison with $LOGITD_COMPARE_ADDR failed (exit $compare_code)" >&2
  fi
  [ "$compare_code" -gt "$code" ] && code=$compare_code
fi
exit "$code"
