"""The command-line face of :class:`~remote_exec.JobPolicy`, shared by ``remote-exec run`` and
``%%exec_remote``: one option table (argparse keywords, used by both parsers) and one function
that turns the parsed options into a policy, so the two spell every option alike."""

from __future__ import annotations

import argparse
import re
from typing import Any

from pydantic import ValidationError

from ..protocol import JobPolicy, WatchRule

__all__ = ["POLICY_OPTIONS", "parse_size", "policy_from_args"]

POLICY_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (
        ("--on-disconnect",),
        {
            "choices": ["keep", "kill"],
            "help": "what the agent does once no client is attached: keep the job (default) or kill it",
        },
    ),
    (("--disconnect-grace",), {"metavar": "S", "type": float, "help": "seconds without a client before the kill"}),
    (("--idle-timeout",), {"metavar": "S", "type": float, "help": "act when the job prints nothing for S seconds"}),
    (("--idle-action",), {"choices": ["interrupt", "kill"], "help": "on idle: SIGINT (default) or kill"}),
    (("--memory-limit",), {"metavar": "SIZE", "help": "kill the job's tree past this RSS (bytes, or 512M, 2G)"}),
    (("--cpu-time",), {"metavar": "S", "type": float, "help": "kill the job's tree past S seconds of CPU"}),
    (("--nice",), {"metavar": "N", "type": int, "help": "run at niceness N (0-19)"}),
    (("--watch",), {"metavar": "REGEX", "action": "append", "help": "record output lines matching REGEX"}),
    (("--interrupt-on",), {"metavar": "REGEX", "action": "append", "help": "SIGINT the job on a matching line"}),
    (("--kill-on",), {"metavar": "REGEX", "action": "append", "help": "kill the job on a matching line"}),
]
"""``(flags, argparse keywords)`` of the policy options; every default is ``None``."""

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"2G"``, ``"512MiB"``, ``"1048576"`` as bytes (powers of 1024).

    :raises ValueError: not a size.
    """
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a size: {text!r} (use bytes, or a number with K, M, G or T)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def policy_from_args(args: argparse.Namespace) -> JobPolicy | None:
    """The policy the parsed :data:`POLICY_OPTIONS` ask for (``None``: none given).

    :raises ValueError: a value the policy refuses (the message names the option).
    """
    fields: dict[str, Any] = {}
    for name in ("on_disconnect", "disconnect_grace", "idle_timeout", "idle_action", "cpu_time", "nice"):
        if getattr(args, name, None) is not None:
            fields[name] = getattr(args, name)
    if getattr(args, "memory_limit", None) is not None:
        fields["memory_limit"] = parse_size(args.memory_limit)
    rules = [
        (p, action)
        for option, action in (("watch", "notify"), ("interrupt_on", "interrupt"), ("kill_on", "kill"))
        for p in getattr(args, option, None) or []
    ]
    if not fields and not rules:
        return None
    try:
        if rules:
            fields["on_output"] = [WatchRule(pattern=p, action=a) for p, a in rules]  # type: ignore[arg-type]
        return JobPolicy(**fields)
    except ValidationError as exc:
        problems = "; ".join(f"{_option(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(problems) from None


def _option(loc: tuple[int | str, ...]) -> str:
    """The option a validation error is about (``--memory-limit``; a rule's: ``--watch/...``)."""
    if not loc or loc[0] in ("pattern", "action", "on_output"):
        return "--watch/--interrupt-on/--kill-on"
    return "--" + str(loc[0]).replace("_", "-")
