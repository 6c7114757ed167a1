"""Docs that can drift are checked against the code."""

from __future__ import annotations

from pathlib import Path

from remote_exec.errors import ERROR_CLASSES
from remote_exec.protocol import METHODS

ROOT = Path(__file__).parent.parent


def test_protocol_doc_covers_every_method_and_error_code() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    for method in METHODS:
        assert f"`{method}`" in text, method
    for code, cls in ERROR_CLASSES.items():
        assert f"| {code} |" in text and f"`{cls.__name__}`" in text, (code, cls)


def test_readme_quick_start_is_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert "make test" in (ROOT / ".ci" / "run").read_text()
