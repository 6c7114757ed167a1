"""``%exec_remote_upload`` / ``%exec_remote_download`` in an IPython shell, on the real agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_exec as rx
from remote_exec.jupyter import RemoteCommandError


def test_upload_and_download_a_tree(ip: InteractiveShell, tmp_path: Path, plain: None) -> None:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("M = 1\n")
    (src / "notes.log").write_text("noise")
    (src / ".env").write_text("SECRET=1\n")
    remote = tmp_path / "remote"
    with capture_output() as cap:
        ip.run_line_magic("exec_remote_upload", f"{src} {remote} --ignore '*.log' --name up")
    assert cap.stdout.startswith("uploaded 1 file (") and "2 ignored" in cap.stdout
    assert (remote / "pkg" / "m.py").read_text() == "M = 1\n" and not (remote / ".env").exists()
    up = ip.user_ns["up"]
    assert isinstance(up, rx.TransferResult) and up.files_sent == 1
    with capture_output() as cap:
        ip.run_line_magic("exec_remote_upload", f"{src} {remote} --ignore '*.log'")
    assert cap.stdout.startswith("uploaded 0 files") and "1 unchanged" in cap.stdout

    back = tmp_path / "back"
    with capture_output() as cap:
        ip.run_line_magic("exec_remote_download", f"{remote} {back} --name down")
    assert cap.stdout.startswith("downloaded 1 file (")
    assert (back / "pkg" / "m.py").read_text() == "M = 1\n"


def test_single_files_and_the_configured_cwd(ip: InteractiveShell, tmp_path: Path, plain: None) -> None:
    local = tmp_path / "data.bin"
    local.write_bytes(bytes(range(256)))
    (tmp_path / "work").mkdir()
    with capture_output():
        ip.run_line_magic("exec_remote_config", f"--cwd {tmp_path / 'work'}")
        ip.run_line_magic("exec_remote_upload", f"{local} copied.bin --name info")  # relative: to --cwd
    assert (tmp_path / "work" / "copied.bin").read_bytes() == bytes(range(256))
    assert isinstance(ip.user_ns["info"], rx.FileInfo) and ip.user_ns["info"].size == 256
    with capture_output() as cap:
        ip.run_line_magic("exec_remote_download", f"copied.bin {tmp_path / 'again.bin'}")
    assert "downloaded" in cap.stdout and (tmp_path / "again.bin").read_bytes() == bytes(range(256))


def test_errors(ip: InteractiveShell, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such local file"):
        ip.run_line_magic("exec_remote_upload", f"{tmp_path / 'nope'} /tmp/x")
    with pytest.raises(RemoteCommandError, match="RemoteFileNotFoundError"):
        ip.run_line_magic("exec_remote_download", f"{tmp_path / 'nope'} {tmp_path / 'x'}")
    with pytest.raises(UsageError):
        ip.run_line_magic("exec_remote_upload", "only-one-argument")
    big = tmp_path / "big"
    big.mkdir()
    for i in range(3):
        (big / f"f{i}").write_text("x")
    with pytest.raises(RemoteCommandError, match=r"TransferLimitError.*over max_files=2"):
        ip.run_line_magic("exec_remote_upload", f"{big} {tmp_path / 'never'} --max-files 2")
