"""Nothing from a sandbox or a saved notebook runs in the kernel or on the host (issue #21, 1-3).

A hostile fake agent (``hostile_agent.py``) lists jobs whose ids hold IPython's ``{expr}`` and
whose tags name the user's variables; a notebook's record names a sandbox URL whose option runs
a host program. Each goes through the real magics, :func:`reconnect` (what Reconnect buttons run)
and the hint texts a user is told to paste, in a real IPython shell; whether anything ran is
read from a marker file the attack would write.
"""

from __future__ import annotations

import builtins
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

import remote_exec as rx
from remote_exec.errors import ProtocolError
from remote_exec.jupyter import JobView, RemoteCommandError, ShellView
from remote_exec.jupyter.attach import reconnect, reconnect_dashboard, reconnect_shell
from remote_exec.jupyter.record import JobRecord
from remote_exec.jupyter.trust import attach_hint, jobs_hint, one_click, shell_hint

from .conftest import Adversary
from .hostile_agent import HostileAgent

AREA = "notebook trust"


def _job(job_id: str, tags: dict[str, str] | None = None) -> dict[str, Any]:
    now = time.time()
    return {
        "job_id": job_id,
        "pid": 1,
        "command": ["sh", "-c", "true"],
        "label": "evil",
        "state": "completed",
        "exit_code": 0,
        "started_at": now - 1,
        "ended_at": now,
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "stdin_open": False,
        "stdin_bytes": 0,
        "encoding": "utf-8",
        **({"tags": tags} if tags else {}),
    }


def _ended(params: dict[str, Any], payload: bytes | None) -> Any:
    return {"state": "completed", "exit_code": 0, "stdout": "", "stderr": "", "stdout_offset": 0, "stderr_offset": 0}


def evil_id(marker: Path) -> str:
    """The issue's job id: IPython's expansion of ``{…}`` would run the call and write ``marker``."""
    return f'train-0042{{__import__("os").system("id > {marker}")}}'


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    """A real IPython shell with ``%load_ext remote_exec``, in plain-text mode (no front end)."""
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    (tmp_path / "ipython").mkdir()
    ip = InteractiveShell.instance(config=config, ipython_dir=str(tmp_path / "ipython"))
    ip.run_line_magic("load_ext", "remote_exec")
    before = set(ip.user_ns)
    yield ip
    ip.run_line_magic("unload_ext", "remote_exec")
    for name in set(ip.user_ns) - before:
        del ip.user_ns[name]


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[HostileAgent]:
    """A hostile fake agent served from a thread of its own (the magics block their caller).

    Ask for it before ``shell``: the shell's connections must close first, or the client would
    find the fake gone and start a real agent in its state dir (checked at the end).
    """
    with start_blocking_portal("asyncio") as portal, portal.wrap_async_context_manager(HostileAgent(tmp_path)) as agent:
        yield agent
    assert not agents_in(agent.state_dir)


