"""A griffe extension for the API reference (``mkdocs.yml`` loads it for mkdocstrings).

The package's docstrings are written in the Sphinx/reST style. griffe's ``sphinx`` parser reads
their fields (``:param:``, ``:raises:``, ``:ivar:``); this extension turns the inline bits
Markdown does not know into their Markdown equivalents:

- ``:class:`~remote_exec.ExecResult```, ``:meth:`kill```, ``:func:``, ``:attr:``, ``:data:``,
  ``:mod:``, ``:exc:`` and ``:obj:`` roles become cross-references, resolved the way Python
  resolves the name in the docstring's scope. They are *optional* references: one to an object
  the site does not document (a private helper) renders as code instead of failing the build.
- a paragraph ending in ``::`` (reST's "a literal block follows") ends in ``:``, and a ``::``
  alone on its line goes; the indented block after it is already a Markdown code block.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?P<role>class|meth|func|attr|data|mod|exc|obj):`(?P<target>[^`]+)`")
LITERAL_BLOCK = re.compile(r"(?<=\S)::$", re.MULTILINE)
LONE_LITERAL_MARKER = re.compile(r"^[ \t]*::[ \t]*\n", re.MULTILINE)
CALLABLE_ROLES = {"meth", "func"}


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as written in ``obj``'s docstring (best effort)."""
    if target.startswith("."):  # relative to the docstring's package: :func:`.signals.interrupt`
        package = obj.module.package if obj.module.is_init_module else obj.module.parent
        return f"{package.path if package else obj.module.path}{target}"
    head, _, rest = target.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            resolved = scope.resolve(head)
        except (griffe.NameResolutionError, griffe.AliasResolutionError):
            scope = scope.parent
            continue
        return f"{resolved}.{rest}" if rest else resolved
    return target  # absolute (remote_exec.x.Y) or unknown: let autorefs try it as written


def _role_to_ref(obj: griffe.Object, match: re.Match[str]) -> str:
    target = match["target"]
    short = target.startswith("~")
    target = target.lstrip("~")
    title = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
    if match["role"] in CALLABLE_ROLES:
        title += "()"
    identifier = html.escape(_resolve(obj, target), quote=True)
    return f'<autoref identifier="{identifier}" optional><code>{html.escape(title)}</code></autoref>'


def _walk(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles and ``::`` in every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            doc = obj.docstring
            if doc is not None and (":`" in doc.value or "::" in doc.value):
                value = ROLE.sub(lambda m, o=obj: _role_to_ref(o, m), doc.value)
                doc.value = LONE_LITERAL_MARKER.sub("", LITERAL_BLOCK.sub(":", value))
