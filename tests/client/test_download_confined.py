"""A download through the real agent writes only below its target: a symlink inside the target
(to a directory elsewhere) is refused by name, never followed, and ``delete=True`` replaces it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import remote_exec as rx

pytestmark = pytest.mark.anyio


async def test_a_symlinked_directory_in_the_target_is_not_followed(url: str, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    (remote / "sub").mkdir(parents=True)
    (remote / "sub" / "f.txt").write_text("sandbox\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.txt").write_text("host\n")
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(elsewhere, target / "sub")
    async with rx.open_sandbox(url) as sb:
        for checksum in (False, True):  # neither the stat nor the hash goes through the link
            with pytest.raises(NotADirectoryError, match=r"target/sub is a symlink .* never follows symlinks"):
                await sb.download(str(remote), target, progress=False, checksum=checksum)
            assert [p.name for p in elsewhere.iterdir()] == ["f.txt"] and (elsewhere / "f.txt").read_text() == "host\n"
        result = await sb.download(str(remote), target, progress=False, delete=True)
    assert result.deleted == ["sub"] and result.files_sent == 1
    assert not (target / "sub").is_symlink() and (target / "sub" / "f.txt").read_text() == "sandbox\n"
    assert (elsewhere / "f.txt").read_text() == "host\n"
