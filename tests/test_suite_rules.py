"""Rules the test suite holds itself to (issue #22): no test asserts an upper bound on elapsed
time, and none sleeps as synchronisation. Both make a suite flaky on a loaded machine; a test
waits for its event under a generous ``anyio.fail_after`` instead, and speed is measured in
``bench/``. The checks read the tests' syntax trees, so a sleep inside a job's script (a string)
is not a sleep of the test's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

__all__: list[str] = []

TESTS = Path(__file__).parent

# Names the tests give to a measured duration. Such a name on the small side of ``<`` or ``<=``
# (also inside ``max(...)``) is an upper bound on the machine's speed, not a property of the code.
DURATION_NAMES = {"elapsed", "took", "duration", "late", "lateness", "resumed", "waited", "spent"}
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}

# Sleeps at least this long (seconds; ``wait_for_timeout`` in ms) are a wait for something that
# should be an event. Shorter ones are the poll interval of a deadline-bounded loop.
SLEEP_LIMIT = 0.25
SLEEPS = {("time", "sleep"), ("asyncio", "sleep"), ("anyio", "sleep"), ("trio", "sleep")}

# (file relative to tests/, the literal): why the sleep is not a synchronisation.
ALLOWED_SLEEPS = {
    ("jupyter/lab_page.py", 0.3): "the poll interval of a Jupyter server's start (HTTP, no event to wait on)",
    ("jupyter/test_browser_terminal.py", 1.0): "paced like a person: the seconds spent typing are what is tested",
    ("jupyter/test_browser_dashboard.py", 5.0): "the window over which the dashboard's traffic is counted",
    ("jupyter/test_browser_dashboard.py", 1.1): "the held press itself (a long press), not a wait",
}


def _is_clock(node: ast.expr) -> bool:
    """``time.monotonic()`` and its kin, or ``monotonic()`` imported bare."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr in CLOCKS) or (isinstance(f, ast.Name) and f.id in CLOCKS)


def _is_duration(node: ast.expr) -> bool:
    """A measured duration: a name for one, ``clock() - t0``, or ``max(durations)``."""
    if isinstance(node, ast.Name):
        return node.id in DURATION_NAMES
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return _is_clock(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "max" and node.args:
        return _is_duration(node.args[0])
    return False


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)


def elapsed_upper_bounds(source: str) -> list[tuple[int, str]]:
    """(line, code) of each comparison that bounds a measured duration from above."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            upper = (isinstance(op, ast.Lt | ast.LtE) and _is_duration(left)) or (
                isinstance(op, ast.Gt | ast.GtE) and _is_duration(right)
            )
            if upper:
                found.append((node.lineno, ast.unparse(node)))
                break
            left = right
    return sorted(found)


def long_sleeps(source: str) -> list[tuple[int, float]]:
    """(line, seconds) of each sleep with a literal of at least ``SLEEP_LIMIT`` seconds."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        arg, f = node.args[0], node.func
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, int | float)):
            continue
        if isinstance(f.value, ast.Name) and (f.value.id, f.attr) in SLEEPS:
            seconds = float(arg.value)
        elif f.attr == "wait_for_timeout":  # Playwright's, in milliseconds
            seconds = float(arg.value) / 1000
        else:
            continue
        if seconds >= SLEEP_LIMIT:
            found.append((node.lineno, seconds))
    return sorted(found)


def test_no_test_asserts_an_upper_bound_on_elapsed_time() -> None:
    offences = [
        f"{path.relative_to(TESTS)}:{line}: {code}"
        for path in _python_files()
        for line, code in elapsed_upper_bounds(path.read_text())
    ]
    assert not offences, "wait for the event under anyio.fail_after instead (speed goes to bench/):\n" + "\n".join(
        offences
    )


