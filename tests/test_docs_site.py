"""The documentation site (mkdocs.yml, docs/) covers the public surface.

``make docs`` builds the site with warnings as errors (broken links, pages missing from the nav,
unparseable docstrings); these checks catch what a clean build cannot: a public name or a sandbox
scheme that was added to the code but never to the docs. (A notebook missing from
the nav fails the build itself: mkdocs.yml makes omitted pages a warning.)
"""

from __future__ import annotations

import re
from pathlib import Path

import remote_exec
import remote_exec.errors
from remote_exec.sandboxes import SCHEMES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)\s*$", re.MULTILINE)


def _rendered(page: str) -> set[str]:
    """The objects a page of the API reference renders with ``::: path``."""
    return set(DIRECTIVE.findall((DOCS / "api" / page).read_text()))


def _api_objects() -> set[str]:
    return set().union(*(_rendered(p.name) for p in (DOCS / "api").glob("*.md")))


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = _api_objects()
    errors_module = "remote_exec.errors" in documented  # renders every class of remote_exec.errors
    missing = [
        name
        for name in remote_exec.__all__
        if name != "__version__"
        and f"remote_exec.{name}" not in documented
        and not (errors_module and name in remote_exec.errors.__all__)
    ]
    assert not missing, f"add these to a page of docs/api/ (`::: remote_exec.NAME`): {missing}"


def test_every_jupyter_name_is_in_the_api_reference() -> None:
    import remote_exec.jupyter as jupyter

    page = (DOCS / "api" / "jupyter.md").read_text()
    missing = [name for name in jupyter.__all__ if f"remote_exec.jupyter.{name}" not in page and name not in page]
    assert not missing, f"add these to docs/api/jupyter.md: {missing}"


def test_every_sandbox_scheme_is_documented() -> None:
    transports = _rendered("sandboxes.md")
    security = (DOCS / "security.md").read_text()
    for scheme, factory in SCHEMES.items():
        module = getattr(factory, "__self__", factory).__module__
        assert module in transports, f"{scheme}://: render `::: {module}` in docs/api/sandboxes.md"
        assert f"`{scheme}://" in security, f"{scheme}://: say what it isolates in docs/security.md"
