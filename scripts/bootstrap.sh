#!/usr/bin/env bash
# Installs the Debian 12 packages logitd builds against. Idempotent: packages
# already present are skipped, so a warm machine pays nothing.
#   usage: scripts/bootstrap.sh [--fuzz]
#   --fuzz also installs clang 14 and its runtime, for the fuzz preset
#   (fuzz/README.md); nothing else needs them.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev libre2-dev libc-ares-dev libssl-dev zlib1g-dev
  libopenblas-dev libxxhash-dev libsqlite3-dev libpq-dev postgresql nlohmann-json3-dev prometheus-cpp-dev libcivetweb-dev libmicrohttpd-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  openssl python3 python3-yaml universal-ctags
)
for arg in "$@"; do
  case "$arg" in
    --fuzz) pkgs+=(clang-14 libclang-rt-14-dev) ;;
    *) echo "usage: scripts/bootstrap.sh [--fuzz]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#pkgs[@]} packages present"
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
