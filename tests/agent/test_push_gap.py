"""When a follower of a busy job holds a push back (:func:`hold_back`): never the first after a
quiet spell, a full one or the job's last; otherwise the rest of a gap that grows with followers."""

from __future__ import annotations

import pytest

from remote_exec.agent.jobs.output import MAX_GAP_FOLLOWERS, PUSH_GAP, hold_back

MIB = 1 << 20


def test_a_push_after_a_quiet_spell_goes_at_once() -> None:
    assert hold_back(float("inf"), 1, 10, MIB, finished=False) == 0
    assert hold_back(PUSH_GAP, 1, 10, MIB, finished=False) == 0


def test_a_small_push_right_after_another_waits_out_the_gap() -> None:
    assert hold_back(0.0, 1, 10, MIB, finished=False) == pytest.approx(PUSH_GAP)
    assert hold_back(PUSH_GAP / 4, 1, 10, MIB, finished=False) == pytest.approx(PUSH_GAP * 3 / 4)


def test_a_full_push_or_the_jobs_last_goes_at_once() -> None:
    assert hold_back(0.0, 1, MIB, MIB, finished=False) == 0
    assert hold_back(0.0, 20, 10, MIB, finished=True) == 0


def test_the_gap_grows_with_the_jobs_followers_up_to_a_bound() -> None:
    assert hold_back(0.0, 10, 10, MIB, finished=False) == pytest.approx(10 * PUSH_GAP)
    assert hold_back(0.0, 0, 10, MIB, finished=False) == pytest.approx(PUSH_GAP)  # (never below one)
    assert hold_back(0.0, 1000, 10, MIB, finished=False) == pytest.approx(MAX_GAP_FOLLOWERS * PUSH_GAP)
