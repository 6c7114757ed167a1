"""How a job ended, in words (issue #23 point 7): never a bare "exit -2"."""

from __future__ import annotations

import pytest

from remote_exec.client.ends import end_words


@pytest.mark.parametrize(
    ("state", "code", "timeout", "words"),
    [
        ("running", None, None, ""),
        ("completed", 0, None, "exit 0"),
        ("completed", 3, None, "exit 3"),
        ("failed", -2, None, "interrupted (SIGINT)"),
        ("completed", -15, None, "terminated (SIGTERM)"),
        ("completed", -9, None, "killed (SIGKILL)"),
        ("killed", -15, None, "killed (SIGTERM)"),
        ("killed", -9, None, "killed (SIGKILL)"),
        ("killed", None, None, "killed"),
        ("completed", -11, None, "ended by SIGSEGV"),
        ("completed", -77, None, "ended by signal 77"),
        ("timed_out", -15, 1.5, "timed out after 1.5 s"),
        ("timed out", None, None, "timed out"),
    ],
)
def test_end_words(state: str, code: int | None, timeout: float | None, words: str) -> None:
    assert end_words(state, code, timeout) == words
