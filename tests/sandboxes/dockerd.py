"""A private Docker engine and offline test images, for the docker tests and bench (no pytest here).

The engine is ``dockerd`` with every path in a temporary directory (data, exec root, pid file,
socket), no bridge and no iptables, so it changes nothing on the machine and needs no systemd.
It is started once per process (:func:`shared_dockerd`), exported as ``DOCKER_HOST``, and
stopped with SIGTERM when the process exits.

No image can be pulled here, so the images are imported from rootfs tarballs built on the spot:

- :func:`usr_image`: an empty rootfs meant to run with ``-v /usr:/usr:ro``, so it has the host's
  ``sh``, coreutils and a Python, but not this package: the agent must be injected.
- :func:`nopy_image`: busybox-static plus exactly the glibc libraries the agent bundle needs
  (found with ``ldd``), and no Python at all.
- :func:`busybox_image`: busybox-static alone (no libc): the bundle cannot run there.
"""

from __future__ import annotations

import atexit
import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

__all__ = [
    "Dockerd",
    "DockerUnavailable",
    "bundle_path",
    "busybox_image",
    "nopy_image",
    "nopy_rootfs",
    "shared_dockerd",
    "usr_image",
]

DOCKERD = "/usr/sbin/dockerd"
BUSYBOX = "/bin/busybox"
READY_TIMEOUT = 60.0


class DockerUnavailable(Exception):
    """dockerd, the docker CLI, busybox-static or the agent bundle is missing, or dockerd fails here."""


class Dockerd:
    """A running private dockerd.

    :ivar root: its temporary directory (data, exec root, socket, log).
    :ivar host: its ``DOCKER_HOST`` (``unix://...``).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = f"unix://{root}/docker.sock"
        config = {
            "data-root": f"{root}/data",
            "exec-root": f"{root}/exec",
            "pidfile": f"{root}/dockerd.pid",
            "hosts": [self.host],
            "bridge": "none",
            "iptables": False,
            "ip6tables": False,
        }
        import json

        (root / "daemon.json").write_text(json.dumps(config))
        with open(root / "dockerd.log", "wb") as log:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [DOCKERD, "--config-file", f"{root}/daemon.json"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # setsid: no terminal signals from the test run
            )
        self._images: dict[str, str] = {}
        deadline = time.monotonic() + READY_TIMEOUT
        while self.docker("info", check=False).returncode != 0:  # bounded readiness wait
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "dockerd.log").read_text(errors="replace")[-1500:]
                self.stop()
                raise DockerUnavailable(f"dockerd did not start:\n{tail}")
            time.sleep(0.1)

    def docker(
        self, *args: str, input: bytes | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[bytes]:
        """Run the docker CLI against this engine."""
        env = {**os.environ, "DOCKER_HOST": self.host}
        done = subprocess.run(["docker", *args], input=input, capture_output=True, env=env, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed: {done.stderr.decode(errors='replace')}")
        return done

    def import_rootfs(self, name: str, build: Path) -> str:
        """``docker import`` the directory ``build`` as image ``name`` (once per engine)."""
        if name not in self._images:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(build, ".")
            self.docker("import", "-", name, input=buf.getvalue())
            self._images[name] = name
        return self._images[name]

    def run(self, name: str, image: str, *args: str) -> str:
        """Start ``image`` detached as container ``name`` (``--init``, PID 1 ``sleep infinity``)."""
        self.docker("rm", "-f", name, check=False)
        self.docker("run", "-d", "--init", "--name", name, *args, image, "sleep", "infinity")
        return name

    def stop(self) -> None:
        """SIGTERM the engine (it stops its containers), wait for it, remove its directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


_shared: Dockerd | None = None
_failure: str | None = None


def shared_dockerd() -> Dockerd:
    """The process's private engine, started on first use and stopped at exit.

    :raises DockerUnavailable: it cannot run here (the reason is remembered for later calls).
    """
    global _shared, _failure
    if _failure is not None:
        raise DockerUnavailable(_failure)
    if _shared is None:
        missing = [p for p in (DOCKERD,) if not os.path.exists(p)] + [c for c in ("docker",) if not shutil.which(c)]
        if missing:
            _failure = f"{', '.join(missing)} not installed (bash .ci/setup-docker.sh)"
            raise DockerUnavailable(_failure)
        # Short path: containerd's sockets live under exec-root and must fit in 108 bytes.
        root = Path(tempfile.mkdtemp(prefix="rxd-", dir="/tmp"))
        try:
            _shared = Dockerd(root)
        except DockerUnavailable as exc:
            _failure = str(exc)
            raise
        atexit.register(_shared.stop)
        os.environ["DOCKER_HOST"] = _shared.host  # what the transports under test honour
    return _shared


