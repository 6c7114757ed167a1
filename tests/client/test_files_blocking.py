"""The blocking twin of the file methods (``rx.connect``), as a script or a notebook cell uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

import remote_exec as rx


def test_blocking_file_methods(agent_dir: Path, tmp_path: Path) -> None:
    with rx.connect(f"local://?dir={agent_dir}", workspace_root=str(tmp_path)) as sb:
        assert sb.workspace_root == str(tmp_path)
        info = sb.write_file("a/b.txt", "hi ✓", 0o600)
        assert (info.path, info.mode) == (str(tmp_path / "a" / "b.txt"), 0o600)
        assert sb.read_file("a/b.txt") == "hi ✓" and sb.read_file("a/b.txt", text=False) == "hi ✓".encode()
        assert [e.name for e in sb.list_dir("a")] == ["b.txt"] and sb.exists("a/b.txt")
        assert sb.stat("a").type == "dir" and sb.mkdir("c/d").type == "dir"
        with pytest.raises(rx.PathEscapeError):
            sb.read_file("../outside")
        local = tmp_path / "local.bin"
        local.write_bytes(b"\x00\xff" * 1000)
        assert sb.write_file_from(local, "copy.bin").size == 2000
        assert sb.read_file_to("copy.bin", tmp_path / "back.bin").size == 2000
        assert (tmp_path / "back.bin").read_bytes() == b"\x00\xff" * 1000
        up = sb.upload(tmp_path / "a", "tree", progress=False)
        assert up.files_sent == 1 and sb.upload(tmp_path / "a", "tree", progress=False).files_sent == 0
        down = sb.download("tree", tmp_path / "tree-back", progress=False)
        assert down.files_sent == 1 and (tmp_path / "tree-back" / "b.txt").read_text() == "hi ✓"
        assert sb.remove("c", recursive=True) and not sb.exists("c")
