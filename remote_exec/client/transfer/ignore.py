"""Which paths a transfer leaves out: the default ignores, ``.gitignore`` files and the caller's patterns.

The caller's patterns win (``"!.env"`` sends a ``.env``), then :data:`DEFAULT_IGNORES`, then the
``.gitignore`` files (nested ones apply below their directory, as in git).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = ["DEFAULT_IGNORES", "IgnoreRules"]

DEFAULT_IGNORES: tuple[str, ...] = (
    ".git",
    ".hg",
    ".svn",
    "node_modules/",
    "__pycache__/",
    ".venv/",
    ".env*",
    "!.env.example",
    "*.pem",
    "*.key",
)
"""Patterns every transfer ignores unless ``default_ignores=False`` (or an ``ignore`` pattern
re-includes one, e.g. ``"!.env"``)."""


class IgnoreRules:
    """Which relative paths a transfer leaves out (see the module docstring for the precedence)."""

    def __init__(self, ignore: Sequence[str] = (), *, default_ignores: bool = True) -> None:
        from pathspec import GitIgnoreSpec

        self._spec = GitIgnoreSpec
        self._user = GitIgnoreSpec.from_lines(list(ignore)) if ignore else None
        self._defaults = GitIgnoreSpec.from_lines(list(DEFAULT_IGNORES)) if default_ignores else None
        self._git: dict[str, GitIgnoreSpec] = {}  # directory (relative, "" for the top) -> its .gitignore

    def add_gitignore(self, directory: str, text: str) -> None:
        """Honour a ``.gitignore`` found in ``directory`` (relative to the top, ``""`` for the top)."""
        self._git[directory] = self._spec.from_lines(text.splitlines())

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` (a ``/``-separated path relative to the top) is left out."""
        key = rel + "/" if is_dir else rel
        if self._user is not None:
            verdict = self._user.check_file(key).include
            if verdict is not None:
                return verdict
        if self._defaults is not None and self._defaults.check_file(key).include:
            return True
        if self._git:
            parts = rel.split("/")
            for depth in range(len(parts) - 1, -1, -1):  # the deepest .gitignore speaks first
                spec = self._git.get("/".join(parts[:depth]))
                if spec is not None:
                    sub = "/".join(parts[depth:]) + ("/" if is_dir else "")
                    verdict = spec.check_file(sub).include
                    if verdict is not None:
                        return verdict
        return False
