"""Names from a hostile sandbox never make the host write (or delete) outside the download's target.

The hostile agent lists ``../x``, ``/tmp/x``, ``a/../../x``, NULs, empty and ``.`` components,
over-long names, paths not under the listed directory and conflicting duplicates; each listing
must be refused, precisely, before anything is created (no target, nothing in the sentinel
directory beside it, no file read). A symlink planted inside the target is never followed,
``delete=True`` deletes nothing when the listing is refused, ``remote-exec cp`` refuses a stat
naming the file ``..``, and the ``docker cp`` tar stream's own names are ignored.
"""

from __future__ import annotations

import os
import sys
import tarfile
import threading
from io import BytesIO
from pathlib import Path
from typing import Any

import anyio
import pytest

import remote_exec as rx
from remote_exec.sandboxes.native_copy import _receive_tar

from .conftest import Adversary
from .hostile_agent import HostileAgent

pytestmark = pytest.mark.anyio

AREA = "download names"
ROOT = "/w"
CONTENT = b"hostile bytes\n"
MTIME = 1_700_000_000_000_000_000


def info(name: str, type: str = "file", path: str | None = None) -> dict[str, Any]:
    """One entry of a listing (or a stat) as the agent sends it."""
    size = len(CONTENT) if type == "file" else 0
    return {
        "path": path or f"{ROOT}/{name}",
        "name": name,
        "type": type,
        "size": size,
        "mode": 0o644,
        "mtime_ns": MTIME,
    }


def handlers(entries: list[dict[str, Any]], top: dict[str, Any] | None = None) -> dict[str, Any]:
    """A sandbox whose ``ROOT`` lists ``entries`` and whose every file holds ``CONTENT``."""

    def read(p: dict[str, Any], _: bytes | None) -> tuple[dict[str, Any], bytes]:
        n = len(CONTENT)
        return {"size": n, "mtime_ns": MTIME, "mode": 0o644, "offset": 0, "length": n, "eof": True}, CONTENT

    def stat(p: dict[str, Any], _: bytes | None) -> dict[str, Any]:
        if p["path"].rstrip("/") == ROOT:
            return top or info("w", "dir", ROOT)
        return info(p["path"].rsplit("/", 1)[-1], "file", p["path"])

    return {
        "file_list": lambda p, _: {"path": ROOT, "entries": entries},
        "file_read": read,
        "file_stat": stat,
        "file_hash": lambda p, _: {"hashes": [None for _ in p["paths"]]},
    }


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """(target, sentinel): the download's target (not yet there) and a directory beside it
    that every escape in these tests aims at."""
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    return tmp_path / "target", sentinel


