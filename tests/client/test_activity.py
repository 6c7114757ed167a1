"""``OutputActivity``: when each job's output last grew, across listings (Dashboard, ``top``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from remote_exec.client.activity import OutputActivity
from remote_exec.protocol import JobInfo


def job(job_id: str, out: int, started: float = 100.0) -> JobInfo:
    return JobInfo(
        job_id=job_id,
        pid=1,
        command=["true"],
        label=None,
        state="running",
        exit_code=None,
        started_at=started,
        ended_at=None,
        stdout_bytes=out,
        stderr_bytes=0,
        stdin_open=False,
        stdin_bytes=0,
        encoding="utf-8",
    )


def test_quiet_since_start_growth_and_first_look() -> None:
    act = OutputActivity()
    act.note([job("aaaaaaaa-1", 0), job("aaaaaaaa-2", 10)], now=200.0)
    silent, wrote = act.get("aaaaaaaa-1"), act.get("aaaaaaaa-2")
    assert silent is not None and (silent.since, silent.exact) == (100.0, True)  # never wrote: since its start
    assert wrote is not None and (wrote.since, wrote.exact) == (200.0, False)  # at least since the first look
    act.note([job("aaaaaaaa-1", 0), job("aaaaaaaa-2", 10)], now=260.0)
    assert act.get("aaaaaaaa-2") == wrote and wrote.seconds(now=260.0) == 60.0  # no growth: unchanged
    act.note([job("aaaaaaaa-2", 25)], now=300.0)
    grew = act.get("aaaaaaaa-2")
    assert grew is not None and (grew.since, grew.exact) == (300.0, True)
    assert act.get("aaaaaaaa-1") is None  # gone from the listing: forgotten (bounded by the listing)


def test_the_agents_last_output_time_is_taken_as_exact() -> None:
    act = OutputActivity()
    act.note([job("aaaaaaaa-1", 10).model_copy(update={"last_output_at": 150.0})], now=200.0)
    quiet = act.get("aaaaaaaa-1")
    assert quiet is not None and (quiet.since, quiet.exact) == (150.0, True)  # not the first look


def test_a_hostile_last_output_time_is_refused() -> None:
    fields = job("aaaaaaaa-1", 10).model_dump()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValidationError):
            JobInfo.model_validate({**fields, "last_output_at": bad})
