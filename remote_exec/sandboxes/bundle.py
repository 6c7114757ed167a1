"""Finding the frozen agent bundle on the host (built by ``make agent``) and its SHA-256.

A bundle is ``remote-exec-agent-<arch>.tar.gz`` (``<arch>`` as ``uname -m`` prints it), a
PyInstaller ``--onedir`` build of the agent with a top directory ``remote-exec-agent/``, and
optionally a ``.sha256`` file beside it in ``sha256sum`` format. They are looked up in
``$REMOTE_EXEC_AGENT_BUNDLE`` (a directory, or one tarball), else in ``dist/agent/`` of the
checkout this package runs from.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import AgentUnavailableError

__all__ = ["BUNDLE_ENV", "AgentBundle", "bundle_dirs", "find_bundle", "local_bundles"]

BUNDLE_ENV = "REMOTE_EXEC_AGENT_BUNDLE"
_NAME = re.compile(r"^remote-exec-agent-([A-Za-z0-9_]+)\.tar\.gz$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class AgentBundle:
    """One bundle tarball on the host.

    :ivar arch: the machine it runs on, as ``uname -m`` names it (``x86_64``, ``aarch64``).
    :ivar path: the ``.tar.gz`` file.
    :ivar sha256: hex digest of the file, computed here (and checked against any ``.sha256``).
    """

    arch: str
    path: Path
    sha256: str

    def read(self) -> bytes:
        """The tarball's bytes, checked again against :attr:`sha256` (the file may have been rebuilt).

        :raises AgentUnavailableError: the file changed since it was found.
        """
        data = self.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise AgentUnavailableError(f"agent bundle {self.path} changed while in use; retry")
        return data


def bundle_dirs() -> list[Path]:
    """Where bundles are looked for, in order."""
    env = os.environ.get(BUNDLE_ENV)
    if env:
        return [Path(env)]
    return [Path(__file__).resolve().parent.parent.parent / "dist" / "agent"]


# (path, size, mtime) -> digest: hashing 14 MB costs ~30 ms, once per build is enough.
_digests: dict[tuple[str, int, int], str] = {}


def _digest(path: Path) -> str:
    st = path.stat()
    key = (os.fspath(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        sidecar = path.with_name(path.name + ".sha256")
        if sidecar.exists():
            expected = sidecar.read_text().split(maxsplit=1)[0] if sidecar.read_text().strip() else ""
            if not _HEX.match(expected) or expected != digest:
                raise AgentUnavailableError(
                    f"agent bundle {path} does not match {sidecar.name} (corrupt or half-built): rebuild it "
                    "with `make agent`"
                )
        _digests[key] = digest
    return _digests[key]


def _candidates() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for place in bundle_dirs():
        files = [place] if place.is_file() else sorted(place.glob("remote-exec-agent-*.tar.gz"))
        for f in files:
            m = _NAME.match(f.name)
            if m and m.group(1) not in found:
                found[m.group(1)] = f
    return found


def find_bundle(arch: str) -> AgentBundle:
    """The bundle for machines of type ``arch`` (``uname -m``).

    Blocking (hashes the file on first use; about 30 ms).

    :raises AgentUnavailableError: no bundle for ``arch``, or it fails its ``.sha256``.
    """
    found = _candidates()
    path = found.get(arch)
    if path is None:
        have = ", ".join(sorted(found)) or "none"
        where = " or ".join(os.fspath(p) for p in bundle_dirs())
        raise AgentUnavailableError(
            f"no agent bundle for {arch} in {where} (have: {have}): build one with `make agent` on an {arch} "
            f"machine, or point ${BUNDLE_ENV} at one"
        )
    return AgentBundle(arch, path, _digest(path))


def local_bundles() -> list[AgentBundle]:
    """Every bundle found on the host, one per arch. Blocking, like :func:`find_bundle`.

    :raises AgentUnavailableError: a bundle fails its ``.sha256``.
    """
    return [AgentBundle(arch, path, _digest(path)) for arch, path in sorted(_candidates().items())]
