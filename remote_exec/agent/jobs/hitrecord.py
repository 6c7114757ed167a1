"""What a job's watch rules have done, kept in its ``job.json`` so that it outlives the agent.

The hits (the first :data:`~remote_exec.protocol.MAX_HITS_KEPT`, as in memory), their total,
the rules disabled or spent and the bytes the rules never saw: a re-adopting agent restores
them, so ``JobInfo`` and a client's ``proc.hits`` go on from where they were, and a client that
polls with ``PollParams.hits`` is told of no hit twice (its count is the restored total).

``job.json`` sits in the agent's private state dir, but it is read back as untrusted: each
field is validated and bounded, and a malformed one is dropped rather than failing the job.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from ...protocol import MAX_HITS_KEPT, MAX_RULES, WatchHit
from .job import Job

__all__ = ["SAVE_EVERY", "dump_hits", "load_hits", "should_save"]

SAVE_EVERY = 1.0
"""Seconds between saves of a job whose hits are past :data:`MAX_HITS_KEPT` (only the total
still changes then: a rule matching every line must not rewrite ``job.json`` per line). A
SIGKILLed agent loses at most this much of the total; every kept hit is saved as it comes."""


def dump_hits(job: Job) -> dict[str, Any]:
    """The fields of ``job.json`` that hold the rules' record (none while there is nothing)."""
    if not (job.hits_total or job.rules_disabled or job.watch_skipped):
        return {}
    return {
        "hits": [h.model_dump(mode="json") for h in job.hits[:MAX_HITS_KEPT]],
        "hits_total": job.hits_total,
        "rules_disabled": job.rules_disabled[:MAX_RULES],
        "watch_skipped": job.watch_skipped,
    }


def load_hits(job: Job, meta: dict[str, Any]) -> None:
    """Restore the rules' record from ``meta`` (a ``job.json``), validated and bounded."""
    raw = meta.get("hits")
    hits: list[WatchHit] = []
    for item in raw[:MAX_HITS_KEPT] if isinstance(raw, list) else []:
        try:
            hits.append(WatchHit.model_validate(item))
        except ValidationError:
            continue
    job.hits = hits
    job.hits_total = max(_count(meta.get("hits_total")), len(hits))
    disabled = meta.get("rules_disabled")
    if isinstance(disabled, list):
        job.rules_disabled = sorted({i for i in disabled if type(i) is int and 0 <= i < MAX_RULES})
    job.watch_skipped = _count(meta.get("watch_skipped"))


def should_save(job: Job, saved_at: float) -> bool:
    """Whether a new hit of ``job`` is saved now: each kept hit is; past the cap, at most every
    :data:`SAVE_EVERY` seconds (``saved_at``: the last such save, ``time.monotonic()``)."""
    return job.hits_total <= MAX_HITS_KEPT or time.monotonic() - saved_at >= SAVE_EVERY


def _count(v: object) -> int:
    return v if type(v) is int and 0 <= v < 1 << 62 else 0
