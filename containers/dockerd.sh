#!/usr/bin/env bash
# A Docker daemon of lmforge's own, as CI runs it: `containers/dockerd.sh start` starts dockerd (as root)
# on a socket of its own with its own data and state folders, and prints the `export DOCKER_HOST=...`
# line that points the docker CLI (and lmforge) at it; `containers/dockerd.sh stop` stops it (SIGTERM:
# dockerd stops its containers, then itself). Safe to run again: `start` reuses a daemon that answers.
#
# No network of the machine changes: --bridge=none creates no docker0 bridge (no private-range
# network), --iptables=false and --ip-forward=false add no firewall rule and leave the sysctls alone.
# Containers then run with --network host, bound to loopback, which lmforge's images accept
# (SAGEMAKER_BIND_TO_PORT); a published port (-p) has no bridge to go through and is refused.
#
# LMFORGE_DOCKERD_DIR (default /run/lmforge-dockerd): the socket, pid file, log and runtime state;
# LMFORGE_DOCKERD_DATA (default /var/lib/lmforge-dockerd): images, layers, build cache.
set -euo pipefail
dir=${LMFORGE_DOCKERD_DIR:-/run/lmforge-dockerd}
data=${LMFORGE_DOCKERD_DATA:-/var/lib/lmforge-dockerd}
sock="unix://$dir/docker.sock"
# the Debian CLI beside the daemon (any docker CLI can talk to it; this one is there whenever dockerd is)
cli=$(command -v docker || true)
[ -x /usr/bin/docker ] && cli=/usr/bin/docker

answers() { [ -n "$cli" ] && DOCKER_HOST="$sock" timeout 10 "$cli" info >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if answers; then echo "export DOCKER_HOST=$sock"; exit 0; fi
    command -v dockerd >/dev/null 2>&1 || {
      echo "dockerd.sh: dockerd is not installed (Debian/Ubuntu: apt-get install docker.io)" >&2; exit 1; }
    [ "$(id -u)" -eq 0 ] || { echo "dockerd.sh: dockerd needs root" >&2; exit 1; }
    mkdir -p "$dir" "$data"
    setsid dockerd --host "$sock" --pidfile "$dir/dockerd.pid" --exec-root "$dir/exec" --data-root "$data" \
      --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
      </dev/null >>"$dir/dockerd.log" 2>&1 &
    for _ in $(seq 1 120); do
      if answers; then echo "export DOCKER_HOST=$sock"; exit 0; fi
      kill -0 $! 2>/dev/null || break
      sleep 0.5
    done
    echo "dockerd.sh: dockerd did not answer on $sock; the end of $dir/dockerd.log:" >&2
    tail -n 20 "$dir/dockerd.log" >&2 || true
    exit 1
    ;;
  stop)
    pid=$(cat "$dir/dockerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      # dockerd gives its containers 15 s to stop, then kills them, then exits
      for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "dockerd.sh: dockerd ($pid) still runs 60 s after SIGTERM: killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
        sleep 1
      fi
    fi
    # dockerd leaves its network namespace mounted under its state folder: unmount what is left there
    awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts 2>/dev/null | sort -r |
      while read -r mount; do umount "$mount" 2>/dev/null || true; done
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
