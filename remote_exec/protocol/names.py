"""What an id or a name from the other side may look like: data, never code.

A job id, a shell session id or a ``--name`` comes from the agent (a sandbox may be hostile) or
from a saved notebook (a stranger's file), and ends up in widgets, hint texts the user is told
to paste, URLs and magics' arguments. Each is checked against a conservative pattern on the host
before any use: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most
128 characters. Nothing that IPython would expand (``{``, ``$``), a shell would split or quote,
or a terminal would interpret can get through.
"""

from __future__ import annotations

import builtins
import keyword
import re
from typing import TypeGuard

from ..errors import InvalidParamsError, ProtocolError

__all__ = [
    "JOB_ID_PATTERN",
    "NAME_PATTERN",
    "NAME_TAG",
    "TAG_KEY_MAX",
    "WRITER_PATTERN",
    "asked_job_id",
    "check_job_id",
    "check_name",
    "check_name_tag",
    "check_tag_key",
    "is_job_id",
    "is_name",
    "is_name_tag",
    "is_tag_key",
    "job_id_form",
    "shown",
    "tag_key_form",
    "tags_form",
]

JOB_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
"""A job's (or a shell session's) id: what the agent's ids and the client's chosen ids look like."""

NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
"""A ``--name``: a Python identifier of at most 64 characters (the user's own kernel variable)."""

WRITER_PATTERN = r"[A-Za-z0-9_-]{8,64}"
"""A terminal typist's name (``WriteStdinParams.writer``; the agent keeps their cursors by it)."""

TAG_KEY_MAX = 64
"""The longest tag key: a tag key is a short printable word (``notebook``, ``kernel``, ``name``)."""

NAME_TAG = "name"
"""The tag that carries a job's ``--name``: when present it must be of the :func:`is_name_tag` form."""

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


def shown(value: object) -> str:
    """``value`` as this module's errors show it (its repr cut to 80 characters), for the
    host's other messages that quote what an agent sent."""
    return _shown(value)


def check_job_id(value: object, *, source: str = "the agent") -> str:
    """``value`` if it is a job id of the safe form.

    :raises ProtocolError: it is not (the message names ``source`` and shows the value cut short).
    """
    if not is_job_id(value):
        raise ProtocolError(f"{source} gave a job id of an unsafe form, refused: {_shown(value)}")
    return value


def asked_job_id(value: object) -> str:
    """``value`` if it is a job id of the safe form: for an id the caller gave (an argument, a
    command line), refused before it is sent.

    :raises InvalidParamsError: it is not (no job can have that id).
    """
    if not is_job_id(value):
        raise InvalidParamsError(
            f"not a job id (letters, digits, '.', '_' and '-', at most 128): {_shown(value)}",
            data={"job_id": _shown(value)},
        )
    return value


def check_name(value: object, *, source: str = "the agent") -> str:
    """``value`` if it is a name of the ``--name`` form.

    :raises ProtocolError: it is not.
    """
    if not is_name(value):
        raise ProtocolError(f"{source} gave a name of an unsafe form, refused: {_shown(value)}")
    return value


def is_tag_key(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a tag key: 1 to :data:`TAG_KEY_MAX` printable characters (no
    control, format or line-separator characters, which a terminal or a widget would act on)."""
    return isinstance(value, str) and 0 < len(value) <= TAG_KEY_MAX and value.isprintable()


def is_name_tag(value: object) -> TypeGuard[str]:
    """Whether ``value`` may be a job's ``name`` tag: the ``--name`` form, and neither a keyword
    nor a builtin's name (a handle bound to ``print`` or ``len`` would shadow it)."""
    return is_name(value) and not keyword.iskeyword(value) and not hasattr(builtins, value)


def check_tag_key(value: object, *, source: str = "the agent") -> str:
    """``value`` if it is a tag key of the safe form.

    :raises ProtocolError: it is not.
    """
    if not is_tag_key(value):
        raise ProtocolError(f"{source} gave a tag key of an unsafe form, refused: {_shown(value)}")
    return value


def check_name_tag(value: object, *, source: str = "the agent") -> str:
    """``value`` if it may be a job's ``name`` tag (see :func:`is_name_tag`).

    :raises ProtocolError: it may not.
    """
    if not is_name_tag(value):
        raise ProtocolError(f"{source} gave a name tag of an unsafe form, refused: {_shown(value)}")
    return value


# -- the same checks as pydantic validators (a ValueError each), so every wire model that carries
# an id or tags is checked where it is parsed: on the host, every answer of an agent; in the
# agent, every request. One definition for both sides.


def job_id_form(value: str) -> str:
    """``value`` if it is of the job id form, for a pydantic ``AfterValidator``.

    :raises ValueError: it is not (the message shows it cut short).
    """
    if not is_job_id(value):
        raise ValueError(f"a job id of an unsafe form, refused: {_shown(value)}")
    return value


def tag_key_form(value: str) -> str:
    """``value`` if it is a tag key of the safe form, for a pydantic ``AfterValidator``.

    :raises ValueError: it is not.
    """
    if not is_tag_key(value):
        raise ValueError(f"a tag key of an unsafe form, refused: {_shown(value)}")
    return value


def tags_form(value: dict[str, str]) -> dict[str, str]:
    """``value`` if its ``name`` tag (if any) is of the :func:`is_name_tag` form.

    :raises ValueError: it is not.
    """
    name = value.get(NAME_TAG)
    if name is not None and not is_name_tag(name):
        raise ValueError(f"a name tag of an unsafe form, refused: {_shown(name)}")
    return value
