#!/usr/bin/env bash
# Builds logitd and logitctl of another tree on the GPU machine, for an A/B
# comparison in one round (VERIFY_COST_BASELINE of scripts/gpu-check.sh):
#   usage: scripts/gpu-check/build-tree.sh SOURCE.tar.xz BUILD_DIR
# SOURCE.tar.xz is `git archive REV | xz` of the tree (carried in deps/);
# the dependencies are found as gpu-check finds them.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
src=$(mktemp -d)
tar -xJf "$1" -C "$src" || exit 2
out=$(mktemp -d)
only=""
# shellcheck source=lib.sh
source scripts/gpu-check/lib.sh
build=$2  # after lib.sh, which sets gpu-check's own
setup_deps
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOGITD_WITH_CUDA=ON \
  -DLOGITD_BUILD_TESTS=OFF -DLOGITD_BUILD_BENCH=OFF "${prefix_args[@]}" \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
  -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags >"$out/build.log" 2>&1 &&
  ninja -C "$build" -j "$(nproc)" logitd logitctl >>"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
find "$build" -type f -name logitd -perm -u+x -exec cp {} "$build/" \;
echo "build-tree: $build/logitd"
