"""A hostile agent names jobs, shells and tags: every id, name and tag key is data, checked
against ``protocol/names.py`` on the host before any use, and refused with one clear line.

Issue #21 point 1: an id such as ``train-0042{__import__("os").system(...)}`` reached the kernel
through IPython's ``{expr}`` expansion; point 3: the agent's ``tags["name"]`` chose a kernel
variable. Here the client layer is shown to refuse each such value the moment it arrives, so
nothing above it (the notebook face, the CLI) is ever handed one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import remote_exec as rx

from .conftest import Adversary
from .hostile_agent import HostileAgent, WireError

pytestmark = pytest.mark.anyio

AREA = "ids from the agent"
REFUSED = r"unsafe form|another id|at most 128|at least 1"  # the form, the chosen id, the length bounds

BAD_IDS = {
    "a Python expression": 'train-0042{__import__("os").system("id > /tmp/x")}',
    "a shell substitution": "$(touch x)",
    "a path": "../x",
    "a 10 KB id": "a" * 10_000,
    "terminal controls": "x\x1b]52;c;aWQ=\x07",
    "an empty id": "",
}

BAD_TAGS = {
    "name tag 'print' (a builtin)": {"name": "print"},
    "name tag 'data{1}'": {"name": "data{1}"},
    "name tag 'class' (a keyword)": {"name": "class"},
    "a tag key with a screen clear": {"\x1b[2J": "v"},
}


def _job(job_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "pid": 1,
        "command": "true",
        "label": None,
        "state": "completed",
        "exit_code": 0,
        "started_at": 0.0,
        "ended_at": 0.0,
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "stdin_open": False,
        "stdin_bytes": 0,
        "encoding": "utf-8",
        **extra,
    }


def _refusal(err: pytest.ExceptionInfo[rx.ProtocolError], bad: object) -> bool:
    """A clear refusal: one line, short, and the value (if long) only cut short."""
    text = str(err.value)
    return "\n" not in text and len(text) < 600 and (len(repr(bad)) < 80 or repr(bad) not in text)


@pytest.mark.parametrize("case", list(BAD_IDS))
async def test_a_listing_naming_an_unsafe_id_is_refused(tmp_path: Path, adversary: Adversary, case: str) -> None:
    bad = BAD_IDS[case]
    handlers = {"exec_remote_list": lambda p, _: {"jobs": [_job("ok-1"), _job(bad)]}}
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError, match=REFUSED) as err:
            await sb.jobs()
        listed = _refusal(err, bad)
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError):
            await sb.attach(bad if bad else "ok-1")  # attach reads the same listing
    assert listed, str(err.value)
    adversary.tried(AREA, f"listing: {case}", refused=listed)


@pytest.mark.parametrize("case", list(BAD_IDS))
async def test_a_page_cursor_of_an_unsafe_form_is_refused(tmp_path: Path, adversary: Adversary, case: str) -> None:
    bad = BAD_IDS[case]
    handlers = {"exec_remote_list": lambda p, _: {"jobs": [_job("ok-1")], "next": bad}}
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError) as err:
            await sb.jobs()
    assert agent.calls.count("exec_remote_list") == 1  # never sent back as the next page's cursor
    adversary.tried(AREA, f"listing cursor: {case}", refused=_refusal(err, bad))


@pytest.mark.parametrize("case", [*BAD_IDS, "another safe id"])
async def test_a_start_answered_with_another_id_is_refused(tmp_path: Path, adversary: Adversary, case: str) -> None:
    bad = BAD_IDS.get(case, "x-1")
    chosen: list[str] = []

    def start(p: dict[str, Any], _: bytes | None) -> dict[str, Any]:
        chosen.append(p["job_id"])
        return {"job_id": bad, "pid": 4242}

    async with HostileAgent(tmp_path, {"exec_remote_start": start}) as agent, rx.open_sandbox(agent.url) as sb:
        proc = sb.exec_remote(["true"])
        mine = proc.job_id
        with (
            anyio.fail_after(10),
            pytest.raises(rx.ProtocolError, match=REFUSED) as err,
        ):
            await proc.wait()
    assert mine is not None and chosen == [mine] and proc.job_id == mine  # the agent's id never replaced it
    # Nothing was asked of a job under that id: a follow may have gone out behind the start, under
    # the id this client chose (the hostile agent knows no follow: the start's refusal is what is said).
    assert "exec_remote_poll" not in agent.calls and agent.calls.count("exec_remote_follow") <= 1
    adversary.tried(AREA, f"start answer: {case}", refused=_refusal(err, bad))


@pytest.mark.parametrize("case", list(BAD_TAGS))
async def test_unsafe_tags_in_a_listing_are_refused(tmp_path: Path, adversary: Adversary, case: str) -> None:
    tags = BAD_TAGS[case]
    handlers = {"exec_remote_list": lambda p, _: {"jobs": [_job("ok-1", tags=tags)]}}
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError, match="unsafe form") as err:
            await sb.jobs()
    adversary.tried(AREA, f"tags: {case}", refused=_refusal(err, tags))


def _shell(session_id: str, run_id: str | None = None) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "pid": 1,
        "program": "/bin/sh",
        "state": "open",
        "cwd": "/",
        "busy": run_id is not None,
        "run_id": run_id,
        "run_command": None,
        "created_at": 0.0,
        "last_used_at": 0.0,
    }


@pytest.mark.parametrize("case", list(BAD_IDS))
async def test_shell_session_and_run_ids_of_an_unsafe_form_are_refused(
    tmp_path: Path, adversary: Adversary, case: str
) -> None:
    bad = BAD_IDS[case]
    handlers = {
        "shell_open": lambda p, _: _shell(bad),
        "shell_list": lambda p, _: {"shells": [_shell("s-1", run_id=bad)]},
        "shell_run": lambda p, _: {"job_id": bad, "pid": 1},
    }
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError) as opened:
            await sb.shell()
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError) as listed:
            await sb.reattach_shell("s-1")
        agent.handlers["shell_list"] = lambda p, _: {"shells": [_shell("s-1")]}
        sh = await sb.reattach_shell("s-1")
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError) as ran:
            await sh.run("true")
    assert not {"exec_remote_poll", "exec_remote_follow"} & set(agent.calls)
    adversary.tried(AREA, f"shell session id: {case}", refused=_refusal(opened, bad))
    adversary.tried(AREA, f"shell's run in progress: {case}", refused=_refusal(listed, bad))
    adversary.tried(AREA, f"shell run id: {case}", refused=_refusal(ran, bad))


async def test_pruned_ids_of_an_unsafe_form_are_refused(tmp_path: Path, adversary: Adversary) -> None:
    bad = BAD_IDS["a Python expression"]
    handlers = {"exec_remote_prune": lambda p, _: {"forgotten": 1, "job_ids": [bad]}}
    async with HostileAgent(tmp_path, handlers) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError) as err:
            await sb.prune(keep=0)
    adversary.tried(AREA, "prune answer: a Python expression", refused=_refusal(err, bad))


@pytest.mark.parametrize("case", [c for c in BAD_IDS if BAD_IDS[c]])
async def test_an_error_naming_an_unsafe_id_is_refused(tmp_path: Path, adversary: Adversary, case: str) -> None:
    bad = BAD_IDS[case]

    def gone(p: dict[str, Any], _: bytes | None) -> Any:
        raise WireError(-32001, "no such job", {"job_id": bad})  # JobNotFoundError, as the agent says it

    async with HostileAgent(tmp_path, {"exec_remote_forget": gone}) as agent, rx.open_sandbox(agent.url) as sb:
        with anyio.fail_after(10), pytest.raises(rx.ProtocolError, match="unsafe form") as err:
            await sb.forget("ok-1")
    adversary.tried(AREA, f"an error's job id: {case}", refused=not isinstance(err.value, rx.JobNotFoundError))
