"""The fault suite's summaries, one line per backend and mode, printed at the end of the run (a
passing test's output is captured: this is how the CI log shows what was proven)."""

from __future__ import annotations

import pytest

SUMMARIES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARIES:
        terminalreporter.section("fault suite")
        for line in SUMMARIES:
            terminalreporter.write_line(line)