def _base_rootfs(root: Path) -> None:
    # /sbin is a directory, not a link into /usr: `--init` bind-mounts /sbin/docker-init, which
    # cannot go inside a read-only /usr mounted from the host.
    for d in ("etc", "tmp", "proc", "sys", "dev", "root", "work", "run", "sbin", "usr/bin", "usr/lib", "usr/lib64"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    for f in ("passwd", "group"):
        shutil.copy(f"/etc/{f}", root / "etc" / f)


def usr_image(d: Dockerd) -> str:
    """An empty rootfs to run with ``-v /usr:/usr:ro`` (host tools and Python, not this package)."""
    with tempfile.TemporaryDirectory() as tmp:
        _base_rootfs(Path(tmp))
        return d.import_rootfs("rx-test/usr:1", Path(tmp))


def _add_busybox(root: Path) -> None:
    if not os.path.exists(BUSYBOX):
        raise DockerUnavailable("busybox-static not installed (bash .ci/setup-docker.sh)")
    shutil.copy(BUSYBOX, root / "usr/bin/busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if not (root / "usr/bin" / applet).exists():
            (root / "usr/bin" / applet).symlink_to("busybox")


def bundle_path() -> Path:
    """The agent bundle tarball for this machine.

    :raises DockerUnavailable: not built (``make agent``).
    """
    from remote_exec.errors import AgentUnavailableError
    from remote_exec.sandboxes.bundle import find_bundle

    try:
        return find_bundle(os.uname().machine).path
    except AgentUnavailableError as exc:
        raise DockerUnavailable(str(exc)) from None


def _needed_libs(bundle: Path) -> set[str]:
    """Host paths of the libraries the bundle loads from outside itself (ld-linux included)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(bundle) as tar:
            tar.extractall(tmp, filter="data")
        top = Path(tmp) / "remote-exec-agent"
        internal = top / "_internal"
        libs: set[str] = set()
        # The executable as the dynamic loader starts it; the bundled libraries as the bootloader
        # loads them (their own directory first), so what the bundle ships is not counted.
        files: list[tuple[Path, dict[str, str]]] = [(top / "remote-exec-agent", {})]
        files += [(f, {"LD_LIBRARY_PATH": str(internal)}) for f in internal.rglob("*.so*") if f.is_file()]
        for f, env in files:
            out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, env={**os.environ, **env}).stdout
            libs |= {path for path in re.findall(r"(/\S+) \(0x", out) if not path.startswith(tmp)}
        return libs


def nopy_rootfs(root: Path) -> None:
    """Fill ``root`` with busybox-static and the glibc libraries the bundle needs; no Python anywhere.

    :raises DockerUnavailable: no bundle or no busybox-static.
    """
    libs = _needed_libs(bundle_path())
    _base_rootfs(root)
    _add_busybox(root)
    for lib in libs:
        dest = root / os.path.realpath(os.path.dirname(lib)).lstrip("/") / os.path.basename(lib)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(Path(lib).read_bytes())
        dest.chmod(0o755)


def nopy_image(d: Dockerd) -> str:
    """The :func:`nopy_rootfs` image."""
    if "rx-test/nopy:1" not in d._images:
        with tempfile.TemporaryDirectory() as tmp:
            nopy_rootfs(Path(tmp))
            d.import_rootfs("rx-test/nopy:1", Path(tmp))
    return "rx-test/nopy:1"


def busybox_image(d: Dockerd) -> str:
    """busybox-static alone: a shell, but no libc for the bundle."""
    with tempfile.TemporaryDirectory() as tmp:
        _base_rootfs(Path(tmp))
        _add_busybox(Path(tmp))
        return d.import_rootfs("rx-test/busybox:1", Path(tmp))
