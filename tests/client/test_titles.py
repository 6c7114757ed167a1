"""What a job is called in listings (issue #23 point 5): its name, then its script's first
meaningful line, one line whatever the command holds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remote_exec.client.titles import NEWLINE, first_meaningful_line, job_title, script_of, what_it_runs

CELL = "#!/bin/bash\n# train the model\nset -euo pipefail\n\npython train.py --epochs 3\necho done\n"


def test_a_cells_title_is_its_first_line_that_does_something() -> None:
    assert first_meaningful_line(CELL) == "python train.py --epochs 3"
    assert what_it_runs(["bash", "-c", CELL], "%%exec_remote") == "python train.py --epochs 3"  # no [%%exec_remote]
    assert job_title(["bash", "-c", CELL], "%%exec_remote", {"name": "train"}) == "train · python train.py --epochs 3"


@pytest.mark.parametrize(
    ("script", "first"),
    [
        ("", ""),
        ("\n\n", ""),
        ("# only a comment\n", "# only a comment"),
        ("set -e\n", "set -e"),
        ("  ls -l  \n", "ls -l"),
    ],
)
def test_a_script_with_nothing_meaningful_shows_its_first_line(script: str, first: str) -> None:
    assert first_meaningful_line(script) == first


def test_argv_labels_and_login_shells() -> None:
    assert script_of(["python", "-c", "x"]) is None and what_it_runs(["python", "-c", "x"]) == "python -c x"
    assert what_it_runs("make -j4\nmake test") == "make -j4"  # a string runs through sh -c
    assert what_it_runs(["sleep", "60"], "train") == "[train] sleep 60"
    assert what_it_runs(["sh", "-c", "s=${SHELL}; exec $s -i"], "%remote_shell") == "%remote_shell"
    assert job_title(["sleep", "1"], tags={"name": "nap"}) == "nap · sleep 1"
    assert what_it_runs(["printf", "a\nb"], "x\r\ny") == f"[x{NEWLINE}y] printf a{NEWLINE}b"


@given(st.lists(st.text(), min_size=1, max_size=4), st.one_of(st.none(), st.text()), st.text())
def test_a_title_is_always_one_line(argv: list[str], label: str | None, name: str) -> None:
    for command in (argv, ["bash", "-c", *argv]):
        title = job_title(command, label, {"name": name})
        assert "\n" not in title and "\r" not in title