def agents_in(state_dir: Path) -> list[int]:
    """Processes whose command line names ``state_dir`` (a real agent started there)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.fsencode(state_dir) in argv:
            found.append(int(proc.name))
    return found


def test_an_id_with_an_expression_is_refused_by_attach_reconnect_and_hints(
    hostile: HostileAgent, shell: InteractiveShell, tmp_path: Path, adversary: Adversary
) -> None:
    marker = tmp_path / "ran"
    evil = evil_id(marker)
    hostile.handlers["exec_remote_list"] = lambda p, _: {"jobs": [_job(evil, {"name": "train"})]}
    hostile.handlers["exec_remote_poll"] = _ended
    shell.run_line_magic("exec_remote_config", f"--sandbox {hostile.url}")

    # the magic, typed (or pasted) with the id as the agent gave it: taken as typed, not expanded
    with pytest.raises((RemoteCommandError, UsageError)):
        shell.run_line_magic("exec_remote_attach", f"{evil} --sandbox {hostile.url}")
    adversary.tried(AREA, "%exec_remote_attach with {expr} in the id", refused=not marker.exists())
    assert not marker.exists()
    # found by the user's --name, the agent's id is checked before any use
    with pytest.raises(RemoteCommandError, match="unsafe form"):
        shell.run_line_magic("exec_remote_attach", "train")
    adversary.tried(AREA, "%exec_remote_attach NAME whose job id holds {expr}", refused=not marker.exists())
    assert "train" not in shell.user_ns and not marker.exists()
    # Reconnect (a view's, a record's): the kernel refuses the id before anything
    with pytest.raises(UsageError, match="unsafe form"):
        reconnect(hostile.url, evil)
    adversary.tried(AREA, "Reconnect with {expr} in the job id", refused=not marker.exists())
    assert not marker.exists()
    # the hints a record and a disconnected view show: none for such an id
    record = JobRecord(evil, "sleep 1", hostile.url, "running", None, 1.0, ("", 0), ("", 0))
    shown = record.plain() + record.html()
    no_hint = attach_hint(evil, hostile.url) is None and "%exec_remote_attach" not in shown
    adversary.tried(AREA, "record/view hint for an id holding {expr}", refused=no_hint)
    assert no_hint and not {"exec_remote_poll", "exec_remote_follow"} & set(hostile.calls)  # never followed either


@pytest.mark.parametrize("victim", ["data", "print", "np"])
def test_the_agents_tags_never_choose_a_kernel_variable(
    hostile: HostileAgent, shell: InteractiveShell, victim: str, adversary: Adversary
) -> None:
    hostile.handlers["exec_remote_list"] = lambda p, _: {"jobs": [_job("j-1", {"name": victim})]}
    hostile.handlers["exec_remote_poll"] = _ended
    mine = object()
    shell.user_ns[victim] = mine
    shell.run_line_magic("exec_remote_config", f"--sandbox {hostile.url}")  # the user opens it
    if victim in dir(builtins):
        # A name tag that shadows a builtin is refused by the client with the whole listing.
        with capture_output(), pytest.raises(RemoteCommandError, match="unsafe form"):
            shell.run_line_magic("exec_remote_attach", "j-1")
        untouched = shell.user_ns[victim] is mine
        adversary.tried(AREA, f"agent tag name={victim!r} on attach", refused=untouched)
        assert untouched
        return
    with capture_output():
        shell.run_line_magic("exec_remote_attach", "j-1")  # by id: no name typed, none bound
        reconnect(hostile.url, "j-1")  # a Reconnect in a kernel that opened this URL
        shell.run_line_magic("exec_remote_attach", "j-1 --name mine")  # the user's own name
    untouched = shell.user_ns[victim] is mine
    adversary.tried(AREA, f"agent tag name={victim!r} on attach and Reconnect", refused=untouched)
    assert untouched and shell.user_ns["mine"].job_id == "j-1"
    assert hostile.calls.count("exec_remote_list") >= 3  # each one did attach


def test_a_records_url_that_runs_a_host_program_is_not_opened(
    shell: InteractiveShell, tmp_path: Path, adversary: Adversary
) -> None:
    """A saved record's ``k8s://ns/pod?kubectl=./run-me``: Reconnect refuses with the magic to
    type and opens nothing (the script would write the marker the moment kubectl is run)."""
    marker = tmp_path / "ran"
    script = tmp_path / "run-me"
    script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 1\n")
    script.chmod(0o755)
    url = f"k8s://ns/pod?kubectl={script}"
    hint = f"%exec_remote_attach j-1 --sandbox {shlex.quote(url)}"
    with pytest.raises(UsageError, match="Not opened") as refusal:
        reconnect(url, "j-1")
    refused = not marker.exists()
    adversary.tried(AREA, "Reconnect to k8s://…?kubectl=<script beside the notebook>", refused=refused)
    assert refused and hint in str(refusal.value)


def test_a_shell_or_dashboard_reconnect_opens_no_host_program(
    shell: InteractiveShell, tmp_path: Path, adversary: Adversary
) -> None:
    """A saved shell's or dashboard's record (or a disconnected widget's state) names a URL that
    would run a host program: its Reconnect refuses with the magic to type and opens nothing; a
    dashboard checks every URL before it opens one."""
    marker = tmp_path / "ran"
    script = tmp_path / "run-me"
    script.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 1\n")
    script.chmod(0o755)
    url = f"k8s://ns/pod?kubectl={script}"
    with pytest.raises(UsageError, match="Not opened") as refusal:
        reconnect_shell(url, "s-1")
    assert f"%remote_shell --shell s-1 --sandbox {shlex.quote(url)}" in str(refusal.value)
    adversary.tried(AREA, "shell Reconnect to k8s://…?kubectl=<script>", refused=not marker.exists())
    state = shell.magics_manager.registry["RemoteExecMagics"].state
    with pytest.raises(UsageError, match="Not opened") as refusal:
        reconnect_dashboard("local://?scope=user", url)  # the first is one-click, the second is not
    assert f"%remote_jobs --sandbox 'local://?scope=user' --sandbox {shlex.quote(url)}" in str(refusal.value)
    opened_none = not marker.exists() and not state.sandboxes
    adversary.tried(AREA, "dashboard Reconnect naming one safe URL and k8s://…?kubectl=", refused=opened_none)
    assert opened_none
    with pytest.raises(UsageError, match="1 to 64 sandboxes"):
        reconnect_dashboard(*[f"docker://c{i}" for i in range(65)])
    assert not state.sandboxes


def test_a_shell_id_with_an_expression_is_refused_and_gets_no_hint(
    shell: InteractiveShell, tmp_path: Path, adversary: Adversary
) -> None:
    marker = tmp_path / "ran"
    evil = evil_id(marker)
    with pytest.raises(UsageError, match="unsafe shell id"):
        reconnect_shell("local://", evil)
    refused = not marker.exists() and shell_hint(evil, "local://") is None
    adversary.tried(AREA, "shell Reconnect with {expr} in the session id", refused=refused)
    assert refused and not shell.magics_manager.registry["RemoteExecMagics"].state.sandboxes
    # "new" and "last" are ids of the safe form, and words to the shell lookup: a record naming
    # one would open a shell (or show the user's newest) where Reconnect only shows one that is
    for word in ("new", "last"):
        with pytest.raises(UsageError, match="unsafe shell id"):
            reconnect_shell("local://", word)
        opened = shell.magics_manager.registry["RemoteExecMagics"].state.sandboxes
        adversary.tried(AREA, f"shell Reconnect naming the session {word!r}", refused=not opened)
        assert not opened


def test_a_pasted_shell_hint_is_taken_as_typed(shell: InteractiveShell, tmp_path: Path, adversary: Adversary) -> None:
    """``{…}`` in a pasted ``%remote_shell`` hint's URL stays text; ``%remote_jobs`` expands its
    line (the tutorials pass sandboxes as ``{url}``), so no dashboard hint names such a URL."""
    marker = tmp_path / "ran"
    url = f'nosuch://{{open("{marker}","w")}}'
    hint = shell_hint("s-1", url)
    assert hint is not None and shlex.split(hint)[:2] == ["%remote_shell", "--shell"]
    with pytest.raises(UsageError, match="unsupported sandbox URL"):
        shell.run_cell(hint, store_history=False).raise_error()
    no_jobs_hint = all(jobs_hint(["local://", u]) is None for u in (url, "local://?x=$HOME", "a}"))
    adversary.tried(AREA, "pasted %remote_shell hint / %remote_jobs hint with {expr}", refused=not marker.exists())
    assert not marker.exists() and no_jobs_hint
    assert jobs_hint(["local://", "docker://c"]) == "%remote_jobs --sandbox local:// --sandbox docker://c"


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("local://", True),
        ("local://?scope=user", True),
        ("docker://my-box_1.x", True),
        ("podman://box", True),
        ("local://?dir=/srv/x", False),
        ("local://?scope=user&dir=/x", False),
        ("docker://box?docker=./run-me", False),
        ("docker://box?host=tcp://evil:2375", False),
        ("docker://box?user=root", False),
        ("docker://-box", False),
        ("docker://box\n", False),
        ("docker+image://alpine", False),
        ("docker+image://alpine?volume=/:/host", False),
        ("k8s://ns/pod", False),
        ("k8s://ns/pod?kubectl=./run-me", False),
        ("ssh://host", False),
        ("ssh://host?config=./cfg", False),
        ("jail://", False),
        ("jail://?rw=/", False),
        ("LOCAL://", False),
    ],
)
def test_one_click_is_a_closed_list(url: str, ok: bool) -> None:
    assert one_click(url) is ok


@pytest.mark.parametrize(
    "url",
    [
        "k8s://ns/pod?kubectl=./run-me",
        "ssh://h?config=./it's",
        'local://?dir=/x{__import__("os").system("id")}',
        "docker://x;touch${IFS}y",
    ],
)
def test_a_pasted_hint_gives_the_magic_exactly_its_values(url: str) -> None:
    hint = attach_hint("job-1", url)
    assert hint is not None and "\n" not in hint
    assert shlex.split(hint) == ["%exec_remote_attach", "job-1", "--sandbox", url]


def test_no_hint_for_an_unsafe_id_or_a_url_that_is_not_one_plain_line() -> None:
    assert attach_hint("job-1", "local://\nimport os") is None  # the rest would be a line of Python
    assert attach_hint("job-1", "local:// x") is None
    assert attach_hint("job 1", "local://") is None
    assert attach_hint("job-1") == "%exec_remote_attach job-1"


def test_a_pasted_hint_is_taken_as_typed(shell: InteractiveShell, tmp_path: Path, adversary: Adversary) -> None:
    """``{…}`` in a pasted hint's URL stays text: ``%exec_remote_attach`` takes no ``{var}``."""
    marker = tmp_path / "ran"
    hint = attach_hint("job-1", f'nosuch://{{open("{marker}","w")}}')
    assert hint is not None
    with pytest.raises(UsageError, match="unsupported sandbox URL"):
        shell.run_cell(hint, store_history=False).raise_error()
    adversary.tried(AREA, "pasted hint whose URL holds {expr}", refused=not marker.exists())
    assert not marker.exists()


def _shell(session_id: str) -> dict[str, Any]:
    now = time.time()
    return {
        "session_id": session_id,
        "pid": 1,
        "program": "bash",
        "state": "open",
        "cwd": "/",
        "busy": False,
        "run_id": None,
        "run_command": None,
        "created_at": now,
        "last_used_at": now,
    }


def test_views_refuse_an_unsafe_job_or_session_id(hostile: HostileAgent, tmp_path: Path, adversary: Adversary) -> None:
    """A JobView (also the dashboard's Open) and a ShellView show their id and offer it to paste:
    an id of another form from the agent is refused before the view exists."""
    marker = tmp_path / "ran"
    evil = evil_id(marker)
    hostile.handlers["exec_remote_list"] = lambda p, _: {"jobs": [_job(evil)]}
    hostile.handlers["shell_list"] = lambda p, _: {"shells": [_shell(evil)]}
    with rx.connect(hostile.url) as sb:
        with pytest.raises(ProtocolError, match="unsafe form"):
            JobView.attach(sb, evil)
        with pytest.raises(ProtocolError, match="not a job id"):
            sb.attach(evil)  # the client refuses it as well, before anything is sent
        with pytest.raises(ProtocolError, match="unsafe form"):
            ShellView(sb, session_id="s-1")
    refused = not marker.exists()
    adversary.tried(AREA, "JobView/ShellView on an id holding {expr}", refused=refused)
    assert refused and not {"exec_remote_poll", "exec_remote_follow"} & set(hostile.calls)
