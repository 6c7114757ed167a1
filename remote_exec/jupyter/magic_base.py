"""What the extension's magics classes share: typed wrappers of IPython's decorators, parsing a
magic's line, and a base class holding the kernel's :class:`KernelState`.

The magics are split by job into classes that IPython registers side by side
(:class:`~remote_exec.jupyter.magics.RemoteExecMagics` for jobs, shells and config,
:class:`~remote_exec.jupyter.file_magics.RemoteFileMagics` for copies); each gets the same
:class:`KernelState`, so they share the sandboxes and the ``%exec_remote_config`` defaults.
"""

from __future__ import annotations

import argparse
import keyword
import os
import shlex
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from IPython.core import magic_arguments as ma
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic

from ..blocking import Sandbox
from ..errors import SandboxError, TransportError
from .kernel_state import KernelState

__all__ = ["DEBUG_ENV", "StateMagics"]

DEBUG_ENV = "REMOTE_EXEC_DEBUG"
"""Set (to anything but ``""`` or ``0``), a sandbox that cannot be opened raises its own error,
with its whole chain, instead of the one-line ``UsageError``."""

F = TypeVar("F", bound=Callable[..., Any])


class _Decorator(Protocol):
    def __call__(self, fn: F, /) -> F: ...


# IPython's argparse decorators carry no type information: these wrappers state what they do.
def _argument(*args: Any, **kwargs: Any) -> _Decorator:
    decorator: _Decorator = cast(Any, ma.argument)(*args, **kwargs)
    return decorator


def _magic_arguments() -> _Decorator:
    decorator: _Decorator = cast(Any, ma.magic_arguments)()
    return decorator


def _cell_magic(fn: F) -> F:
    return cast(F, cell_magic(fn))  # IPython types it as "F or a decorator" (it also takes a name)


def _line_magic(fn: F) -> F:
    return cast(F, line_magic(fn))


def _parse(magic: object, line: str) -> argparse.Namespace:
    """Split the line as a POSIX shell would (quotes removed, a trailing ``# comment`` dropped)."""
    try:
        argv = shlex.split(line, comments=True)
    except ValueError as exc:  # e.g. an unclosed quote
        raise UsageError(f"cannot parse the options: {exc}") from None
    args: argparse.Namespace = cast(Any, magic).parser.parse_args(argv)  # its error() raises UsageError
    return args


def _options(*specs: tuple[tuple[str, ...], dict[str, Any]]) -> _Decorator:
    """A reusable group of ``argument`` decorators (listed in the order --help shows them)."""

    class Group:
        def __call__(self, fn: F, /) -> F:
            for args, kwargs in reversed(specs):
                fn = _argument(*args, **kwargs)(fn)
            return fn

    return Group()


def _variable(name: str | None, option: str) -> str | None:
    if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
        raise UsageError(f"{option} needs a Python variable name, got {name!r}")
    return name


class StateMagics(Magics):
    """A magics class on the kernel's shared :class:`KernelState` (no magics of its own)."""

    def __init__(self, shell: InteractiveShell, state: KernelState) -> None:
        super().__init__(shell)
        self.state = state

    def _sandbox(self, url: str) -> Sandbox:
        # A sandbox that cannot be opened or reached is the user's to fix (a URL, a daemon, a
        # host): one line, as IPython shows a UsageError, not a chain through asyncssh/asyncio.
        try:
            return self.state.sandbox(url)
        except (SandboxError, TransportError) as exc:
            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                raise
            if isinstance(exc, SandboxError):
                raise UsageError(str(exc)) from None
            hint = f"check that the sandbox is up and reachable; {DEBUG_ENV}=1 shows the whole chain"
            raise UsageError(f"{type(exc).__name__}: {exc} ({hint})") from None

    def _store(self, name: str | None, value: object) -> None:
        if name is not None:
            assert self.shell is not None
            self.shell.user_ns[name] = value


def _plain_help(cls: type[Magics]) -> None:
    """Make ``%%exec_remote?`` read as it is typed.

    IPython's ``magic_arguments`` writes a help for Sphinx: an RST ``::`` first, and the usage
    under the function's name with one ``%`` even for a cell magic. ``%name?`` shows it as is.
    """
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name, method in cls.magics[kind].items():
            fn = getattr(cls, method)
            doc = (fn.__doc__ or "").removeprefix("::\n\n  ")
            if doc.startswith(f"%{name}"):
                fn.__doc__ = prefix + name + doc[len(name) + 1 :]
            parser = getattr(fn, "parser", None)
            if parser is not None:
                parser.prog = prefix + name  # in its errors too: "%%exec_remote: error: ..."
