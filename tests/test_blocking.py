"""The blocking twin: in a plain script, inside a running loop, under nest_asyncio, and Ctrl-C."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import remote_exec as rx


def run_script(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=90)


SCRIPT = """
import remote_exec as rx
with rx.connect({url!r}) as sb:
    events = list(sb.exec_remote(["sh", "-c", "echo hi; echo oops >&2; exit 2"]))
    assert set(events[:-1]) == {{rx.StdoutChunk("hi\\n"), rx.StderrChunk("oops\\n")}}, events
    assert events[-1] == rx.Completed(2, "hi\\n", "oops\\n"), events
    assert sb.run(["true"]).success
    assert sb.exec_remote(["echo", "x"], stream=False).stdout == "x\\n"
print("ok")
"""


def test_plain_script(agent_dir: Path) -> None:
    r = run_script(SCRIPT.format(url=f"local://?dir={agent_dir}"))
    assert r.stdout == "ok\n", r.stderr


def test_inside_running_event_loop(agent_dir: Path) -> None:
    code = "import asyncio\nasync def cell():\n" + textwrap.indent(
        SCRIPT.format(url=f"local://?dir={agent_dir}"), "    "
    )
    r = run_script(code + "\nasyncio.run(cell())\n")
    assert r.stdout == "ok\n", r.stderr


def test_under_nest_asyncio(agent_dir: Path) -> None:
    body = textwrap.indent(SCRIPT.format(url=f"local://?dir={agent_dir}"), "    ")
    code = "import asyncio, nest_asyncio\nnest_asyncio.apply()\nasync def cell():\n" + body
    r = run_script(code + "\nasyncio.get_event_loop().run_until_complete(cell())\n")
    assert r.stdout == "ok\n", r.stderr


def test_keyboard_interrupt_kills_the_job(agent_dir: Path) -> None:
    r = run_script(f"""
        import os, signal, threading
        import remote_exec as rx
        from remote_exec.agent.jobs.proctable import group_members
        def ctrl_c(after):  # what a terminal or a Jupyter kernel interrupt does: SIGINT
            threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)).start()
        with rx.connect("local://?dir={agent_dir}") as sb:
            proc = sb.exec_remote(["sh", "-c", "echo up; sleep 300"], kill_grace=0.2)
            try:
                for ev in proc:
                    ctrl_c(0.2)  # while the next event is awaited
            except KeyboardInterrupt:
                print("interrupted", group_members(proc.pid))
            ctrl_c(0.3)
            try:
                sb.run(["sleep", "300"], kill_grace=0.2)
            except KeyboardInterrupt:
                print("run interrupted", [j.state for j in sb.jobs()][-1])
    """)
    assert r.stdout == "interrupted []\nrun interrupted killed\n", r.stderr


def test_in_process_sandboxes_share_one_loop_thread(agent_dir: Path) -> None:
    url = f"local://?dir={agent_dir}"
    with rx.connect(url) as a, rx.connect(url) as b:
        assert a._portal is b._portal
        proc = a.exec_remote(["sh", "-c", "echo 1; sleep 0.1; echo 2"])
        assert proc.job_id is not None  # started before exec_remote returned
        watcher = b.attach(proc.job_id)
        assert proc.wait().stdout == watcher.wait().stdout == "1\n2\n"
    with pytest.raises(RuntimeError, match="closed"):
        a.jobs()


RENAMES = {"aclose": "close"}


def twin_name(name: str) -> str:
    """The blocking twin's name for an async member: ``aclose`` -> ``close``, ``aiter_x`` -> ``iter_x``."""
    return "iter_" + name.removeprefix("aiter_") if name.startswith("aiter_") else RENAMES.get(name, name)


PAIRS = [
    (rx.AsyncSandbox, rx.Sandbox),
    (rx.ExecRemoteProcess, rx.BlockingExecRemoteProcess),
    (rx.ShellSession, rx.BlockingShellSession),
    (rx.PortForward, rx.BlockingPortForward),
    (rx.SandboxPool, rx.BlockingSandboxPool),
]
# What a blocking twin leaves out on purpose, and why.
NOT_TWINNED = {
    "open": "a blocking sandbox opens in its constructor",
    "started": "blocking handles are returned started",
    "start": "a blocking forward is returned listening",
    "transport": "construction settings of the async sandbox; reach them as sb.async_sandbox.<name>",
    "response_margin": "(as above)",
    "open_timeout": "(as above)",
    "liveness": "(as above)",
    "options": "the async process's options; reach them as proc.async_process.options",
    "kill_on_cancel": "Ctrl-C on a blocking handle always kills the job",
    "connection": "the async connection a job's feed is shared on; reach it as proc.async_process.connection",
}


