"""Build the single-directory agent bundle injected into sandboxes that lack Python.

``make agent`` runs this. It freezes ``remote_exec.agent`` (with ``remote_exec.protocol`` and
``remote_exec.errors``, aiohttp and pydantic) with PyInstaller ``--onedir``, packs the result as
``dist/agent/remote-exec-agent-<arch>.tar.gz`` with a ``.sha256`` beside it (``sha256sum``
format), and prints the bundle's size and cold start time.

Only what the agent imports at run time goes in: every other top-level package of this
environment (the host client, IPython, mypy, hypothesis...) is excluded by name, because
PyInstaller's static analysis otherwise follows optional imports (pydantic's mypy plugin, for
one) and the bundle grows from ~30 MB to ~180 MB.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import pkgutil
import platform
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
NAME = "remote-exec-agent"
# Standard-library packages the agent never needs (PyInstaller would otherwise ship some).
STDLIB_EXCLUDES = ["tkinter", "unittest", "pydoc", "pydoc_data", "lib2to3", "idlelib", "ensurepip", "distutils"]
STDLIB_EXCLUDES += ["test", "sqlite3", "curses", "turtle", "turtledemo", "venv", "xmlrpc", "doctest"]

# Packages the agent imports only when first needed (inside a function), so importing its
# modules does not load them: the probe loads them itself, or the bundle would leave them out.
LAZY_IMPORTS = ["regex"]  # agent/jobs/watch.py: a watch rule's patterns

_PROBE = f"""
import importlib, json, pkgutil, sys
import remote_exec.agent
for name in {LAZY_IMPORTS!r}:
    importlib.import_module(name)
for m in pkgutil.walk_packages(remote_exec.agent.__path__, "remote_exec.agent."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""


def runtime_modules() -> set[str]:
    """Every module loaded by importing all of ``remote_exec.agent`` (in a clean interpreter)."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def excludes(loaded: set[str]) -> list[str]:
    """Module names to keep out of the bundle: installed packages and our host modules not loaded."""
    tops = {m.split(".")[0] for m in loaded}
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    installed = {m.name for m in pkgutil.iter_modules(sorted(site))}
    out = sorted(installed - tops - {"remote_exec"})
    import remote_exec

    # Host-side parts of our package (client, sandboxes, blocking twin...): never imported by the agent.
    out += [m.name for m in pkgutil.iter_modules(remote_exec.__path__, "remote_exec.") if m.name not in loaded]
    return out + [m for m in STDLIB_EXCLUDES if m not in tops]


def freeze(work: Path, exclude: list[str]) -> Path:
    """Run PyInstaller; return the ``remote-exec-agent/`` directory it made."""
    cmd = [sys.executable, "-m", "PyInstaller", "--onedir", "--noconfirm", "--clean", "--log-level", "WARN"]
    cmd += ["--name", NAME, "--distpath", str(work / "dist"), "--workpath", str(work / "build")]
    cmd += [
        "--specpath",
        str(work),
        "--collect-submodules",
        "remote_exec.agent",
        "--collect-submodules",
        "remote_exec.protocol",
        "--strip",
    ]
    for name in exclude:
        cmd += ["--exclude-module", name]
    # A fixed hash seed and timestamps make the build reproducible, so an unchanged agent keeps
    # its SHA-256 and sandboxes holding it are not re-injected after a rebuild.
    env = {**os.environ, "PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": "315532800"}
    subprocess.run([*cmd, str(ROOT / "tools" / "agent_entry.py")], check=True, cwd=work, env=env)
    return work / "dist" / NAME


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Same bytes for the same files: no owner names, ids or times from the build machine.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return info


def pack(bundle: Path, tarball: Path) -> str:
    """Write ``bundle`` as a reproducible ``.tar.gz`` (top directory ``remote-exec-agent/``); return its SHA-256."""
    tmp = tarball.with_suffix(".tmp")
    with (
        open(tmp, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.add(bundle, NAME, recursive=False, filter=_normalise)
        for path in sorted(bundle.rglob("*")):
            tar.add(path, f"{NAME}/{path.relative_to(bundle)}", recursive=False, filter=_normalise)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, tarball)
    tarball.with_name(tarball.name + ".sha256").write_text(f"{digest}  {tarball.name}\n")
    return digest


def cold_start(bundle: Path) -> tuple[float, float]:
    """Seconds for ``--help`` (interpreter and imports) and for ``ensure`` on a fresh state dir."""
    exe = bundle / NAME
    t0 = time.perf_counter()
    subprocess.run([str(exe), "--help"], capture_output=True, check=True)
    help_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="rx-agent-cold-") as state:
        t0 = time.perf_counter()
        out = subprocess.run(
            [str(exe), "ensure", "--dir", state, "--idle-timeout", "5"], capture_output=True, check=True
        )
        ensure_s = time.perf_counter() - t0
        pid = json.loads(out.stdout)["result"]["pid"]
        os.kill(pid, 15)
    return help_s, ensure_s


def main(argv: list[str] | None = None) -> int:
    """Build, pack and report; the output directory defaults to ``dist/agent``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "agent")
    args = p.parse_args(argv)
    arch = platform.machine()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rx-agent-build-") as tmp:
        bundle = freeze(Path(tmp), excludes(runtime_modules()))
        built = time.perf_counter() - t0
        on_disk = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
        tarball = args.out / f"{NAME}-{arch}.tar.gz"
        digest = pack(bundle, tarball)
        help_s, ensure_s = cold_start(bundle)
    mb = 1024 * 1024
    print(f"agent bundle  {tarball.relative_to(ROOT) if tarball.is_relative_to(ROOT) else tarball}")
    print(f"  sha256      {digest}")
    print(f"  size        {on_disk / mb:.1f} MiB on disk, {tarball.stat().st_size / mb:.1f} MiB packed")
    print(f"  build       {built:.1f} s")
    print(f"  cold start  {help_s:.2f} s to --help, {ensure_s:.2f} s to a serving agent (ensure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
