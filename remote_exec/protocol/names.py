"""What an id or a name from the other side may look like: data, never code.

A job id, a shell session id or a ``--name`` comes from the agent (a sandbox may be hostile) or
from a saved notebook (a stranger's file), and ends up in widgets, hint texts the user is told
to paste, URLs and magics' arguments. Each is checked against a conservative pattern on the host
before any use: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most
128 characters. Nothing that IPython would expand (``{``, ``$``), a shell would split or quote,
or a terminal would interpret can get through.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from ..errors import ProtocolError

__all__ = [
    "JOB_ID_PATTERN",
    "NAME_PATTERN",
    "check_job_id",
    "check_name",
    "is_job_id",
    "is_name",
]

JOB_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
"""A job's (or a shell session's) id: what the agent's ids and the client's chosen ids look like."""

NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
"""A ``--name``: a Python identifier of at most 64 characters (the user's own kernel variable)."""

_JOB_ID = re.compile(JOB_ID_PATTERN)
_NAME = re.compile(NAME_PATTERN)


def is_job_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a string of the job id form."""
    return isinstance(value, str) and _JOB_ID.fullmatch(value) is not None


def is_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a string of the ``--name`` form."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def _shown(value: object) -> str:
    """``value`` for an error message: its repr, cut to 80 characters (it may be huge or hostile)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_job_id(value: object, *, source: str = "the agent") -> str:
    """``value`` if it is a job id of the safe form.

    :raises ProtocolError: it is not (the message names ``source`` and shows the value cut short).
    """
    if not is_job_id(value):
        raise ProtocolError(f"{source} gave a job id of an unsafe form, refused: {_shown(value)}")
    return value


def check_name(value: object, *, source: str = "the agent") -> str:
    """``value`` if it is a name of the ``--name`` form.

    :raises ProtocolError: it is not.
    """
    if not is_name(value):
        raise ProtocolError(f"{source} gave a name of an unsafe form, refused: {_shown(value)}")
    return value