# What only the blocking side has, and why.
BLOCKING_ONLY = {"portal": "the shared event-loop portal, for code that mixes the two APIs (jupyter/follow.py)"}


def public_surface(cls: type) -> dict[str, object]:
    """Public methods and properties of ``cls``, and the attributes its ``__init__`` sets."""
    names = {n: m for n, m in inspect.getmembers(cls) if not n.startswith("_")}
    for klass in cls.__mro__[:-1]:  # every __init__ of the class and its bases sets attributes
        if "__init__" in vars(klass):
            init = inspect.getsource(vars(klass)["__init__"])
            for attr in re.findall(r"^\s+self\.([a-z]\w*)\s*(?::[^=\n]+)?=", init, re.M):
                names.setdefault(attr, property())  # an instance attribute reads like a property
    return names


def check_twin(async_cls: type, blocking_cls: type) -> list[str]:
    """Every difference between the public surface of ``async_cls`` and its blocking twin's."""
    problems = []
    theirs = public_surface(blocking_cls)
    for name, member in public_surface(async_cls).items():
        if name in NOT_TWINNED:
            continue
        twin = theirs.get(twin_name(name))
        if twin is None:
            problems.append(f"{blocking_cls.__name__} lacks {name}")
        elif isinstance(member, property) != isinstance(twin, property):
            problems.append(f"{name} is a property on one twin only")
        elif callable(member):
            if inspect.iscoroutinefunction(twin) or not callable(twin):
                problems.append(f"{blocking_cls.__name__}.{name} is not a plain method")
                continue
            a = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
            b = [(p.name, p.kind, p.default) for p in inspect.signature(twin).parameters.values()]
            if a != b:
                problems.append(f"{name}: {a} != {b}")
    mine = {twin_name(n) for n in public_surface(async_cls)}
    problems += [f"{blocking_cls.__name__}.{n} has no async original" for n in sorted(set(theirs) - mine)
                 if not n.startswith("async_") and n not in BLOCKING_ONLY]  # fmt: skip
    return problems


@pytest.mark.parametrize(("async_cls", "blocking_cls"), PAIRS, ids=[b.__name__ for _, b in PAIRS])
def test_blocking_twin_has_the_same_surface(async_cls: type, blocking_cls: type) -> None:
    assert check_twin(async_cls, blocking_cls) == []


ASYNC_ONLY = {
    "SandboxTransport": "the seam a backend implements, not an API to call; no twin by design",
    "Fleet": "fans out on one event loop; blocking code loops over rx.connect() or uses a pool",
}


def test_every_async_class_has_its_twin_checked() -> None:
    exported = [getattr(rx, name) for name in rx.__all__]  # getattr: the root's names are lazy
    async_classes = {v for v in exported if inspect.isclass(v) and any(
        inspect.iscoroutinefunction(m) for n, m in inspect.getmembers(v) if not n.startswith("_"))}  # fmt: skip
    unchecked = {c.__name__ for c in async_classes - {a for a, _ in PAIRS}}
    assert unchecked == set(ASYNC_ONLY)


def test_the_check_can_fail() -> None:
    class Twin:
        def __init__(self) -> None:
            self.async_thing = None

        def close(self) -> None: ...

    problems = check_twin(rx.PortForward, Twin)
    assert "Twin lacks url" in problems and "Twin lacks connections" in problems


def test_handles_of_a_closed_sandbox_raise_our_error(agent_dir: Path) -> None:
    sb = rx.connect(f"local://?dir={agent_dir}")
    proc = sb.exec_remote(["sleep", "300"], stdin_open=True)
    sh = sb.shell()
    assert not sb.closed
    sb.close()  # the last lease: the portal's thread stops
    assert sb.closed
    for call in (proc.wait, proc.close_stdin, lambda: next(proc), sh.refresh, lambda: sh.run("true"), sb.jobs):
        with pytest.raises(rx.SandboxClosedError, match="closed; open a new one"):
            call()
