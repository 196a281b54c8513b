# shellcheck shell=bash
# Sourced by the scripts that run Python test suites: make_python_venv
# creates (or reuses) a virtual environment with pip, installing Debian's
# python3-venv first where `python3 -m venv` lacks it.
#
#   make_python_venv TOOL PYTHON VENV
#   TOOL names the caller in messages; exits 2 when no venv can be made.

make_python_venv() {
  local tool=$1 python=$2 venv=$3
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "$tool: $python not found (on Debian: apt-get install python3)" >&2
    exit 2
  fi
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p "$(dirname "$venv")"
  rm -rf "$venv"
  if "$python" -m venv "$venv" >/dev/null 2>&1; then
    return 0
  fi
  # Debian's python3 needs the python3-venv package (ensurepip) for `python3 -m venv`.
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$tool: '$python -m venv' failed and apt-get is not available to install python3-venv" >&2
    exit 2
  fi
  local pyver
  pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  echo "$tool: installing python3-venv (python${pyver}-venv) for '$python -m venv'"
  local sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv "python${pyver}-venv" >/dev/null ||
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  rm -rf "$venv"
  "$python" -m venv "$venv" >/dev/null 2>&1 || {
    echo "$tool: '$python -m venv $venv' failed" >&2
    exit 2
  }
}
