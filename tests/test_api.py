"""The public surface: controlled exports, honest docstrings, layering that keeps the agent small."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any

import pytest

import remote_exec as rx
import remote_exec.errors

MODULES = sorted(m.name for m in pkgutil.walk_packages(rx.__path__, "remote_exec.") if not m.name.endswith("__main__"))


def test_top_level_all_is_sorted_and_importable() -> None:
    assert rx.__all__ == sorted(rx.__all__)
    for name in rx.__all__:
        assert getattr(rx, name) is not None


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_all(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    for exported in module.__all__:
        assert hasattr(module, exported), f"{name}.__all__ names missing {exported}"


def test_raises_in_docstrings_name_real_exceptions() -> None:
    known = {n for n, v in vars(remote_exec.errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    known |= {n for n, v in vars(builtins).items() if isinstance(v, type)}
    for name in MODULES:
        known |= {
            n
            for n, v in vars(importlib.import_module(name)).items()
            if isinstance(v, type) and issubclass(v, Exception)
        }
    for name in MODULES:
        for _, obj in inspect.getmembers(importlib.import_module(name)):
            if getattr(obj, "__module__", None) != name:
                continue  # only what our own modules define
            for member in [obj, *vars(obj).values()] if inspect.isclass(obj) else [obj]:
                doc = inspect.getdoc(member) if callable(member) or isinstance(member, property) else None
                for raised in re.findall(r":raises (\w+):", doc or ""):
                    assert raised in known, f"{name}: {member!r} documents :raises {raised}: which does not exist"


def _async_classes() -> list[type]:
    """Every public class of the package with an async member (through ``rx.__all__``'s lazy names)."""
    classes = [getattr(rx, name) for name in rx.__all__]
    return [c for c in classes if inspect.isclass(c) and _async_members(c)]


def _async_members(cls: type) -> dict[str, object]:
    """The public members of ``cls``, inherited ones included, that start async work: coroutine
    functions, async generators, async context managers, and methods returning an awaitable or
    one of the package's async handles (``forward_port``, ``exec_remote``)."""
    handles = {"Coroutine", "Awaitable", "ExecRemoteProcess", "PortForward", "ShellSession"}
    found: dict[str, object] = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or not callable(member):
            continue
        wrapped = getattr(member, "__wrapped__", member)  # @asynccontextmanager keeps the generator here
        if inspect.iscoroutinefunction(wrapped) or inspect.isasyncgenfunction(wrapped):
            found[name] = member
            continue
        try:
            returns = inspect.signature(member).return_annotation
        except (TypeError, ValueError):
            continue
        if isinstance(returns, str) and handles & set(re.findall(r"\w+", returns)):
            found[name] = member
    return found


def _missing_cancellation_notes(cls: type) -> list[str]:
    """The async members of ``cls`` whose docstring does not say what cancelling them does."""
    return [
        f"{cls.__name__}.{name}"
        for name, member in _async_members(cls).items()
        if "cancel" not in (inspect.getdoc(member) or "").lower()
    ]


def test_async_classes_are_found() -> None:
    found = {c.__name__ for c in _async_classes()}
    assert {"AsyncSandbox", "ExecRemoteProcess", "Fleet", "PortForward", "SandboxPool", "ShellSession"} <= found
    assert {"upload", "write_file_from", "forward_port", "exec_remote"} <= set(_async_members(rx.AsyncSandbox))
    assert "lease" in _async_members(rx.SandboxPool)  # an @asynccontextmanager


def test_public_coroutines_say_what_cancellation_does() -> None:
    missing = [m for cls in _async_classes() for m in _missing_cancellation_notes(cls)]
    assert not missing, f"docstrings that do not say what cancelling does: {missing}"


def test_the_cancellation_check_can_fail() -> None:
    class Base:
        async def inherited(self) -> None:
            """Silent about it."""

    class Dummy(Base):
        async def said(self) -> None:
            """Cancelling it changes nothing."""

        async def undocumented(self) -> None:
            pass

        def handle(self) -> Coroutine[Any, Any, None]:
            """Returns an awaitable; silent about it."""
            return self.said()

    assert sorted(_missing_cancellation_notes(Dummy)) == ["Dummy.handle", "Dummy.inherited", "Dummy.undocumented"]


def test_agent_imports_nothing_host_side() -> None:
    code = (
        "import sys, remote_exec.agent.cli, remote_exec.agent.server, remote_exec.agent.relay\n"
        "host = {'ipywidgets', 'IPython', 'anywidget', 'asyncssh', 'tqdm', 'pathspec'}\n"
        "ours = ('remote_exec.client', 'remote_exec.sandboxes', 'remote_exec.jupyter', 'remote_exec.blocking')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in host or m.startswith(ours))\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def subclasses(cls: type[rx.RemoteExecError]) -> list[type[rx.RemoteExecError]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in subclasses(sub))]


def test_every_error_is_drawn_in_the_tree_with_a_unique_code() -> None:
    tree = (remote_exec.errors.__doc__ or "").split("::")[1]
    drawn = re.findall(r"^[\s│├└─]*(\w+)", tree, re.M)
    classes = subclasses(rx.RemoteExecError)
    for cls in classes:
        assert cls.__module__ == "remote_exec.errors", f"{cls.__name__} lives outside errors.py"
        assert cls.__name__ in drawn, f"{cls.__name__} is not drawn in the tree"
        assert "code" in vars(cls), f"{cls.__name__} has no code of its own"
    codes = [cls.code for cls in classes]
    assert len(set(codes)) == len(codes), sorted(codes)
    # Drawn under its real parent: each name's nearest less-indented line above it.
    found = re.finditer(r"^([ │]*(?:[├└]── )?)(\w+)", tree, re.M)
    lines = [(len(m[1]), m[2]) for m in found if "──" in m[1] or m[1] == "    "]  # not continuation lines
    for i, (depth, name) in enumerate(lines):
        parent = next((n for d, n in reversed(lines[:i]) if d < depth), None)
        cls = getattr(remote_exec.errors, name, None) or getattr(builtins, name)
        if parent is not None:
            assert cls.__mro__[1].__name__ == parent, f"{name} is drawn under {parent}"
    for name in MODULES:  # no public exception of ours lives elsewhere
        for obj in vars(importlib.import_module(name)).values():
            ours = inspect.isclass(obj) and obj.__module__.startswith("remote_exec") and obj.__name__[0] != "_"
            if ours and issubclass(obj, BaseException):  # private control-flow signals may live elsewhere
                assert obj.__module__ == "remote_exec.errors", f"{obj.__module__}.{obj.__name__}"


def test_error_codes_round_trip() -> None:
    for code, cls in rx.errors.ERROR_CLASSES.items():
        err = rx.errors.error_from_wire(code, "m", {"job_id": "a-1"})
        assert type(err) is cls and err.code == code
        if isinstance(err, rx.JobError):
            assert err.job_id == "a-1"
    assert isinstance(rx.errors.error_from_wire(-32099, "x"), rx.ProtocolError)
    assert issubclass(rx.ExecTimeoutError, TimeoutError) and issubclass(rx.AgentLostError, rx.TransportError)


def test_bad_urls() -> None:
    for url, match in [("nope://x", "unsupported"), ("local://host", "no host"), ("local://?channel=tcp", "channel"),
                       ("local://?colour=1", "unknown option.*local://")]:  # fmt: skip
        with pytest.raises(rx.SandboxError, match=match):
            rx.open_sandbox(url)
