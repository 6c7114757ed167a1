"""Shared pieces of the benchmark suite: sizes, statistics, /proc readers, result rows, the table."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import remote_exec as rx
from remote_exec._version import DISTRIBUTION

CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1_000_000  # throughput is in decimal megabytes per second


@dataclass(frozen=True)
class Config:
    """Repetition counts and sizes; ``quick`` shrinks everything for a smoke run."""

    quick: bool
    first_byte_reps: int = 200
    inspect_reps: int = 5
    late_reps: int = 3
    late_sleep: float = 2.0
    run_true_reps: int = 100
    throughput_mb: int = 200
    throughput_reps: int = 2
    inspect_throughput_mb: int = 20
    idle_jobs: int = 100
    idle_window: float = 15.0
    inspect_idle_jobs: int = 5
    kill_grace: float = 1.0
    kill_reps: int = 3
    load_idle: int = 1000
    load_stream: int = 100
    load_window: float = 10.0
    settle: float = 1.0  # seconds for watchers to park in their long-polls before a window opens
    start_limit: int = 100  # start RPCs in flight at once in the load bench (see burst_start)

    @classmethod
    def make(cls, quick: bool) -> Config:
        if not quick:
            return cls(quick=False)
        return cls(
            quick=True,
            first_byte_reps=20,
            inspect_reps=1,
            late_reps=1,
            late_sleep=1.0,
            run_true_reps=20,
            throughput_mb=20,
            throughput_reps=1,
            inspect_throughput_mb=0,  # 0: skipped
            idle_jobs=10,
            idle_window=1.0,
            settle=0.3,
            inspect_idle_jobs=0,
            kill_grace=0.5,
            kill_reps=1,
            load_idle=100,
            load_stream=10,
            load_window=1.5,
        )


@dataclass(frozen=True)
class Stat:
    """Summary of repeated measurements (in the unit of the row they belong to)."""

    median: float
    p90: float
    min: float
    max: float
    n: int
    samples: list[float]

    @classmethod
    def of(cls, samples: list[float]) -> Stat:
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        # nearest-rank p90: with few samples this is the max, which is the honest answer
        p90 = ordered[min(len(ordered) - 1, max(0, -(-9 * len(ordered) // 10) - 1))]
        return cls(
            statistics.median(ordered), p90, ordered[0], ordered[-1], len(ordered), [round(s, 6) for s in samples]
        )

    @classmethod
    def one(cls, value: float) -> Stat:
        return cls.of([value])


Cell = Stat | str | None  # a measurement, a reason it is absent ("skipped: ..."), or not applicable


@dataclass(frozen=True)
class Target:
    """A target on one statistic of the ``ours`` cell: ``ours.<stat> <op> value``."""

    op: Literal["<=", ">=", "<"]
    value: float
    stat: Literal["median", "p90", "max"] = "median"

    def met(self, s: Stat) -> bool:
        v = getattr(s, self.stat)
        return bool(v <= self.value if self.op == "<=" else v >= self.value if self.op == ">=" else v < self.value)

    def text(self, unit: str) -> str:
        sym = {"<=": "≤", ">=": "≥", "<": "<"}[self.op]
        return f"{sym} {fmt_num(self.value)} {unit} ({self.stat})"


@dataclass
class Row:
    """One line of the table: a metric for our engine and its baselines."""

    bench: str
    name: str
    unit: str
    ours: Cell
    subprocess: Cell = None
    inspect: Cell = None
    target: Target | str | None = None  # a str: a target judged by the bench itself (see ``verdict``)
    extra: dict[str, Any] = field(default_factory=dict)
    verdict: bool | None = None

    @property
    def passed(self) -> bool | None:
        if isinstance(self.target, str):
            return self.verdict
        if self.target is None or not isinstance(self.ours, Stat):
            return None
        return self.target.met(self.ours)

    def to_json(self) -> dict[str, Any]:
        def cell(c: Cell) -> Any:
            return dataclasses.asdict(c) if isinstance(c, Stat) else c

        return {
            "bench": self.bench,
            "name": self.name,
            "unit": self.unit,
            "ours": cell(self.ours),
            "subprocess": cell(self.subprocess),
            "inspect_ai": cell(self.inspect),
            "target": self.target_json(),
            "passed": self.passed,
            "extra": self.extra,
        }

    def target_json(self) -> dict[str, Any] | None:
        if self.target is None:
            return None
        if isinstance(self.target, str):
            return {"text": self.target}
        return {**dataclasses.asdict(self.target), "text": self.target_text}

    @property
    def target_text(self) -> str:
        if self.target is None:
            return "—"
        return self.target if isinstance(self.target, str) else self.target.text(self.unit)


def fmt_num(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a == 0:
        return "0"
    return f"{v:.4g}" if a >= 1 else f"{v:.3g}"


def fmt_cell(c: Cell, unit: str) -> str:
    if c is None:
        return "—"
    if isinstance(c, str):
        return c
    if c.n == 1:
        return f"{fmt_num(c.median)} {unit}"
    return f"{fmt_num(c.median)} {unit} (p90 {fmt_num(c.p90)}, n={c.n})"


def render_table(rows: list[Row], notes: list[str]) -> str:
    header = ["benchmark", "ours", "subprocess", "inspect-ai", "target", "result"]
    body = []
    for r in rows:
        verdict = {True: "PASS", False: "FAIL", None: "info"}[r.passed]
        if isinstance(r.target, Target) and not isinstance(r.ours, Stat):
            verdict = "n/a"
        body.append(
            [
                r.name,
                fmt_cell(r.ours, r.unit),
                fmt_cell(r.subprocess, r.unit),
                fmt_cell(r.inspect, r.unit),
                r.target_text,
                verdict,
            ]
        )
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    sep = "-+-".join("-" * w for w in widths)
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), sep]
    lines += [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in body]
    if notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in notes]
    return "\n".join(lines)


# -- /proc readers ----------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (its own threads, not children).

    From each thread's ``schedstat`` (nanoseconds on a CPU) where the kernel keeps it: ``stat``'s
    clock ticks are 10 ms, as coarse as a whole measurement of a fast path. (The threads alive
    now: a thread that ended between two readings takes its time with it. The agent's are its
    loop's and its executor's, which stay.)"""
    total, read = 0, 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f,
            ):
                total += int(f.read().split()[0])
                read += 1
    if read:
        return total / 1e9
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def kib_field(path: str, key: str) -> int:
    """A ``kB`` field of a /proc status-like file (``VmRSS`` of /proc/<pid>/status...), in KiB."""
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(f"{key} not in {path}")


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    """Resident memory of ``pid`` in MiB (``VmHWM`` for the peak)."""
    return kib_field(f"/proc/{pid}/status", key) / 1024