def test_no_test_sleeps_as_synchronisation() -> None:
    offences = [
        f"{path.relative_to(TESTS)}:{line}: a sleep of {seconds:g} s"
        for path in _python_files()
        for line, seconds in long_sleeps(path.read_text())
        if (str(path.relative_to(TESTS)), seconds) not in ALLOWED_SLEEPS
    ]
    assert not offences, "wait for an event, a line, a file or a process state instead:\n" + "\n".join(offences)


# A locator found by a text ending in a number, as a substring, also finds the lines after it
# (has_text "tick 3" is "tick 30" too, and in strict mode three matches are an error): a soak
# failure of the restart test. Such a locator matches the whole line (a regex) or takes `.first`.
NUMBERED_SUBSTRING = re.compile(r'has_text="[^"]*\d"\)\.wait_for\(')


def lines_matching(pattern: re.Pattern[str]) -> list[str]:
    """``path:line: text`` of every line of the suite (this file aside) that ``pattern`` finds."""
    return [
        f"{path.relative_to(TESTS)}:{n}: {line.strip()}"
        for path in _python_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and path.name != Path(__file__).name
    ]


def test_no_locator_matches_a_numbered_line_as_a_substring() -> None:
    offences = lines_matching(NUMBERED_SUBSTRING)
    assert not offences, 'match the whole line, has_text=re.compile(r"^tick 3\\s*$"), or take .first:\n' + "\n".join(
        offences
    )


# ``not gone(pid)`` waits out gone()'s whole timeout before it can be true (a 10 s wait in a test
# found by its time): an absence of an end is checked now, ``gone(pid, timeout=0)``.
WAITED_OUT_ABSENCE = re.compile(r"not gone\((?![^)]*timeout=0\b)")


def test_no_check_that_a_job_lives_waits_out_a_timeout() -> None:
    offences = lines_matching(WAITED_OUT_ABSENCE)
    assert not offences, "check it now: not gone(pid, timeout=0)\n" + "\n".join(offences)


def test_the_checks_catch_the_known_forms() -> None:
    """The forms this suite used to have (issue #22), and forms that are fine."""
    # The samples are spelled with placeholders, so that no line of this file is itself the form
    # it checks for (a plain grep of the suite for such asserts finds none here either).
    forms = {"<LT>": "<", "<LE>": "<=", "<GT>": ">", "<E>": "elapsed", "<T>": "took", "<R>": "resumed"}
    bad = [
        "assert <E> <LT> 5",
        "assert 9 <LT> <E> <LT> 12",
        "assert time.monotonic() - t0 <LT> 0.5",
        "assert <T> <LE> BOUND + 1",
        "refused = <E> <LT> bound + 1",
        "assert max(<R>) <LT> 10.0",
        "assert 1.0 <GT> time.perf_counter() - t0",
    ]
    for placeholder, text in forms.items():
        bad = [code.replace(placeholder, text) for code in bad]
    fine = [
        "assert elapsed >= 2.0",  # a lower bound: a loaded machine only makes it truer
        "while time.monotonic() < deadline: pass",  # a deadline loop
        "assert 0 <= shown <= time.time() - info.last_output_at + 1",  # a value shown, bracketed
        "assert g < LIMIT_MIB",
    ]
    assert [code for code in bad if not elapsed_upper_bounds(code)] == []
    assert [code for code in fine if elapsed_upper_bounds(code)] == []
    assert WAITED_OUT_ABSENCE.search("assert not gone(job.pid)")
    assert not WAITED_OUT_ABSENCE.search("assert not gone(pid, timeout=0)")
    assert long_sleeps("time.sleep(0.5)\nawait asyncio.sleep(1)\npage.wait_for_timeout(1000)") == [
        (1, 0.5),
        (2, 1.0),
        (3, 1.0),
    ]
    assert NUMBERED_SUBSTRING.search('x.locator(".l", has_text="tick 3").wait_for()')
    assert not NUMBERED_SUBSTRING.search('x.locator(".l", has_text="tick 3").first.wait_for()')
    assert long_sleeps("time.sleep(0.05)\nrun('time.sleep(300)')\nawait anyio.sleep(0)") == []
