"""Text from the sandbox cannot drive the user's terminal through the CLI (issue #12, point 6).

Job labels and commands, ids, file names and error messages come from the sandbox; printed raw,
``ESC ] 52`` would write the user's clipboard and ``ESC [ 2 J`` clear the screen. The CLI runs
here as users run it (a subprocess), against a real agent or the hostile fake one, and what it
prints must hold no control character but the newlines between its own lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import remote_exec as rx
from remote_exec.agent.jobs.proctable import group_members

from ..conftest import run_cli
from .conftest import Adversary
from .hostile_agent import Handler, HostileAgent, WireError

CLI = [sys.executable, "-m", "remote_exec.cli"]

HOSTILE = {
    "osc52-clipboard": "\x1b]52;c;ZWNobyBwd25lZA==\x07",
    "csi-clear-screen": "\x1b[2J\x1b[H",
    "carriage-return": "innocent\rEVIL",
    "bel": "ding\x07",
    "newline-forged-row": "x\nfake-job-1 1 running",
    "rlo-bidi": "txt.\u202eexe",
    "c1-csi": "\x9b2J",
    "del-and-backspace": "a\x7f\x08b",
    "line-separator": "a\u2028b",
}


def unsafe_chars(text: str) -> list[str]:
    """What a terminal would act on, besides the line breaks between the CLI's own lines."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


def decoded(data: bytes) -> str:
    return data.decode()  # strict: the CLI's output is UTF-8, whatever the sandbox sent


@pytest.fixture
def sandbox(fresh_agent_dir: Path) -> Iterator[str]:
    yield f"local://?dir={fresh_agent_dir}"


def test_ps_prints_each_hostile_label_and_command_safely(sandbox: str, adversary: Adversary) -> None:
    ids = {}
    with rx.connect(sandbox) as sb:
        for case, evil in HOSTILE.items():
            proc = sb.exec_remote(["sh", "-c", f": {evil}"], rx.ExecRemoteOptions(label=f"{case} {evil}"))
            proc.wait()
            ids[case] = proc.job_id
    r = subprocess.run([*CLI, "-s", sandbox, "ps", "-a"], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b""
    out = decoded(r.stdout)
    rows = out.splitlines()[1:]
    assert len(rows) == len(HOSTILE)  # one row per job: a newline in a command forges none
    for case in HOSTILE:
        row = next(row for row in rows if row.startswith(str(ids[case])))
        refused = not unsafe_chars(row) and case in row
        adversary.tried("terminal escapes", f"ps label and command: {case}", refused=refused)
        assert refused, row
    assert "\\x1b]52;c;" in out and "\\u202e" in out and "\\x9b" in out and "\u23ce" in out  # shown, not run
    assert not unsafe_chars(out)


def _job(job_id: str, command: str, label: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "pid": 1,
        "command": ["sh", "-c", command],
        "label": label,
        "state": "running",
        "exit_code": None,
        "started_at": 1e300,  # no calendar holds it
        "ended_at": None,
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "stdin_open": False,
        "stdin_bytes": 0,
        "encoding": "utf-8",
    }


EVIL = "\x1b]52;c;aGk=\x07\x1b[2J\u202e"


def _refuse(params: dict[str, Any], payload: bytes | None) -> Any:
    raise WireError(-32603, f"no such thing {EVIL}\nforged line")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("case", "handlers", "args"),
    [
        ("ps: ids, labels, commands", {"exec_remote_list": lambda p, _: {"jobs": [_job(EVIL, EVIL, EVIL)]}}, ["ps"]),
        ("ps: lone surrogates", {"exec_remote_list": lambda p, _: {"jobs": [_job("a-1", "\udcff", "\udcfe")]}}, ["ps"]),
        ("error message from kill", {"exec_remote_kill": _refuse, "exec_remote_list": _refuse}, ["kill", "a-1"]),
        ("error message from cp", {"file_stat": _refuse}, ["cp", "sandbox:/x", "-"]),
    ],
    ids=["ps", "ps-surrogates", "kill-error", "cp-error"],
)  # fmt: skip
async def test_hostile_agent_text_is_printed_safely(
    tmp_path: Path, adversary: Adversary, case: str, handlers: dict[str, Handler], args: list[str]
) -> None:
    async with HostileAgent(tmp_path, handlers) as agent:
        r = await anyio.run_process([*CLI, "-s", agent.url, *args], check=False)
    out, err = decoded(r.stdout), decoded(r.stderr)
    refused = "Traceback" not in err and not unsafe_chars(out) and not unsafe_chars(err.rstrip("\n"))
    adversary.tried("terminal escapes", f"hostile agent, {case}", refused=refused)
    assert refused, (r.returncode, out, err)
    if case.startswith("error"):
        assert r.returncode == 2 and "\\x1b]52;c;" in err and "\\nforged line" in err
    else:
        assert r.returncode in (0, 2) and len(out.splitlines()) <= 2


