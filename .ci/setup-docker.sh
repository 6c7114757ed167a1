#!/usr/bin/env bash
# Backends "docker", "docker-image" and "k8s" (through a kubectl stand-in that drives docker):
# the Docker engine, whose private daemon the tests start themselves (tests/sandboxes/dockerd.py),
# and busybox-static for the Python-less test images. Backend "podman": podman with runc, and
# tini as its --init (tests/sandboxes/podmanenv.py gives it a private config and store).
# The agent bundle they all inject is built by `make test` (target `agent`, PyInstaller from
# the `test` extra).
set -euo pipefail
need=()
[ -x /usr/sbin/dockerd ] || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -x /usr/bin/podman ] || need+=(podman)
[ -x /usr/sbin/runc ] || need+=(runc)
[ -x /usr/bin/tini-static ] || need+=(tini)
if [ ${#need[@]} -gt 0 ]; then
  apt-get install -y --no-install-recommends "${need[@]}"
fi
