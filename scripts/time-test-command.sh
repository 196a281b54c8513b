#!/usr/bin/env bash
# Times the test command as docs/OPERATIONS.md ("The test command") states
# it: `.ci/run` on a fresh clone of HEAD, RUNS times one after the other,
# each step's seconds (scripts/test.sh's "test.sh: STEP (HH:MM:SS)" marks)
# and test counts read off its log, then the median of the runs. Prints the
# table's column with the commit, the date, the machine (cores, CPU, memory)
# and the load average before and after each run, so that the document's
# numbers are this script's output rather than anyone's arithmetic.
# With --demo it times the README's other command, `scripts/demo.sh`, the
# same way (the README's figure): the whole run and, off the build tree's
# .ninja_log, the compile from its first job to its last.
#   usage: scripts/time-test-command.sh [--demo] [RUNS] [LOG_DIR]   (RUNS default 3)
# Exit status: 0 when every run passed, else the first failing run's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
command=".ci/run"
if [ "${1:-}" = --demo ]; then
  command="scripts/demo.sh"
  shift
fi
runs=${1:-3}
logs=${2:-$(mktemp -d)}
mkdir -p "$logs"
commit=$(git rev-parse --short HEAD)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
echo "time-test-command: $runs run(s) of $command at $commit on $(nproc) cores ($cpu, $mem); logs in $logs" >&2

# The steps of one log (scripts/test.sh's marks), as "name: seconds" lines,
# the whole run from the first mark to the last at the end.
steps_of() {
  awk '/^test\.sh: .* \([0-9][0-9]:[0-9][0-9]:[0-9][0-9]\)$/ {
    t = $NF; gsub(/[()]/, "", t); split(t, a, ":"); s = a[1] * 3600 + a[2] * 60 + a[3]
    name = $0; sub(/^test\.sh: /, "", name); sub(/ \([^)]*\)$/, "", name)
    if (n++) print "  " pname ": " (s - ps + 86400) % 86400 " s"; else first = s
    pname = name; ps = s
  }
  END { if (n) print "  marks, first to last: " (ps - first + 86400) % 86400 " s (the last step, " pname ", runs to the end)" }' "$1"
}

status=0
declare -a wholes=()
for i in $(seq 1 "$runs"); do
  dir=$(mktemp -d)
  git clone -q . "$dir/clone"
  before=$(cut -d' ' -f1-3 /proc/loadavg)
  start=$(date +%s)
  (cd "$dir/clone" && bash "$command") >"$logs/run-$i.log" 2>&1
  rc=$?
  end=$(date +%s)
  after=$(cut -d' ' -f1-3 /proc/loadavg)
  [ "$rc" -ne 0 ] && [ "$status" -eq 0 ] && status=$rc
  echo "## run $i: exit $rc, $((end - start)) s, load average $before before, $after after"
  steps_of "$logs/run-$i.log"
  if [ -f "$dir/clone/build/demo/.ninja_log" ]; then
    awk 'NR > 1 { if (first == "" || $1 < first) first = $1; if ($2 > last) last = $2; n++ }
      END { printf "  build: %d s, %d jobs (build/demo/.ninja_log)\n", (last - first) / 1000, n }' \
      "$dir/clone/build/demo/.ninja_log"
  fi
  # Counts: each ctest stage's tests, pytest's, the conformance runs'.
  grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$logs/run-$i.log" |
    sed 's/^/  ctest: /'
  grep -oE '[0-9]+ passed(, [0-9]+ [a-z]+)* in [0-9.]+s' "$logs/run-$i.log" |
    sed 's/^/  pytest: /'
  wholes+=("$((end - start))")
  rm -rf "$dir"
done
if [ "$runs" -gt 0 ]; then
  median=$(printf '%s\n' "${wholes[@]}" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  echo "## median of $runs ($command): $median s ($(awk -v s="$median" 'BEGIN {printf "%.1f", s / 60}') min), $commit, $(date -u +%F), $(nproc) cores"
fi
exit "$status"
