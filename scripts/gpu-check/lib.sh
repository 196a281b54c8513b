# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh in the repository root, with root, out and only (the
# steps named) set: the setup, and what the steps share (the summary, the build, the
# servers they start, the python with torch).

build=${GPU_CHECK_BUILD:-/tmp/logitd-gpu-build}
skip=" ${GPU_CHECK_SKIP:-} "
jobs=$(nproc)
summary=()
note() {  # note STEP STATUS DETAIL
  summary+=("$(printf '%-10s %-5s %s' "$1" "$2" "$3")")
  echo "gpu-check: $1: $2 $3"
}
skipped() { [[ "$skip" == *" $1 "* ]]; }
# Whether the command line chose STEP (every step when it named none).
selected() { [ -z "$only" ] || [[ "$only " == *" $1 "* ]]; }

# The GPU image keeps cmake, ninja and the PyTorch python here.
if [ -d /opt/torch/.venv/bin ]; then export PATH=/opt/torch/.venv/bin:$PATH; fi

bail() {  # bail EXIT_STATUS: ends the round early with what the summary has so far
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  exit "$1"
}

# --- dependencies --------------------------------------------------------
setup_deps() {
  prefix_args=()
  have_system_grpc=no
  for d in /usr/lib/x86_64-linux-gnu/cmake/grpc /usr/lib/cmake/grpc /usr/local/lib/cmake/grpc; do
    if [ -f "$d/gRPCConfig.cmake" ]; then have_system_grpc=yes; fi
  done
  if [ "$have_system_grpc" = no ]; then
    if [ -f deps/deps.tar.xz ]; then
      if [ ! -d /tmp/dep/sysroot/usr ]; then
        mkdir -p /tmp/dep && tar -xJf deps/deps.tar.xz -C /tmp/dep
      fi
      prefix_args=(-DCMAKE_PREFIX_PATH=/tmp/dep/sysroot/usr
                   -DProtobuf_PROTOC_EXECUTABLE=/tmp/dep/sysroot/usr/bin/protoc-wrap)
      note deps ok "prefix from deps/deps.tar.xz"
    else
      note deps FAIL "no system gRPC and no deps/deps.tar.xz (see docs: make-dep-prefix.sh)"
      bail 2
    fi
  else
    note deps ok "system packages"
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | sed 's/^/gpu-check: device: /'
}

# --- configure and build --------------------------------------------------
setup_build() {
  if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOGITD_ENABLE_TEST_FAULTS=ON \
      -DLOGITD_WITH_CUDA=ON "${prefix_args[@]}" \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
      -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags >"$out/build.log" 2>&1; then
    note configure FAIL "see build.log"
    tail -30 "$out/build.log"
    bail 1
  fi
  start=$(date +%s)
  # -k 0: one target that fails to build must not stop the others (the summary says which).
  # shellcheck disable=SC2086
  ninja -C "$build" -k 0 -j "$jobs" ${GPU_CHECK_TARGETS:-} >>"$out/build.log" 2>&1
  build_rc=$?
  if [ $build_rc -eq 0 ]; then
    note build ok "$(( $(date +%s) - start )) s"
  else
    note build FAIL "some targets failed (see build.log); continuing with what was built"
    grep -E "^FAILED:" "$out/build.log" | head -10
  fi
}

# wait_for_port_file, for start_server.
# shellcheck source-path=SCRIPTDIR source=../lib/port-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/port-file.sh"
find_bin() { find "$build" -type f -name "$1" -perm -u+x 2>/dev/null | head -1; }
# Both logitd and logitctl, for the steps that talk to a server.
have_server_and_client() { [ -n "$(find_bin logitd)" ] && [ -n "$(find_bin logitctl)" ]; }

# start_server LOG ARGS...: starts `logitd --backend=cuda` (or $server_backend) on a free loopback
# port with ARGS, its output appended to LOG; sets server_pid, and port once it
# listens. Fails (port empty) when it does not start within 60 s.
# With server_wrapper set (an array), the server runs under it; with server_bin set, that
# binary instead of the build's.
server_wrapper=()
start_server() {
  local log=$1 port_file
  shift
  port_file=$(mktemp)
  rm -f "$port_file"
  port=""
  "${server_wrapper[@]}" "${server_bin:-$(find_bin logitd)}" --backend="${server_backend:-cuda}" --address=127.0.0.1:0 \
    --port_file="$port_file" "$@" >>"$log" 2>&1 &
  server_pid=$!
  wait_for_port_file "$port_file" "$server_pid" && port=$(tr -dc '0-9' <"$port_file")
  rm -f "$port_file"
  [ -n "$port" ]
}
# Stops the server (under a wrapper: the wrapper's children); server_rc is its exit status.
stop_server() {
  if [ ${#server_wrapper[@]} -gt 0 ]; then pkill -TERM -P "$server_pid" 2>/dev/null
  else kill "$server_pid" 2>/dev/null; fi
  wait "$server_pid" 2>/dev/null
  # shellcheck disable=SC2034  # read by the stress step
  server_rc=$?
}
gpu_memory() { nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | head -1; }
find_sanitizer() { command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null; }

# The python with torch (the example and the benchmarks need it). Looked for
# once, by the first step that needs it, so that a full round looks where it
# always has: just before the example step.
find_python() {
  [ -n "${python+set}" ] && return
  python=""
  for p in /opt/torch/.venv/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then python=$p; break; fi
  done
}
# logitd's engine as a C library, which the benchmarks load into PyTorch's process; looked for once.
find_capi() {
  [ -n "${capi+set}" ] && return
  capi=$(find "$build" -name liblogitd_bench_capi.so 2>/dev/null | head -1)
}

# --- summary ----------------------------------------------------------------
write_summary() {
  [ -s "$out/bench_logitd.json" ] && find_python
  {
    echo
    echo "== gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), out: $out)"
    printf '%s\n' "${summary[@]}"
    if [ -s "$out/bench_logitd.json" ]; then
      py=${python:-python3}
      echo
      "$py" bench/compare.py "$out/bench_logitd.json" "$out/bench_torch.json" 2>&1
    fi
    if [ -s "$out/bench_ce.md" ]; then
      echo
      cat "$out/bench_ce.md"
    fi
    if [ -s "$out/rpc.log" ]; then
      echo
      grep -v "^===" "$out/rpc.log" | head -60
    fi
  } | tee "$out/summary.txt"
}
