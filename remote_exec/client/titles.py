"""What a job is called wherever many are listed (``ps``, ``top``, the dashboard, a job view's
header): its ``--name`` first, then the first meaningful line of what it runs.

Every notebook cell runs as ``bash -c <cell>``, so its command line says nothing ("bash -c …"
on every row); its script's first line that does something does. One definition, used by the
CLI and the notebook alike, so a job reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..protocol.names import NAME_TAG

__all__ = ["NEWLINE", "first_meaningful_line", "one_line", "job_name", "job_title", "script_of", "what_it_runs"]

_SHELLS = {"bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash"}
# Labels of jobs whose command is a wrapper that finds the user's login shell: the label says it.
_WRAPPED = {"%remote_shell", "remote-exec shell"}
NEWLINE = "\u23ce"  # ⏎: a newline in an argv or a label, visible, and one line stays one line
# Labels that say nothing the title does not: every cell's.
_SILENT = {"%%exec_remote"}


def script_of(command: Sequence[str] | str) -> str | None:
    """The shell script a job runs: a string command (run by ``sh -c``), or ``bash -c SCRIPT``;
    ``None`` for a plain argv."""
    if isinstance(command, str):
        return command
    if len(command) >= 3 and command[0] in _SHELLS and command[1] == "-c":
        return command[2]
    return None


def _meaningless(line: str) -> bool:
    # blank, a comment (a shebang too), or the strict-mode preamble many scripts start with
    return not line or line.startswith("#") or line.startswith("set -") or line.startswith("set +")


def first_meaningful_line(script: str) -> str:
    """The script's first line that does something: not blank, not a comment, not ``set -e``
    and its kind; the first non-blank line if none does; ``""`` for an empty script. Trailing
    ``\\`` continuations are kept as they are (the line is a title, not a command to run)."""
    lines = [ln.strip() for ln in script.splitlines()]
    for line in lines:
        if not _meaningless(line):
            return line
    return next((ln for ln in lines if ln), "")


def what_it_runs(command: Sequence[str] | str, label: str | None = None) -> str:
    """One line for what the job runs: its script's first meaningful line, else its argv, after
    its label in brackets (``[train] python x.py``) unless that is a cell's; a login-shell wrapper
    is named by its label alone (``%remote_shell``)."""
    if label in _WRAPPED:
        return label or ""
    script = script_of(command)
    what = first_meaningful_line(script) if script is not None else one_line(" ".join(command))
    return f"[{one_line(label)}] {what}" if label and label not in _SILENT else what


def one_line(text: str) -> str:
    """``text`` with its line breaks shown as :data:`NEWLINE`: one row stays one row."""
    return text.replace("\r\n", NEWLINE).replace("\n", NEWLINE).replace("\r", NEWLINE)


def job_name(tags: Mapping[str, str] | None) -> str:
    """The job's ``--name`` (its ``name`` tag), or ``""``."""
    return (tags or {}).get(NAME_TAG, "")


def job_title(command: Sequence[str] | str, label: str | None = None, tags: Mapping[str, str] | None = None) -> str:
    """``name · what it runs`` (just what it runs when unnamed)."""
    name, what = one_line(job_name(tags)), what_it_runs(command, label)
    return f"{name} · {what}" if name and what else name or what
