"""The blocking twin: in a plain script, inside a running loop, under nest_asyncio, and Ctrl-C."""

from __future__ import annotations

import inspect
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


@pytest.mark.parametrize(
    ("async_cls", "blocking_cls"),
    [(rx.AsyncSandbox, rx.Sandbox), (rx.ExecRemoteProcess, rx.BlockingExecRemoteProcess)],
)
def test_blocking_twin_has_every_public_method(async_cls: type, blocking_cls: type) -> None:
    skip = {"open", "started", "events"}  # the blocking twins open/start eagerly; events is a property on both
    for name, member in inspect.getmembers(async_cls):
        if name.startswith("_") or name in skip or not callable(member):
            continue
        twin_name = "iter_" + name.removeprefix("aiter_") if name.startswith("aiter_") else RENAMES.get(name, name)
        twin = getattr(blocking_cls, twin_name, None)
        assert twin is not None, f"{blocking_cls.__name__} lacks {name}"
        a = [p for p in inspect.signature(member).parameters.values() if p.name != "self"]
        b = [p for p in inspect.signature(twin).parameters.values() if p.name != "self"]
        assert [(p.name, p.kind, p.default) for p in a] == [(p.name, p.kind, p.default) for p in b], name
