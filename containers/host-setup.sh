#!/usr/bin/env bash
# What building and running lmforge's images needs on the host: a container engine (podman, with
# buildah and runc), mmdebstrap (a base image without a public registry) and a registry server (the
# local ECR). Installs what is missing with apt when run as root on Debian/Ubuntu; elsewhere it says
# what to install. Used by .ci/run and `make demo-image`; safe to run again.
set -euo pipefail
need=()
# a docker CLI with no daemon behind it (common in CI images) does not count as an engine
command -v podman >/dev/null 2>&1 || { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; } || need+=(podman buildah runc)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v docker-registry >/dev/null 2>&1 || command -v registry >/dev/null 2>&1 || need+=(docker-registry)
if [ ${#need[@]} -eq 0 ]; then
  echo "host-setup: container engine, mmdebstrap and registry are installed"
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "host-setup: installing ${need[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  # Debian's registry package starts a service where systemd runs; lmforge starts its own instance
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
  exit 0
fi
echo "host-setup: missing ${need[*]}." >&2
echo "  Install podman (or Docker with buildx, or Debian's docker.io), mmdebstrap and a registry server (Debian/Ubuntu:" >&2
echo "  sudo apt-get install podman buildah runc mmdebstrap docker-registry), then run this again." >&2
exit 1
