"""Tree upload and download through the real agent: ignores, .gitignore, caps, incremental re-sends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.client.transfer import IgnoreRules
from remote_exec.client.transfer.trees import same_mtime

pytestmark = pytest.mark.anyio

TREE: dict[str, str | bytes] = {
    "README.md": "# project\n",
    "src/app.py": "print('app')\n",
    "src/pkg/mod.py": "X = 1\n",
    "src/pkg/data.bin": bytes(range(256)) * 20,
    ".gitignore": "build/\n*.log\n!keep.log\n",
    "build/out.o": "object",
    "app.log": "noise",
    "keep.log": "kept",
    "docs/.gitignore": "draft.md\n",
    "docs/draft.md": "wip",
    "docs/final.md": "done",
    ".git/HEAD": "ref: refs/heads/main\n",
    "node_modules/left-pad/index.js": "module.exports = 1\n",
    "src/__pycache__/app.cpython-311.pyc": b"\x00pyc",
    ".venv/bin/python": "#!/bin/false\n",
    ".env": "SECRET=1\n",
    ".env.local": "SECRET=2\n",
    ".env.example": "SECRET=\n",
    "certs/server.pem": "-----BEGIN-----\n",
    "certs/server.key": "-----KEY-----\n",
    "certs/README": "certs go here\n",
}
SENT = {"README.md", "src/app.py", "src/pkg/mod.py", "src/pkg/data.bin", ".gitignore", "keep.log",
        "docs/.gitignore", "docs/final.md", ".env.example", "certs/README"}  # fmt: skip


def make_tree(top: Path) -> Path:
    for rel, content in TREE.items():
        p = top / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    (top / "empty").mkdir()
    os.symlink("README.md", top / "link-to-readme")
    (top / "src" / "app.py").chmod(0o755)
    return top


def files_under(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*") if p.is_file() and not p.is_symlink()}


def test_ignore_rules_precedence() -> None:
    rules = IgnoreRules(["!.env", "*.tmp"])
    rules.add_gitignore("", "*.log\n.env.example\nsub/\n")
    rules.add_gitignore("a", "!x.log\n")
    assert not rules.ignored(".env", False)  # the caller re-included it
    assert rules.ignored(".env.local", False)  # a default
    assert rules.ignored(".env.example", False)  # the default leaves it, the .gitignore does not
    assert rules.ignored("b.tmp", False) and rules.ignored("y.log", False)
    assert not rules.ignored("a/x.log", False)  # the deeper .gitignore wins
    assert rules.ignored("sub", True) and not rules.ignored("sub", False)  # a directory-only pattern
    assert rules.ignored("deep/node_modules", True) and rules.ignored(".git", True)
    assert not IgnoreRules(default_ignores=False).ignored(".git", True)


def test_same_mtime_tolerates_coarse_file_systems() -> None:
    assert same_mtime(1_700_000_000_123_456_789, 1_700_000_000_123_456_789)
    assert same_mtime(1_700_000_000_123_456_789, 1_700_000_000_123_456_000)  # µs precision
    assert same_mtime(1_700_000_000_123_456_789, 1_700_000_000_000_000_000)  # whole seconds
    assert not same_mtime(1_700_000_000_123_456_789, 1_700_000_001_123_456_789)


async def test_upload_ignores_then_sends_only_changes(url: str, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    dest = tmp_path / "remote" / "project"
    async with rx.open_sandbox(url) as sb:
        first = await sb.upload(src, str(dest), progress=False)
        assert files_under(dest) == SENT
        assert (first.files_sent, first.files_unchanged, first.bytes_sent) == (
            len(SENT), 0, sum(len(TREE[f]) for f in SENT)
        )  # fmt: skip
        assert first.skipped == ["link-to-readme"] and (dest / "empty").is_dir()
        assert sorted(first.ignored_paths) == [
            ".env", ".env.local", ".git/", ".venv/", "app.log", "build/", "certs/server.key", "certs/server.pem",
            "docs/draft.md", "node_modules/", "src/__pycache__/",
        ]  # fmt: skip
        assert first.ignored == 11
        assert (dest / "src" / "app.py").stat().st_mode & 0o777 == 0o755
        assert (dest / "src" / "pkg" / "data.bin").read_bytes() == TREE["src/pkg/data.bin"]
        for rel in SENT:
            assert (dest / rel).stat().st_mtime_ns == (src / rel).stat().st_mtime_ns

        again = await sb.upload(src, str(dest), progress=False)
        assert (again.files_sent, again.files_unchanged, again.bytes_sent) == (0, len(SENT), 0)

        (src / "src" / "app.py").write_text("print('changed')\n")  # new content and size
        os.utime(src / "docs" / "final.md", ns=(1, 1_600_000_000_000_000_000))  # same size, new mtime
        (src / "new.txt").write_text("new")
        third = await sb.upload(src, str(dest), progress=False)
        assert (third.files_sent, third.files_unchanged) == (3, len(SENT) - 2)
        assert (dest / "src" / "app.py").read_text() == "print('changed')\n"
        assert (dest / "new.txt").read_text() == "new"

        with_env = await sb.upload(src, str(dest), ignore=["!.env"], progress=False)
        assert with_env.files_sent == 1 and (dest / ".env").read_text() == "SECRET=1\n"
        everything = await sb.upload(src, str(tmp_path / "all"), default_ignores=False, gitignore=False, progress=False)
        assert everything.files_sent == len(TREE) + 1


async def test_upload_caps_name_the_offenders(url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "huge.bin").write_bytes(b"\0" * 300_000)
    (src / "small.txt").write_text("s")
    for i in range(30):
        (src / "many" / f"f{i}").parent.mkdir(exist_ok=True)
        (src / "many" / f"f{i}").write_text(str(i))
    dest = tmp_path / "dest"
    async with rx.open_sandbox(url) as sb:
        with pytest.raises(rx.TransferLimitError) as info:
            await sb.upload(src, str(dest), max_files=10, progress=False)
        msg = str(info.value)
        assert "32 files, over max_files=10" in msg and "many/ (30 files" in msg and "data/huge.bin" in msg
        assert info.value.data["files"] == 32 and info.value.data["largest"][0] == ["data/huge.bin", 300_000]
        with pytest.raises(rx.TransferLimitError, match=r"over max_bytes=100000 .*Biggest files: data/huge.bin"):
            await sb.upload(src, str(dest), max_bytes=100_000, progress=False)
        assert not dest.exists()  # refused before anything moved
        ok = await sb.upload(src, str(dest), ignore=["data/"], max_files=40, max_bytes=100_000, progress=False)
        assert ok.files_sent == 31


async def test_download_round_trip_and_incremental(url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    remote = make_tree(tmp_path / "remote")
    local = tmp_path / "local"
    async with rx.open_sandbox(url) as sb:
        got = await sb.download(str(remote), local, progress=True)
        assert files_under(local) == SENT  # the sandbox's .gitignore files are honoured too
        assert got.files_sent == len(SENT) and got.skipped == ["link-to-readme"]
        for rel in SENT:
            a, b = (remote / rel).stat(), (local / rel).stat()
            assert (local / rel).read_bytes() == (remote / rel).read_bytes()
            assert (a.st_mtime_ns, a.st_mode) == (b.st_mtime_ns, b.st_mode)
        assert "100%" in capfd.readouterr().err  # the tqdm bar
        again = await sb.download(str(remote), local, progress=False)
        assert (again.files_sent, again.files_unchanged) == (0, len(SENT))
        (remote / "docs" / "final.md").write_text("revised")
        third = await sb.download(str(remote), local, progress=False)
        assert third.files_sent == 1 and (local / "docs" / "final.md").read_text() == "revised"
        with pytest.raises(rx.RemoteFileNotFoundError):
            await sb.download(str(tmp_path / "nope"), local, progress=False)
        with pytest.raises(rx.TransferLimitError):
            await sb.download(str(remote), tmp_path / "capped", max_files=2, progress=False)


async def test_upload_into_workspace_root(url: str, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    ws = tmp_path / "ws"
    ws.mkdir()
    async with rx.open_sandbox(url, workspace_root=str(ws)) as sb:
        await sb.upload(src, "project", progress=False)
        assert files_under(ws / "project") == SENT
        with pytest.raises(rx.PathEscapeError):
            await sb.upload(src, "../elsewhere", progress=False)
        back = await sb.download("project", tmp_path / "back", progress=False)
        assert back.files_sent == len(SENT)


async def test_delete_mirrors_both_ways_and_never_touches_ignored_paths(url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel, text in {"keep.txt": "k", "gone.txt": "g", "old/a.txt": "a", "old/deep/b.txt": "b", "x": "file"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    dest = tmp_path / "remote"
    async with rx.open_sandbox(url) as sb:
        await sb.upload(src, str(dest), progress=False)
        (dest / "node_modules" / "pkg").mkdir(parents=True)  # built in the sandbox: ignored, so kept
        (dest / "node_modules" / "pkg" / "index.js").write_text("js")
        (dest / "results.log").write_text("made there")
        (src / "gone.txt").unlink()
        shutil.rmtree(src / "old")
        plain = await sb.upload(src, str(dest), progress=False)
        assert plain.deleted == [] and (dest / "gone.txt").exists()  # no delete unless asked
        (src / "x").unlink()
        (src / "x").mkdir()  # a file that became a directory: the mirror makes way for it
        (src / "x" / "inside.txt").write_text("i")
        mirrored = await sb.upload(src, str(dest), delete=True, ignore=["*.log"], progress=False)
        assert mirrored.deleted == ["old/", "gone.txt", "x"]
        assert "3 deleted" in mirrored.describe()
        assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
            "keep.txt", "node_modules/pkg/index.js", "results.log", "x/inside.txt"
        ]  # fmt: skip

        back = tmp_path / "back"
        await sb.download(str(dest), back, progress=False)
        (back / "stale.txt").write_text("only here")
        (back / "stale-dir" / "sub").mkdir(parents=True)
        (back / ".env").write_text("SECRET=1")  # ignored by default: never deleted
        down = await sb.download(str(dest), back, delete=True, progress=False)
        assert down.deleted == ["stale-dir/", "stale.txt"]
        assert not (back / "stale.txt").exists() and (back / ".env").read_text() == "SECRET=1"


async def test_checksum_compares_contents_not_mtimes(url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.txt").write_text(f"content {i}\n")
    dest = tmp_path / "remote"
    async with rx.open_sandbox(url) as sb:
        await sb.upload(src, str(dest), progress=False)
        for f in src.iterdir():  # a fresh checkout: every mtime moved, no content did
            os.utime(f, ns=(1, 1_700_000_000_000_000_000))
        assert (await sb.upload(src, str(tmp_path / "probe"), progress=False)).files_sent == 5
        by_mtime = await sb.upload(src, str(dest), progress=False, checksum=True)
        assert (by_mtime.files_sent, by_mtime.files_unchanged) == (0, 5)
        st = (src / "f2.txt").stat()  # same size, same mtime, new bytes: only a checksum sees it
        (src / "f2.txt").write_text("CONTENT 2\n")
        os.utime(src / "f2.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
        (dest / "f2.txt").write_text("content 2\n")
        os.utime(dest / "f2.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
        await sb.upload(src, str(dest), progress=False)  # sends the 4 files whose mtimes moved...
        assert (dest / "f2.txt").read_text() == "content 2\n"  # ...and is fooled by f2
        fixed = await sb.upload(src, str(dest), progress=False, checksum=True)
        assert fixed.files_sent == 1 and (dest / "f2.txt").read_text() == "CONTENT 2\n"

        back = tmp_path / "back"
        await sb.download(str(dest), back, progress=False)
        (dest / "f4.txt").write_text("CONTENT 4\n")
        os.utime(dest / "f4.txt", ns=(1, (back / "f4.txt").stat().st_mtime_ns))
        assert (await sb.download(str(dest), back, progress=False)).files_sent == 0
        down = await sb.download(str(dest), back, progress=False, checksum=True)
        assert (down.files_sent, down.files_unchanged) == (1, 4) and (back / "f4.txt").read_text() == "CONTENT 4\n"


async def test_a_failing_small_file_stops_the_big_one_before_upload_raises(url: str, tmp_path: Path) -> None:
    """Structured concurrency: nothing of an upload runs on after ``upload()`` has raised."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(1 << 20) * 64)  # many chunks: still being written when...
    (src / "small.txt").write_text("x")  # ...this one fails: the agent refuses to write over a directory
    dest = tmp_path / "dest"
    (dest / "small.txt").mkdir(parents=True)
    (dest / "small.txt" / "keep").write_text("k")  # not empty: the write cannot replace it
    async with rx.open_sandbox(url) as sb:
        with pytest.raises(rx.RemoteIsADirectoryError):
            await sb.upload(src, str(dest), progress=False)
        # The agent's state right after the raise: the big file's write session is gone (its
        # temporary file `.big.bin.<id>.rxtmp` with it) and the file was never committed.
        assert sorted(p.name for p in dest.iterdir()) == ["small.txt"]
        await sb.write_file(str(dest / "probe"), "p")  # a later request, served after any stray chunk
        assert sorted(p.name for p in dest.iterdir()) == ["probe", "small.txt"]


# A fresh interpreter: tqdm's first bar in a process makes a multiprocessing lock (an import, a
# getcwd, a semaphore), which the blocking guard saw on the loop in a random order that copied
# with a progress bar first.
_FIRST_BAR = """
import asyncio
from blockbuster import BlockBuster
from remote_exec.client.transfer.progress import progress_bar

async def main():
    bar = await progress_bar(10, "first", True)
    bar.update(10)
    bar.close()

bb = BlockBuster("remote_exec")
bb.activate()
asyncio.run(main())
print("ok")
"""


def test_the_first_progress_bar_of_a_process_blocks_no_loop() -> None:
    run = subprocess.run([sys.executable, "-c", _FIRST_BAR], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout) == (0, "ok\n"), run.stderr[-2000:]
