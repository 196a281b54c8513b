#!/usr/bin/env bash
# Puts Triton's perf_analyzer, with the two libraries it loads that a GPU
# machine without Triton lacks (libb64.so.0d from Debian's libb64-0d,
# libcudart.so.12 from PyPI's nvidia-cuda-runtime-cu12), in one folder that
# travels to a machine without a registry, for gpu-check's oip step:
#
#   scripts/fetch-perf-analyzer.sh [DEST]            (default: build/pa; downloads in DEST.download)
#   PERF_ANALYZER=DEST/perf_analyzer LD_LIBRARY_PATH=DEST/lib scripts/gpu-check.sh OUT rpc oip
#
# perf_analyzer comes from the tritonclient manylinux wheel (pinned), which
# ships it as a script-less binary in its bin/ data files.
set -euo pipefail
version=2.41.0
dest=${1:-build/pa}
mkdir -p "$dest/lib" "$dest.download"
dest=$(cd "$dest" && pwd)
dl=$dest.download  # beside DEST, so that DEST holds only what travels
if ! ls "$dl"/tritonclient-"$version"-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dl" "tritonclient==$version" >&2
fi
if ! ls "$dl"/nvidia_cuda_runtime_cu12-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dl" "nvidia-cuda-runtime-cu12<13" >&2
fi
if ! ls "$dl"/libb64-0d_*.deb >/dev/null 2>&1; then
  (cd "$dl" && apt-get download libb64-0d >&2)
fi
python3 - "$dl" "$dest" <<'PY'
import glob, os, sys, zipfile
dl, dest = sys.argv[1], sys.argv[2]
def extract(pattern, member_suffix, out):
    wheel = sorted(glob.glob(os.path.join(dl, pattern)))[-1]
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(member_suffix))
        with open(out, "wb") as f:
            f.write(z.read(name))
extract("tritonclient-*.whl", "/bin/perf_analyzer", os.path.join(dest, "perf_analyzer"))
os.chmod(os.path.join(dest, "perf_analyzer"), 0o755)
extract("nvidia_cuda_runtime_cu12-*.whl", "/libcudart.so.12", os.path.join(dest, "lib", "libcudart.so.12"))
PY
deb=$(ls "$dl"/libb64-0d_*.deb | tail -1)
rm -rf "$dl/deb" && dpkg-deb -x "$deb" "$dl/deb"
cp "$dl"/deb/usr/lib/x86_64-linux-gnu/libb64.so.0d "$dest/lib/"
if LD_LIBRARY_PATH=$dest/lib ldd "$dest/perf_analyzer" | grep -q "not found"; then
  echo "fetch-perf-analyzer: perf_analyzer still misses a library:" >&2
  LD_LIBRARY_PATH=$dest/lib ldd "$dest/perf_analyzer" | grep "not found" >&2
  exit 1
fi
echo "$dest/perf_analyzer"