@pytest.mark.anyio
async def test_cp_download_under_a_lying_name_is_refused(tmp_path: Path, adversary: Adversary) -> None:
    # The agent says the source resolves to ".../..": saved "into" a directory under that name
    # it would land in the directory's parent.
    def stat(params: dict[str, Any], payload: bytes | None) -> dict[str, Any]:
        return {"path": "/work/..", "name": "..", "type": "file", "size": 3, "mode": 0o644, "mtime_ns": 0}

    into = tmp_path / "into"
    into.mkdir()
    async with HostileAgent(tmp_path, {"file_stat": stat}) as agent:
        r = await anyio.run_process([*CLI, "-s", agent.url, "cp", "sandbox:/work/x", os.fspath(into)], check=False)
    said = b"ProtocolError" in r.stderr and b"refused" in r.stderr
    refused = r.returncode == 2 and said and agent.calls[-1] == "file_stat"
    adversary.tried("terminal escapes", "cp download named '..' by the agent", refused=refused)
    assert refused, (r.stderr, agent.calls)


def test_cp_prints_hostile_file_names_safely(sandbox: str, tmp_path: Path, adversary: Adversary) -> None:
    with rx.connect(sandbox) as sb:
        work = os.fspath(tmp_path / "tree")  # local://: the sandbox is this machine
        names = [f"{case}-{evil}" for case, evil in HOSTILE.items()]
        script = 'mkdir "$1" && cd "$1" && shift && printf xxxx > "$1" && for n; do printf x >> "$n"; done'
        made = sb.run(["sh", "-c", script, "sh", work, *names])
        assert made.returncode == 0, made.stderr
    # Over its cap, the download names the biggest files: names the sandbox chose.
    r = subprocess.run(
        [*CLI, "-s", sandbox, "cp", "--max-files", "1", f"sandbox:{work}", os.fspath(tmp_path / "out")],
        capture_output=True,
        timeout=60,
    )
    err = decoded(r.stderr)
    refused = r.returncode == 2 and "TransferLimitError" in err and not unsafe_chars(err.rstrip("\n"))
    adversary.tried("terminal escapes", "cp error naming hostile files", refused=refused)
    assert refused, err
    assert "osc52-clipboard-\\x1b]52;c;" in err  # named, escaped


def test_ps_into_a_closed_pipe_stops_quietly(sandbox: str, adversary: Adversary) -> None:
    # `remote-exec ps | head -1` with head gone before the CLI writes: no reader from the start
    # makes the race deterministic.
    run_cli("-s", sandbox, "run", "--detach", "--", "true")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([*CLI, "-s", sandbox, "ps"], stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    refused = r.stderr == b"" and r.returncode in (0, 141)
    adversary.tried("terminal escapes", "ps | head: closed stdout", refused=refused)
    assert refused, (r.returncode, r.stderr)


def test_run_into_a_closed_pipe_kills_its_job(sandbox: str, adversary: Adversary) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        argv = [*CLI, "-s", sandbox, "run", "--label", "yes-pipe", "--", "sh", "-c", "while :; do echo y; done"]
        r = subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    with rx.connect(sandbox) as sb:
        job = next(j for j in sb.jobs() if j.label == "yes-pipe")
        sb.attach(job.job_id).wait()  # the kill's SIGTERM ends it
    refused = r.stderr == b"" and r.returncode == 141 and group_members(job.pid) == []
    adversary.tried("terminal escapes", "run | head: job left running", refused=refused)
    assert refused, (r.returncode, r.stderr)
