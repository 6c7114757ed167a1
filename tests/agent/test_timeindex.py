"""When a job's bytes were written (``logs --since``): the index never answers later than the
truth, stays bounded, and reads the job-writable file as untrusted."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from remote_exec.agent.jobs.logfile import LogFile
from remote_exec.agent.jobs.timeindex import MAX_ENTRIES, TimeIndex

RECORD = struct.Struct("<dQ")


def test_the_start_of_what_was_written_since(tmp_path: Path) -> None:
    index = TimeIndex(os.fspath(tmp_path / "stdout.times"))
    index.note(6, now=100.0)
    index.note(9, now=100.5)  # within a second of the last entry: not kept (the bytes are older than said)
    index.note(11, now=102.0)
    assert [index.offset_at(t) for t in (99.0, 100.0, 101.9, 102.0, 500.0)] == [0, 6, 6, 11, 11]
    again = TimeIndex(index.path)  # a later agent reads the same file
    assert [again.offset_at(t) for t in (99.0, 101.0, 102.0)] == [0, 6, 11]


@given(st.lists(st.tuples(st.floats(0, 1e6), st.integers(1, 1 << 40)), max_size=60))
def test_never_later_than_the_truth_and_bounded(looks: list[tuple[float, int]]) -> None:
    """Whatever the looks (clocks set back, ends that shrink), every byte first seen after a
    time ``s`` is at or after ``offset_at(s)``; the index holds at most MAX_ENTRIES."""
    index = TimeIndex("/nonexistent/dir/stdout.times")  # no file can be made: memory only
    index._loaded = True
    seen: list[tuple[float, int]] = []  # (time, end) of every look, as the agent saw them
    for t, end in sorted(looks):
        index.note(end, now=t)
        seen.append((t, end))
    for s, _ in seen:
        before = max((end for t, end in seen if t <= s), default=0)
        assert index.offset_at(s) <= before
    assert len(index._entries) <= MAX_ENTRIES


def test_a_full_index_thins_its_old_entries_and_keeps_the_newest(tmp_path: Path) -> None:
    index = TimeIndex(os.fspath(tmp_path / "stdout.times"))
    for i in range(MAX_ENTRIES + 1):
        index.note(10 * (i + 1), now=1000.0 + i)
    assert len(index._entries) <= MAX_ENTRIES // 2 + 2
    last = 1000.0 + MAX_ENTRIES
    assert index.offset_at(last) == 10 * (MAX_ENTRIES + 1)  # the newest exactly
    assert index.offset_at(1500.5) <= 10 * 501  # an older one: earlier, never later
    assert os.path.getsize(index.path) == RECORD.size * len(index._entries)  # the file rewritten to match


def test_a_forged_file_is_read_up_to_its_first_lie_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "stdout.times"
    good = [(100.0, 5), (200.0, 50)]
    lies = [(150.0, 60), (math.nan, 70), (300.0, 1 << 62)]  # time back, NaN: the rest is ignored
    path.write_bytes(b"".join(RECORD.pack(*e) for e in good + lies) + b"\x01\x02")  # and a torn record
    assert TimeIndex(os.fspath(path)).offset_at(1e9) == 50
    huge = tmp_path / "huge.times"  # a job fills it: only the last 2 * MAX_ENTRIES records are read
    huge.write_bytes(b"".join(RECORD.pack(float(i), i + 1) for i in range(3 * MAX_ENTRIES)))
    index = TimeIndex(os.fspath(huge))
    assert index.offset_at(1e9) == 3 * MAX_ENTRIES and len(index._entries) == MAX_ENTRIES


def test_a_link_in_its_place_is_replaced_not_written_through(tmp_path: Path) -> None:
    for n, plant in enumerate(("symlink", "hard link")):
        target = tmp_path / f"elsewhere{n}"
        target.write_bytes(b"")
        path = tmp_path / f"{n}.times"
        path.symlink_to(target) if plant == "symlink" else path.hardlink_to(target)
        index = TimeIndex(os.fspath(path))
        index.note(10, now=100.0)
        assert target.read_bytes() == b"", plant  # never written through the link
        assert TimeIndex(os.fspath(path)).offset_at(100.0) == 10  # the agent's own file, made afresh


def test_a_job_log_notes_its_growth_as_the_agent_looks(tmp_path: Path) -> None:
    log_path = tmp_path / "stdout"
    log_path.write_bytes(b"")
    log = LogFile(os.fspath(log_path), cap=1 << 20, timed=True)
    with open(log_path, "ab") as f:
        f.write(b"early\n")
    assert log.end == 6  # a look: the growth is noted with the time of the look
    assert log.times is not None and log.times.offset_at(2e9) == 6 and log.times.offset_at(0) == 0
    assert LogFile(os.fspath(log_path), cap=1 << 20).times is None  # a session's files keep no index
