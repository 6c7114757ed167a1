"""The widgets' front-end code: ``widgets/*.js|*.css`` in a checkout, ``remote_exec/_widgets`` in a wheel."""

from __future__ import annotations

from functools import cache
from pathlib import Path

__all__ = ["css", "esm", "widget_dir"]

_PACKAGE = Path(__file__).resolve().parent.parent


@cache
def widget_dir() -> Path:
    """Where the front-end files are: packaged copy first, then the source checkout's folder.

    Neither holding them means a broken install: ``FileNotFoundError``.
    """
    for candidate in (_PACKAGE / "_widgets", _PACKAGE.parent / "widgets"):
        if (candidate / "common.js").is_file():
            return candidate
    raise FileNotFoundError(f"remote_exec's widget files are missing (looked in {_PACKAGE / '_widgets'})")


def esm(name: str) -> str:
    """The ES module of widget ``name``: the shared helpers, then the widget's own code.

    anywidget loads a module from its text, where relative imports cannot resolve, so the
    shared part is prepended instead of imported.
    """
    d = widget_dir()
    return (d / "common.js").read_text() + "\n" + (d / f"{name}.js").read_text()


def css(name: str) -> str:
    """The stylesheet of widget ``name``, after the shared one."""
    d = widget_dir()
    return (d / "common.css").read_text() + "\n" + (d / f"{name}.css").read_text()
