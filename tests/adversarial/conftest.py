"""The standing adversarial suite: every case an attacker tries is recorded, and the run ends
with a summary in the CI log (cases tried per area, all refused, peak RSS of each side).

A test records each attack with ``adversary.tried(area, case, refused=...)``; a case not
refused fails the test as well (the record is for the summary, the assert is the test). The
agent side's peak RSS is read from ``/proc/<pid>/status`` (``VmHWM``) with
``adversary.agent_peak(pid)`` before the agent stops.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_tried: dict[str, list[tuple[str, bool]]] = defaultdict(list)
_agent_peak_kib = 0


@dataclass
class Adversary:
    cases: list[tuple[str, str, bool]] = field(default_factory=list)

    def tried(self, area: str, case: str, *, refused: bool) -> None:
        """Record one attack; ``refused`` says the defence held."""
        _tried[area].append((case, refused))
        self.cases.append((area, case, refused))

    def agent_peak(self, pid: int) -> int:
        """Record (and return, in KiB) the peak RSS of agent process ``pid``."""
        global _agent_peak_kib
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return 0
        hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        _agent_peak_kib = max(_agent_peak_kib, hwm)
        return hwm


@pytest.fixture
def adversary() -> Adversary:
    return Adversary()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _tried:
        return
    tr = terminalreporter
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
    host_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tr.write_line(f"{'total':<28} {total:>6} cases  {held:>6} refused ({'all' if held == total else 'NOT all'})")
    tr.write_line(f"peak RSS: host (pytest process) {host_kib / 1024:.0f} MiB, agent {_agent_peak_kib / 1024:.0f} MiB")
