"""Running a host-side CLI (``docker``, ``podman``, ``kubectl``) and mapping its failures.

The container engines are driven through their command line clients, never their HTTP APIs:
the CLI already knows the user's contexts, ``DOCKER_HOST``, kubeconfig and credentials. Their
failures (a missing binary, a non-zero exit with a message on stderr, a hang) become
:class:`~remote_exec.errors.SandboxError` here, with the CLI's own message in it. The URL
options these transports share are parsed here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Iterator, Sequence
from typing import Literal, cast
from urllib.parse import parse_qs

from ..errors import CliError, SandboxError

__all__ = ["CliError", "InjectMode", "common_options", "map_cli_errors", "parse_query", "run_cli"]


@contextlib.contextmanager
def map_cli_errors(cli: str) -> Iterator[None]:
    """Turn a failure to start ``cli`` (not installed, not executable) into :class:`SandboxError`."""
    try:
        yield
    except FileNotFoundError as exc:
        raise SandboxError(f"{cli!r} not found: install it, or name its path in the URL") from exc
    except PermissionError as exc:
        raise SandboxError(f"{cli!r} cannot be run: {exc}") from exc


async def run_cli(argv: Sequence[str], *, timeout: float = 120.0, input: bytes | None = None) -> str:
    """Run a host CLI to completion and return its stdout (decoded, stripped).

    Cancelling kills the CLI process.

    :raises CliError: it exited non-zero (the message carries its stderr).
    :raises SandboxError: it is not installed, or did not finish within ``timeout`` seconds.
    """
    with map_cli_errors(argv[0]):
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(input)
    except TimeoutError:
        raise SandboxError(f"`{shlex.join(argv)[:200]}` did not finish within {timeout} s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        msg = err.decode(errors="replace").strip()
        raise CliError(
            f"`{shlex.join(argv)[:200]}` failed (exit {proc.returncode}): {msg[-800:] or '(no message)'}",
            returncode=proc.returncode or 0,
            stderr=msg,
        )
    return out.decode(errors="replace").strip()


def parse_query(url: str, query: str, allowed: set[str], multi: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """``a=1&b=2`` -> ``{"a": ["1"], "b": ["2"]}``, refusing unknown options and repeats of single ones.

    A repeat is refused rather than "the last one wins": a URL built by pasting a value in
    (``f"local://?dir=/srv/{key}"``) would otherwise let the value add ``&dir=/elsewhere``.

    :raises SandboxError: an unknown or repeated option, or a NUL in a value.
    """
    query_dict = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    unknown = set(query_dict) - allowed
    if unknown:
        raise SandboxError(f"unknown option(s) {sorted(unknown)} in {url!r} (known: {sorted(allowed)})")
    repeated = [k for k, v in query_dict.items() if len(v) > 1 and k not in multi]
    if repeated:
        raise SandboxError(
            f"option(s) {sorted(repeated)} given more than once in {url!r} "
            "(build URLs from parts with rx.sandbox_url(), which quotes each value)"
        )
    if any("\0" in v for values in query_dict.values() for v in values):
        raise SandboxError(f"an option holds a NUL character in {url!r}")
    return query_dict


InjectMode = Literal["auto", "always", "never"]


def common_options(url: str, query: dict[str, list[str]]) -> tuple[str | None, str | None, str | None, InjectMode]:
    """The ``user``, ``host``, ``dir`` and ``inject`` options, validated.

    :raises SandboxError: a bad ``inject`` value or an empty option.
    """
    one = {k: v[-1] for k, v in query.items()}
    for key in ("user", "host", "dir"):
        if key in one and not one[key]:
            raise SandboxError(f"option {key}= is empty in {url!r}")
    inject = one.get("inject", "auto")
    if inject not in ("auto", "always", "never"):
        raise SandboxError(f"inject must be auto, always or never, not {inject!r}")
    return one.get("user"), one.get("host"), one.get("dir"), cast(InjectMode, inject)
