#!/usr/bin/env bash
# A private Docker daemon for one test run (the docker sandbox backend's tests need one).
#
#   eval "$(bash scripts/dockerd.sh start)"   # prints `export DOCKER_HOST=... CR_DOCKERD_DIR=...`
#   bash scripts/dockerd.sh stop              # stops the daemon named by CR_DOCKERD_DIR, removes its files
#
# `start` prints nothing when a daemon already answers (DOCKER_HOST or the default socket): that one is
# used and never stopped. Otherwise it starts `dockerd` (root only) with every path of its own under a
# fresh /tmp/cr-dockerd.* directory (socket, data, exec root, pid file), no bridge and no iptables
# rules (the sandbox runs with --network none), so it touches no other daemon and no host networking.
# It exits non-zero, with the daemon's log, when dockerd cannot start within 60 s.
set -uo pipefail

case "${1:-}" in
start)
  if docker info >/dev/null 2>&1; then exit 0; fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "dockerd.sh: dockerd is not installed (scripts/setup.sh installs docker.io as root)" >&2
    exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "dockerd.sh: starting dockerd needs root" >&2
    exit 1
  fi
  dir=$(mktemp -d /tmp/cr-dockerd.XXXXXX)
  sock="unix://$dir/docker.sock"
  setsid dockerd --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" -H "$sock" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    >"$dir/dockerd.log" 2>&1 </dev/null &
  echo $! >"$dir/launcher.pid"
  for _ in $(seq 1 120); do
    if DOCKER_HOST="$sock" docker info >/dev/null 2>&1; then
      echo "export DOCKER_HOST=$sock CR_DOCKERD_DIR=$dir"
      exit 0
    fi
    sleep 0.5
  done
  echo "dockerd.sh: dockerd did not answer within 60 s; its log:" >&2
  tail -n 30 "$dir/dockerd.log" >&2
  CR_DOCKERD_DIR=$dir bash "$0" stop
  exit 1
  ;;
stop)
  dir=${CR_DOCKERD_DIR:-}
  [ -n "$dir" ] && [ -d "$dir" ] || exit 0
  pid=$(cat "$dir/dockerd.pid" 2>/dev/null || cat "$dir/launcher.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    DOCKER_HOST="unix://$dir/docker.sock" docker ps -aq 2>/dev/null |
      xargs -r env DOCKER_HOST="unix://$dir/docker.sock" docker rm -f >/dev/null 2>&1
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  # Anything the daemon left mounted under its directory (overlay layers, its exec root), deepest first.
  awk -v d="$dir" '$2 ~ "^"d {print $2}' /proc/self/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
