"""The standing adversarial suite: every case an attacker tries is recorded, and the run ends
with a summary in the CI log (cases tried per area, all refused, peak RSS of each side:
``tests/runreport.py``).

A test records each attack with ``adversary.tried(area, case, refused=...)``; a case not
refused fails the test as well (the record is for the summary, the assert is the test). The
agent side's peak RSS is read from ``/proc/<pid>/status`` (``VmHWM``) with
``adversary.agent_peak(pid)`` before the agent stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ..runreport import record_agent_peak, record_attack


@dataclass
class Adversary:
    cases: list[tuple[str, str, bool]] = field(default_factory=list)

    def tried(self, area: str, case: str, *, refused: bool) -> None:
        """Record one attack; ``refused`` says the defence held."""
        record_attack(area, case, refused=refused)
        self.cases.append((area, case, refused))

    def agent_peak(self, pid: int) -> int:
        """Record (and return, in KiB) the peak RSS of agent process ``pid``."""
        return record_agent_peak(pid)


@pytest.fixture
def adversary() -> Adversary:
    return Adversary()
