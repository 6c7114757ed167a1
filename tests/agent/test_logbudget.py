"""The agent-wide log budget: which heads go first, with exact counts, on real files."""

from __future__ import annotations

import os
from pathlib import Path

from remote_exec.agent.jobs.logbudget import LogBudget, default_log_budget, evict, is_tmpfs
from remote_exec.agent.jobs.logfile import LogFile

KiB = 1024


def _log(tmp_path: Path, name: str, size: int, ledger: LogBudget, eof: bool = False) -> LogFile:
    path = tmp_path / name
    path.write_bytes(b"x" * size)
    stream = LogFile(os.fspath(path), 1 << 30)
    stream.eof = eof
    stream.charge_to(ledger)
    return stream


def test_eviction_order_finished_oldest_first_then_the_largest_running(tmp_path: Path) -> None:
    ledger = LogBudget(196 * KiB)
    old = [_log(tmp_path, "old-out", 40 * KiB, ledger, True), _log(tmp_path, "old-err", 8 * KiB, ledger, True)]
    new = [_log(tmp_path, "new-out", 40 * KiB, ledger, True), _log(tmp_path, "new-err", 0, ledger, True)]
    big = _log(tmp_path, "big", 200 * KiB, ledger)
    mid = _log(tmp_path, "mid", 120 * KiB, ledger)
    small = _log(tmp_path, "small", 20 * KiB, ledger)
    assert ledger.used == 428 * KiB and ledger.over == 232 * KiB

    dropped = evict(ledger, [old, new], [small, mid, big])

    # Finished jobs' logs go whole, oldest first (88 KiB); then the two largest running streams
    # are cut to one level, 88 KiB each (144 KiB more); the small one keeps everything.
    assert [s.base for s in old + new] == [40 * KiB, 8 * KiB, 40 * KiB, 0]
    assert big.held == mid.held == 88 * KiB and (big.base, mid.base) == (112 * KiB, 32 * KiB)
    assert small.base == 0
    assert dropped == 88 * KiB + 144 * KiB and ledger.used == 196 * KiB == ledger.limit
    # A reader from 0 is told exactly what it missed; the blocks are freed.
    got = big.read(0, 1 << 20, "base64", raw=True)
    assert (got.dropped, got.start, len(got.data)) == (112 * KiB, 112 * KiB, 88 * KiB)
    assert (tmp_path / "old-out").stat().st_blocks == 0


def test_only_finished_logs_go_when_they_suffice(tmp_path: Path) -> None:
    ledger = LogBudget(100 * KiB)
    old = [_log(tmp_path, "old", 32 * KiB, ledger, True)]
    new = [_log(tmp_path, "new", 32 * KiB, ledger, True)]
    running = _log(tmp_path, "run", 64 * KiB, ledger)
    assert evict(ledger, [old, new], [running]) == 28 * KiB  # rounded up to whole 4 KiB blocks
    assert (old[0].base, new[0].base, running.base) == (28 * KiB, 0, 0)


def test_a_running_streams_last_partial_block_is_never_punched(tmp_path: Path) -> None:
    ledger = LogBudget(4 * KiB)
    running = _log(tmp_path, "run", 10 * KiB + 5, ledger)
    evict(ledger, [], [running])
    assert running.base == 8 * KiB  # the job may still be appending into the block at 8 KiB


def test_a_sparse_log_counts_its_blocks_not_its_size(tmp_path: Path) -> None:
    """20 GB long, 40 KiB on disk: counted as 40 KiB, so the other job's log stays whole."""
    ledger = LogBudget(100 * KiB)
    old = [_log(tmp_path, "old", 32 * KiB, ledger, True)]
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.write(b"s" * 40 * KiB)
        f.truncate(20 << 30)
    sparse = LogFile(os.fspath(path), 1 << 40)
    sparse.charge_to(ledger)
    assert sparse.end == 20 << 30 and ledger.used == 72 * KiB
    assert evict(ledger, [old], [sparse]) == 0 and old[0].base == 0


def test_forgetting_a_stream_gives_its_bytes_back(tmp_path: Path) -> None:
    ledger = LogBudget(1 << 20)
    stream = _log(tmp_path, "s", 12 * KiB, ledger)
    with open(stream.path, "ab") as f:
        f.write(b"y" * KiB)
    # Learnt from a size read, no walk; counted in whole blocks (what the file takes on disk).
    assert stream.end == 13 * KiB and ledger.used == 16 * KiB
    stream.charge_to(None)
    assert ledger.used == 0


def test_default_on_a_tmpfs_is_bounded_by_the_memory_cgroup(tmp_path: Path) -> None:
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("201326592\n")  # 192 MiB
    st = os.statvfs("/dev/shm")
    assert is_tmpfs(Path("/dev/shm"))
    assert default_log_budget(Path("/dev/shm"), cgroup) == min(st.f_blocks * st.f_frsize // 4, 48 << 20)
    if not is_tmpfs(tmp_path):  # a disk: the memory limit does not apply
        st = os.statvfs(tmp_path)
        assert default_log_budget(tmp_path, cgroup) == max(4 << 20, st.f_blocks * st.f_frsize // 4)
