"""Backend "podman": the contract suite through ``podman exec`` into a Python-less container.

Podman runs with a private configuration and store (see :mod:`.podmanenv`); the container is
made from the same Python-less image as the Docker backends, so the agent is injected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import backend, unavailable
from .podmanenv import PodmanUnavailable, shared_podman


@backend("podman")
def _podman(tmp: pytest.TempPathFactory) -> Iterator[str]:
    try:
        podman = shared_podman()
        name = podman.run("rx-contract-podman")
    except PodmanUnavailable as exc:
        unavailable(f"podman: {exc}")
        return
    yield f"podman://{name}"
    podman.podman("rm", "-f", "-t", "0", name, check=False)
