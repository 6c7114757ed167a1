"""What the run proved, printed at its end: the adversarial suite's cases per area (all refused?)
with the peak RSS of each side, the fault suite's one line per backend and mode, and how busy
each xdist worker was (a worker that ends long after the others is where the wall time goes). A passing
test's output is captured, so this is how the CI log shows it.

A pytest plugin (``pytest_plugins`` in ``tests/conftest.py``), not a sub-directory conftest:
under pytest-xdist the controller collects nothing, so a conftest below ``tests/`` is never
loaded there. Each worker hands its records to the controller when it ends (xdist's
``workeroutput``); the controller merges them, so the summary covers the whole run.
"""

from __future__ import annotations

import json
import resource
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FAULT_LINES", "record_agent_peak", "record_attack"]

FAULT_LINES: list[str] = []
_tried: dict[str, list[tuple[str, bool]]] = defaultdict(list)
_peak_kib = {"agent": 0, "host": 0}  # "host": the workers' peaks, under xdist
_started = time.monotonic()
_busy: dict[str, float] = defaultdict(float)  # worker -> seconds in tests (setup, call, teardown)
_count: dict[str, int] = defaultdict(int)
_ended: dict[str, float] = {}  # worker -> seconds into the run when it went down


def record_attack(area: str, case: str, *, refused: bool) -> None:
    _tried[area].append((case, refused))


def record_agent_peak(pid: int) -> int:
    """Record (and return, in KiB) the peak RSS (``VmHWM``) of agent process ``pid``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    _peak_kib["agent"] = max(_peak_kib["agent"], hwm)
    return hwm


def _own_peak_kib() -> int:
    return max(_peak_kib["host"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the records to the controller
        report = {"tried": _tried, "agent_kib": _peak_kib["agent"], "host_kib": _own_peak_kib(), "faults": FAULT_LINES}
        workeroutput["runreport"] = json.dumps(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller, each report names the worker that ran it (xdist sets ``node``)."""
    node = getattr(report, "node", None)
    if node is None:
        return
    worker = node.gateway.id
    _busy[worker] += report.duration
    _count[worker] += report.when == "call"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller's side of xdist: one worker's records, merged into the run's."""
    _ended[node.gateway.id] = time.monotonic() - _started
    raw = getattr(node, "workeroutput", {}).get("runreport")
    if raw is None:  # a worker that crashed before its end
        return
    got = json.loads(raw)
    for area, cases in got["tried"].items():
        _tried[area].extend((case, refused) for case, refused in cases)
    _peak_kib["agent"] = max(_peak_kib["agent"], got["agent_kib"])
    _peak_kib["host"] = max(_peak_kib["host"], got["host_kib"])
    FAULT_LINES.extend(got["faults"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if getattr(terminalreporter.config, "workeroutput", None) is not None:
        return  # a worker's terminal is not the log: the controller prints the merged records
    tr = terminalreporter
    if _tried:
        tr.section("adversarial suite")
        total = sum(len(v) for v in _tried.values())
        held = sum(r for v in _tried.values() for _, r in v)
        for area in sorted(_tried):
            cases = _tried[area]
            ok = sum(r for _, r in cases)
            tr.write_line(f"{area:<28} {len(cases):>6} cases  {ok:>6} refused")
            for case, refused in cases:
                if not refused:
                    tr.write_line(f"    NOT REFUSED: {case}")
        tr.write_line(f"{'total':<28} {total:>6} cases  {held:>6} refused ({'all' if held == total else 'NOT all'})")
        host, agent = _own_peak_kib() / 1024, _peak_kib["agent"] / 1024
        tr.write_line(f"peak RSS: host (a pytest process) {host:.0f} MiB, agent {agent:.0f} MiB")
    if FAULT_LINES:
        tr.section("fault suite")
        for line in sorted(FAULT_LINES):
            tr.write_line(line)
    if _busy:
        tr.section("time per worker")
        for worker in sorted(_busy):
            end = _ended.get(worker)
            ended = f", done {end:.0f} s into the run" if end is not None else ""
            tr.write_line(f"{worker}: {_count[worker]} tests, {_busy[worker]:.0f} s in tests{ended}")
