"""A private Podman setup for the ``podman://`` tests (no pytest here).

Podman has no daemon: what must be private is its configuration and storage. Both go in a
temporary directory named by ``CONTAINERS_CONF`` and ``CONTAINERS_STORAGE_CONF``, exported for
the whole process (the transport under test runs the plain ``podman`` CLI). The settings are
the ones measured to work on these machines: runc (crun fails with hybrid cgroups), cgroupfs,
file events, a 20000 open-files limit (root cannot raise the hard limit), and tini as the
``--init`` binary (catatonit is only recommended by the package).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .dockerd import DockerUnavailable, nopy_rootfs

__all__ = ["Podman", "PodmanUnavailable", "shared_podman"]

INIT = "/usr/bin/tini-static"
IMAGE = "localhost/rx-test/nopy:1"


class PodmanUnavailable(Exception):
    """podman, runc or tini is missing, or podman cannot run a container here."""


class Podman:
    """Podman with private configuration and storage under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "containers.conf").write_text(
            "[containers]\n"
            'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
            'netns = "none"\n'
            f'init_path = "{INIT}"\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            "exit_command_delay = 2\n"
        )
        (root / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/storage"\nrunroot = "{root}/run"\n'
        )
        self.env = {"CONTAINERS_CONF": f"{root}/containers.conf", "CONTAINERS_STORAGE_CONF": f"{root}/storage.conf"}
        self._image: str | None = None

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        """Run the podman CLI with the private configuration."""
        done = subprocess.run(["podman", *args], capture_output=True, env={**os.environ, **self.env}, timeout=timeout)
        if check and done.returncode != 0:
            raise PodmanUnavailable(f"podman {' '.join(args)} failed: {done.stderr.decode(errors='replace')}")
        return done

    def image(self) -> str:
        """The Python-less test image (busybox and the bundle's glibc libraries), imported once."""
        if self._image is None:
            with tempfile.TemporaryDirectory() as tmp:
                nopy_rootfs(Path(tmp))
                tar = Path(tmp).parent / f"{Path(tmp).name}.tar"
                try:
                    subprocess.run(["tar", "-C", tmp, "-cf", str(tar), "."], check=True)
                    self.podman("import", str(tar), IMAGE)
                finally:
                    tar.unlink(missing_ok=True)
            self._image = IMAGE
        return self._image

    def run(self, name: str, *args: str) -> str:
        """Start the test image detached as ``name`` (``--init``, PID 1 ``sleep infinity``)."""
        self.podman("rm", "-f", name, check=False)
        self.podman("run", "-d", "--init", "--name", name, *args, self.image(), "sleep", "infinity")
        return name

    def stop(self) -> None:
        """Remove every container of this private store, then the store itself."""
        self.podman("rm", "-f", "-a", "-t", "0", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


_shared: Podman | None = None
_failure: str | None = None


def shared_podman() -> Podman:
    """The process's private Podman, set up on first use and cleaned at exit.

    :raises PodmanUnavailable: it cannot run here (the reason is remembered).
    """
    global _shared, _failure
    if _failure is not None:
        raise PodmanUnavailable(_failure)
    if _shared is None:
        missing = [c for c in ("podman", "runc") if not shutil.which(c)] + [p for p in (INIT,) if not os.path.exists(p)]
        if missing:
            _failure = f"{', '.join(missing)} not installed (bash .ci/setup-docker.sh)"
            raise PodmanUnavailable(_failure)
        podman = Podman(Path(tempfile.mkdtemp(prefix="rxp-", dir="/tmp")))
        try:
            podman.image()
        except (PodmanUnavailable, DockerUnavailable) as exc:
            _failure = str(exc)
            shutil.rmtree(podman.root, ignore_errors=True)
            raise PodmanUnavailable(_failure) from None
        atexit.register(podman.stop)
        os.environ.update(podman.env)  # what the podman:// transport under test runs with
        _shared = podman
    return _shared
