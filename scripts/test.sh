#!/usr/bin/env bash
# The test command (README and .ci/run): install what the tests need, start a Docker daemon for the docker
# sandbox backend, build its image locally, then the whole suite - the `slow` tests and the adversarial
# corpus (tests/adversarial) included; only `gpu` and `cloud` tests stay out.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# Docker: use a daemon that answers, else start a private one for this run (stopped on exit). As root the
# docker tests must run (CR_REQUIRE_DOCKER=1 turns a missing daemon into failures, never silent skips).
if [ "$(id -u)" = 0 ]; then
  started=$(bash scripts/dockerd.sh start) || exit 1
  eval "$started"
  trap 'bash scripts/dockerd.sh stop' EXIT
  python3 -m composer_replication.datagen.docker_image || exit 1
  export CR_REQUIRE_DOCKER=1
else
  echo "test.sh: not root - no Docker daemon is started; the docker backend's tests skip, saying so" >&2
fi

# Types: mypy over src/ with the checked-in config (pyproject.toml [tool.mypy]); an error fails the run.
python3 -m mypy
types=$?

python3 -m pytest -m "not gpu and not cloud" -p no:cacheprovider "$@"
rc=$?
# pytest exit code 5 = no tests collected: that is a failure of the suite, not a pass.
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
if [ "$types" != 0 ]; then echo "mypy found type errors (above)" >&2; [ "$rc" = 0 ] && rc=1; fi
exit "$rc"
