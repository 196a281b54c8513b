#!/usr/bin/env bash
# Unpacks CUTLASS's headers from PyPI's nvidia-cutlass wheel, pinned, and
# prints the directory to pass as -DLOGITD_CUTLASS_DIR (bench/CMakeLists.txt).
#
#   usage: scripts/fetch-cutlass.sh [DEST]           (default: out/cutlass)
#
# A wheel already at DEST/wheels, or named by CUTLASS_WHEEL, is used as it is
# (a machine without a registry); otherwise pip downloads it there.
set -euo pipefail
version=4.2.0.0
dest=${1:-out/cutlass}
mkdir -p "$dest/wheels"
dest=$(cd "$dest" && pwd)
wheel=${CUTLASS_WHEEL:-$dest/wheels/nvidia_cutlass-$version-py3-none-any.whl}
if [ ! -f "$wheel" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest/wheels" \
    "nvidia-cutlass==$version" >&2
fi
if [ ! -f "$dest/$version/cutlass_library/source/include/cutlass/cutlass.h" ]; then
  rm -rf "${dest:?}/$version"
  python3 - "$wheel" "$dest/$version" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist()
                               if n.startswith("cutlass_library/source/")])
PY
fi
echo "$dest/$version/cutlass_library/source"