def self_cpu(children: bool = False) -> float:
    """CPU seconds of this process (and, with ``children``, of its reaped children)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    total = ru.ru_utime + ru.ru_stime
    if children:
        rc = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += rc.ru_utime + rc.ru_stime
    return total


def find_pids_with_env(name: str, value: str, cmdline_has: bytes = b"") -> list[int]:
    """PIDs of our processes whose environment holds ``name=value`` and whose argv contains
    ``cmdline_has`` (to find a helper server we did not start ourselves)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env and (not cmdline_has or cmdline_has in argv):
            found.append(int(entry))
    return found


def proc_cpu_or_zero(pid: int) -> float:
    try:
        return proc_cpu(pid)
    except OSError:
        return 0.0


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def code_info(repo: Path) -> dict[str, Any]:
    """The commit measured, and which engine files differed from it (the tree may be edited meanwhile)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.rstrip("\n")

    status = git("status", "--porcelain", "--", "remote_exec")
    return {
        "commit": (git("rev-parse", "HEAD") or "").strip() or None,
        "dirty_engine_files": None if status is None else [line[3:] for line in status.splitlines()],
    }


def machine_info() -> dict[str, Any]:
    cpu_model = None
    mem_total_kib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        mem_total_kib = kib_field("/proc/meminfo", "MemTotal")
    except (OSError, KeyError):
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),  # when the run ended
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_mib": None if mem_total_kib is None else mem_total_kib // 1024,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "versions": {d: _version(d) for d in (DISTRIBUTION, "aiohttp", "pydantic", "inspect-ai")},
    }


# -- shared by the sandbox benches (jail.py, ssh.py, sandboxes.py) -----------------------------


async def timed(fn: Callable[[], Awaitable[object]], reps: int, warmup: int = 3) -> Stat:
    """Milliseconds per call of ``fn``, after ``warmup`` unrecorded calls."""
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Stat.of(samples)


async def ours_first_byte(sb: rx.AsyncSandbox) -> float:
    """Milliseconds from ``exec_remote(["echo", "hi"])`` to its first stdout chunk."""
    t0 = time.perf_counter()
    first = None
    async for ev in sb.exec_remote(["echo", "hi"]):
        if first is None and isinstance(ev, rx.StdoutChunk):
            first = time.perf_counter() - t0
    assert first is not None
    return first * 1e3


async def ours_throughput(sb: rx.AsyncSandbox, mib: int) -> float:
    """MB/s of ``mib`` MiB of text streamed out of the sandbox (a plain byte count: busybox's
    ``head`` takes no ``M`` suffix)."""
    t0 = time.perf_counter()
    n = 0
    async for ev in sb.exec_remote(["sh", "-c", f"head -c {mib << 20} /dev/zero | tr '\\0' a"]):
        if isinstance(ev, rx.StdoutChunk):
            n += len(ev.data)
    assert n == mib << 20, n
    return n / (time.perf_counter() - t0) / MB
