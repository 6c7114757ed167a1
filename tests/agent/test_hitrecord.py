"""A job's watch record read back from ``job.json``: validated and bounded like anything read
from disk in the sandbox, a malformed field dropped rather than failing the re-adoption."""

from __future__ import annotations

from remote_exec.agent.jobs.hitrecord import dump_hits, load_hits
from remote_exec.agent.jobs.job import Job
from remote_exec.agent.jobs.logfile import LogFile
from remote_exec.protocol import MAX_HITS_KEPT, StartParams, WatchHit


def _job() -> Job:
    # Never spawned: only its record of hits is used (the logs are never opened).
    logs = {1: LogFile("/nonexistent/stdout", 0), 2: LogFile("/nonexistent/stderr", 0)}
    return Job("aaaaaaaa-1", StartParams(command=["true"]), 1 << 16, lambda _: None, logs)


def test_the_record_round_trips() -> None:
    job = _job()
    hit = WatchHit(rule=0, pattern="nan", action="notify", stream="stdout", offset=6, line="nan", at=1.0)
    job.hits, job.hits_total, job.rules_disabled, job.watch_skipped = [hit], 3, [1], 10
    again = _job()
    load_hits(again, dump_hits(job))
    assert (again.hits, again.hits_total, again.rules_disabled, again.watch_skipped) == ([hit], 3, [1], 10)


def test_a_hostile_record_is_bounded_and_dropped_where_malformed() -> None:
    good = {"rule": 0, "pattern": "x", "action": "kill", "stream": "stderr", "offset": 0, "line": "x", "at": 2.0}
    meta = {
        "hits": [good] * (MAX_HITS_KEPT + 50) + [{"rule": -1}],
        "hits_total": "many",
        "rules_disabled": [1, 1, -3, 10**9, "2", True, 4],
        "watch_skipped": -5,
    }
    job = _job()
    load_hits(job, meta)
    assert len(job.hits) == MAX_HITS_KEPT and job.hits_total == MAX_HITS_KEPT  # at least the hits kept
    assert job.rules_disabled == [1, 4] and job.watch_skipped == 0
    load_hits(job, {"hits": "not a list"})
    assert job.hits == [] and job.hits_total == 0