def everything(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*")} if top.exists() else set()


def hostile_listings(sentinel: Path) -> list[tuple[str, list[dict[str, Any]], str]]:
    """(case, listing, the words the refusal must hold)."""
    return [
        ("../x", [info("../sentinel/x")], "'..' component"),
        ("absolute /tmp/x", [info(f"{sentinel}/abs")], "absolute"),
        ("a/../../x", [info("a", "dir"), info("a/../../sentinel/x")], "'..' component"),
        ("dir ..", [info("..", "dir"), info("../x")], "'..' component"),
        ("NUL in a name", [info("a\x00b")], "NUL"),
        (". component", [info("./x")], "'.' component"),
        ("empty component", [info("a", "dir"), info("a//x")], "empty"),
        ("trailing slash", [info("a/", "dir")], "empty"),
        ("empty name", [info("")], "empty"),
        ("component over 255 bytes", [info("é" * 128)], "over 255 bytes"),
        ("name over 4096 bytes", [info("d/" * 2100 + "x")], "4201 bytes long"),
        ("path not under the listed root", [info("a"), info("b", path="/etc/b")], "not under the listed directory"),
        ("path not ending with the name", [info("a", path=f"{ROOT}/../b")], "does not end with its name"),
        ("duplicate, file and dir", [info("a", "dir"), info("a", "file")], "listed twice"),
        ("child of a file", [info("f"), info("f/x")], "not listed before it as a directory"),
        ("child of nothing listed", [info("nodir/x")], "not listed before it as a directory"),
        ("child before its parent", [info("p/x"), info("p", "dir")], "not listed before it as a directory"),
    ]


async def test_hostile_listings_are_refused_before_anything_is_written(
    tmp_path: Path, places: tuple[Path, Path], adversary: Adversary
) -> None:
    target, sentinel = places
    for case, entries, words in hostile_listings(sentinel):
        async with HostileAgent(tmp_path / "agent", handlers(entries)) as agent, rx.open_sandbox(agent.url) as sb:
            try:
                await sb.download(ROOT, target, progress=False, gitignore=False)
            except rx.ProtocolError as exc:
                refused = words in exc.message and "nothing was written" in exc.message
            else:
                refused = False
        clean = not target.exists() and everything(sentinel) == set() and "file_read" not in agent.calls
        adversary.tried(AREA, f"listing: {case}", refused=refused and clean)
        assert refused and clean, (case, everything(tmp_path))


async def test_hostile_upload_listing_is_refused_too(tmp_path: Path, adversary: Adversary) -> None:
    """An upload with delete=True removes in the sandbox what its listing names: refused as well."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    agent_handlers = handlers([info("../../etc", "dir")])
    async with HostileAgent(tmp_path / "agent", agent_handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with pytest.raises(rx.ProtocolError, match=r"'\.\.' component") as caught:
            await sb.upload(src, ROOT, progress=False, delete=True)
    adversary.tried(AREA, "upload listing: ../../etc with delete=True", refused=caught.value is not None)
    assert "file_remove" not in agent.calls and "file_write" not in agent.calls


async def test_delete_with_a_hostile_listing_deletes_nothing(
    tmp_path: Path, places: tuple[Path, Path], adversary: Adversary
) -> None:
    target, sentinel = places
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    (target / "sub").mkdir()
    (target / "sub" / "keep2.txt").write_text("mine too")
    async with HostileAgent(tmp_path / "agent", handlers([info("../sentinel/x")])) as agent:
        async with rx.open_sandbox(agent.url) as sb:
            with pytest.raises(rx.ProtocolError, match=r"'\.\.' component"):
                await sb.download(ROOT, target, progress=False, delete=True)
        assert "file_read" not in agent.calls
    held = everything(target) == {"keep.txt", "sub", "sub/keep2.txt"} and everything(sentinel) == set()
    adversary.tried(AREA, "delete=True with ../x listed", refused=held)
    assert held


async def test_a_symlink_inside_the_target_is_never_followed(
    tmp_path: Path, places: tuple[Path, Path], adversary: Adversary
) -> None:
    """The listing is well formed; the local target holds ``sub -> ../sentinel``: without
    delete it is refused by name, with delete it is replaced by a real directory."""
    target, sentinel = places
    target.mkdir()
    os.symlink("../sentinel", target / "sub")
    (target / "f").symlink_to(sentinel / "victim")  # a symlink where a file comes: replaced, not written through
    (sentinel / "victim").write_text("host data")
    entries = [info("f"), info("sub", "dir"), info("sub/x")]
    async with HostileAgent(tmp_path / "agent", handlers(entries)) as agent, rx.open_sandbox(agent.url) as sb:
        with pytest.raises(NotADirectoryError, match=r"target/sub is a symlink \(to ../sentinel\)"):
            await sb.download(ROOT, target, progress=False)
        refused = everything(sentinel) == {"victim"} and (target / "sub").is_symlink()
        adversary.tried(AREA, "symlinked directory in the target", refused=refused)
        assert refused and "file_read" not in agent.calls  # refused before any file moved

        result = await sb.download(ROOT, target, progress=False, delete=True)
    assert result.deleted == ["f", "sub"] and result.files_sent == 2  # the local symlinks make way
    assert not (target / "sub").is_symlink() and (target / "sub" / "x").read_bytes() == CONTENT
    assert not (target / "f").is_symlink() and (target / "f").read_bytes() == CONTENT
    held = everything(sentinel) == {"victim"} and (sentinel / "victim").read_text() == "host data"
    adversary.tried(AREA, "symlinks in the target, delete=True", refused=held)
    assert held
    assert not [p for p in everything(target) if p.endswith(".rxpart")]


async def test_cp_refuses_a_stat_naming_the_source_dotdot(
    tmp_path: Path, places: tuple[Path, Path], adversary: Adversary
) -> None:
    """``remote-exec cp sandbox:/w ./dir`` puts the tree in ``dir/<its name>``; a stat saying
    that name is ``..`` would put it beside ``dir`` instead."""
    target, sentinel = places
    target.mkdir()
    agent_handlers = handlers([info("x")], top=info("..", "dir", "/w/.."))
    async with HostileAgent(tmp_path / "agent", agent_handlers) as agent:
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        argv = [sys.executable, "-m", "remote_exec.cli", "-s", agent.url, "cp", "--no-progress", f"sandbox:{ROOT}"]
        r = await anyio.run_process([*argv, str(target)], check=False, env=env)
    stderr = r.stderr.decode()
    refused = r.returncode == 2 and "ProtocolError" in stderr and "'..' component" in stderr
    clean = everything(tmp_path / "target") == set() and not (tmp_path / "x").exists()
    adversary.tried(AREA, "cp: stat names the source '..'", refused=refused and clean)
    assert refused and clean, (r.returncode, stderr)
    assert everything(sentinel) == set()


def tar_stream(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = CONTENT, linkname: str = "") -> bytes:
    buf = BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        member = tarfile.TarInfo(name)
        member.type, member.linkname = kind, linkname
        member.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(member, BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def receive(stream: bytes, into: Path) -> BaseException | None:
    """Feed ``stream`` to the docker cp reader, as the engine's stdout would; its error, if any."""
    read_end, write_end = os.pipe()

    def feed() -> None:
        try:
            os.write(write_end, stream)
        except BrokenPipeError:
            pass
        finally:
            os.close(write_end)

    feeder = threading.Thread(target=feed)
    feeder.start()
    fd = os.open(into, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _receive_tar(read_end, fd, len(CONTENT), "/w/f", None)
    except Exception as exc:
        return exc
    finally:
        os.close(fd)
        feeder.join()
    return None


def test_tar_stream_names_are_ignored(
    tmp_path: Path, places: tuple[Path, Path], adversary: Adversary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native copy's tar member names go nowhere: the bytes land in the one local file
    asked for, whatever the stream calls it; a link or a directory as its entry is refused."""
    target, sentinel = places
    target.mkdir()
    monkeypatch.chdir(target)
    for name in ("../sentinel/x", f"{sentinel}/abs", "a/../../sentinel/y", "f"):
        out = tmp_path / "out"
        err = receive(tar_stream(name), out)
        held = err is None and out.read_bytes() == CONTENT and everything(sentinel) == set()
        held = held and everything(target) == set()
        adversary.tried(AREA, f"tar member named {name}", refused=held)
        assert held, err
    for kind, link in ((tarfile.SYMTYPE, str(sentinel / "t")), (tarfile.LNKTYPE, "/etc/passwd"), (tarfile.DIRTYPE, "")):
        err = receive(tar_stream("f", kind, linkname=link), tmp_path / "out2")
        refused = isinstance(err, rx.FileError) and "not a regular file" in str(err)
        refused = refused and everything(sentinel) == set() and (tmp_path / "out2").read_bytes() == b""
        adversary.tried(AREA, f"tar entry of type {kind!r}", refused=refused)
        assert refused, err
