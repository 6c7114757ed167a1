"""Benchmark suite: our engine vs plain subprocess vs inspect-ai's local sandbox, in one run.

    python bench/run.py                 # everything (a few minutes)
    python bench/run.py --quick         # small sizes, a smoke run (< 30 s)
    python bench/run.py --only first_byte,kill --out /tmp/r.json

Prints a table and writes every number (with the machine's description) as JSON to
``bench/results/latest.json`` unless ``--out`` says otherwise. Our agent runs in a private
temporary state directory and is stopped (SIGTERM) at the end. Exit status: 0 when every
benchmark ran (missed targets included), 1 when one of them crashed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import benchlib
import measure_ours as ours
import measure_subprocess as sp
from benchlib import Cell, Config, Row, Stat, Target
from measure_inspect import InspectHarness

import remote_exec as rx

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
BENCHES = ["first_byte", "late_output", "run_true", "throughput", "kill", "idle_cpu", "load"]
CHANNELS = ["socket", "stdio"]


@dataclass
class Ctx:
    cfg: Config
    sbs: dict[str, rx.AsyncSandbox]
    insp: InspectHarness
    notes: list[str] = field(default_factory=list)

    async def inspect(self, fn: Callable[[], Awaitable[T]], skip: str | None = None) -> T | str:
        """Run an inspect-ai measurement, or say why it was not run / how it failed."""
        if not self.insp.ok:
            return self.insp.reason or "skipped"
        if skip is not None:
            return f"skipped: {skip}"
        try:
            return await fn()
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}"[:160]


def stat_or(v: Any, conv: Callable[[Any], Cell]) -> Cell:
    return v if isinstance(v, str) else conv(v)


async def bench_first_byte(ctx: Ctx) -> list[Row]:
    reps = ctx.cfg.first_byte_reps
    base = Stat.of(await sp.first_byte(reps))
    insp = stat_or(await ctx.inspect(lambda: ctx.insp.first_byte(ctx.cfg.inspect_reps)), Stat.of)
    rows = []
    for ch, sb in ctx.sbs.items():
        got = Stat.of(await ours.first_byte(sb, reps))
        rows.append(Row("first_byte", f"first byte, echo hi [{ch}]", "ms", got, base, insp, Target("<=", 5.0)))
    return rows


async def bench_late_output(ctx: Ctx) -> list[Row]:
    cfg = ctx.cfg
    base = Stat.of(await sp.late_output(cfg.late_reps, cfg.late_sleep))
    skip = "--quick (its polls sleep >= 5 s)" if cfg.quick else None
    insp = stat_or(
        await ctx.inspect(lambda: ctx.insp.late_output(min(2, cfg.inspect_reps), cfg.late_sleep), skip), Stat.of
    )
    rows = []
    for ch, sb in ctx.sbs.items():
        if cfg.quick and ch != "socket":
            continue
        got = Stat.of(await ours.late_output(sb, cfg.late_reps, cfg.late_sleep))
        name = f"late output, sleep {cfg.late_sleep:g}; echo x [{ch}]"
        rows.append(Row("late_output", name, "s", got, base, insp, Target("<=", cfg.late_sleep + 0.01, "max")))
    return rows


async def bench_run_true(ctx: Ctx) -> list[Row]:
    reps = ctx.cfg.run_true_reps
    base = await sp.run_true(reps)
    ctx.notes.append(
        f"run_true: subprocess column = asyncio.create_subprocess_exec + communicate; blocking subprocess.run(['true'])"
        f" median {Stat.of(base['subprocess.run']).median:.2f} ms"
    )
    got_insp = await ctx.inspect(lambda: ctx.insp.run_true(ctx.cfg.inspect_reps), "--quick" if ctx.cfg.quick else None)
    insp: Cell = got_insp if isinstance(got_insp, str) else Stat.of(got_insp[ctx.insp.api.split(".")[-1]])
    if not isinstance(got_insp, str):
        ctx.notes.append(
            f"run_true: inspect-ai column = {ctx.insp.api}(['true']) awaited; its sandbox.exec(['true']) median "
            f"{Stat.of(got_insp['exec']).median:.2f} ms"
        )
    rows = []
    for ch, sb in ctx.sbs.items():
        got = Stat.of(await ours.run_true(sb, reps))
        rows.append(Row("run_true", f"await sb.run(['true']) [{ch}]", "ms", got, Stat.of(base["asyncio"]), insp))
    return rows


async def bench_throughput(ctx: Ctx) -> list[Row]:
    cfg = ctx.cfg
    base = await sp.throughput(cfg.throughput_mb)
    ctx.notes.append(
        f"throughput: {cfg.throughput_mb} MiB of 'a' from head|tr; MB = 10^6 B of decoded payload; the pipeline alone"
        f" into /dev/null runs at {base['devnull_mb_s']:.0f} MB/s (the producer's ceiling on this machine)"
    )
    size = cfg.inspect_throughput_mb
    got_insp = await ctx.inspect(lambda: ctx.insp.throughput(size), "--quick" if size <= 0 else None)
    insp: Cell = got_insp if isinstance(got_insp, str) else Stat.one(got_insp["mb_s"])
    if not isinstance(got_insp, str):
        ctx.notes.append(f"throughput: inspect-ai measured on {size} MiB only (text; it has no base64 mode)")
    rows = []
    for ch, sb in ctx.sbs.items():
        for enc in ("utf-8", "base64"):
            runs = [await ours.throughput(sb, cfg.throughput_mb, enc) for _ in range(cfg.throughput_reps)]
            got = Stat.of([r["mb_s"] for r in runs])
            row = Row("throughput", f"stdout throughput, {enc} [{ch}]", "MB/s", got, Stat.one(base["mb_s"]))
            row.inspect = insp if enc == "utf-8" else "n/a (no base64 mode)"
            row.target, row.extra = Target(">=", 300.0), {"runs": runs, "subprocess": base}
            rows.append(row)
    return rows


async def bench_kill(ctx: Ctx) -> list[Row]:
    cfg, sb, grace = ctx.cfg, ctx.sbs["socket"], ctx.cfg.kill_grace
    rows = []
    for trap in (True, False):
        reps = cfg.kill_reps if trap else max(cfg.kill_reps, 3)
        got = await ours.kill_latency(sb, grace, reps, trap)
        base = await sp.kill_latency(grace, reps, trap)
        skip = "--quick" if cfg.quick else None  # inspect-ai's round trips take ~1 s each
        got_insp = await ctx.inspect(functools.partial(ctx.insp.kill_latency, cfg.inspect_reps, trap), skip)
        extra = {"group_gone_after_kill": got["group_gone_after_kill"]}
        if trap:
            name, target = f"kill TERM-ignoring job, grace {grace:g} s [socket]", Target("<=", grace + 0.2, "max")
            rows.append(
                Row("kill", name, "s", Stat.of(got["seconds"]), Stat.of(base), stat_or(got_insp, Stat.of), target)
            )
        else:
            ms = [x * 1e3 for x in got["seconds"]]
            insp = stat_or(got_insp, lambda v: Stat.of([x * 1e3 for x in v]))
            name = "kill plain sleep 300 (dies on SIGTERM) [socket]"
            rows.append(Row("kill", name, "ms", Stat.of(ms), Stat.of([x * 1e3 for x in base]), insp))
        rows[-1].extra = extra
    if ctx.insp.ok:
        ctx.notes.append("kill: inspect-ai's kill() takes no grace argument; its server applies its own")
    return rows


async def bench_idle_cpu(ctx: Ctx) -> list[Row]:
    cfg = ctx.cfg
    n, window = cfg.idle_jobs, cfg.idle_window
    base = await sp.idle_cpu(n, window, cfg.settle)
    base_cell = Stat.one(base["pct_per_job"]["client"])
    skip = "--quick" if cfg.inspect_idle_jobs <= 0 else None
    got_insp = await ctx.inspect(lambda: ctx.insp.idle_cpu(cfg.inspect_idle_jobs, window), skip)
    insp: Cell = got_insp if isinstance(got_insp, str) else Stat.one(sum(got_insp["pct_per_job"].values()))
    if not isinstance(got_insp, str):
        ctx.notes.append(
            f"idle_cpu: inspect-ai with {got_insp['jobs']} jobs; its total = this process + the tools CLI it runs per"
            f" request + its server: {', '.join(f'{k} {v:.3f}%' for k, v in got_insp['pct_per_job'].items())}"
        )
    rows = []
    unit = "% core/job"
    for ch, sb in ctx.sbs.items():
        got = await ours.idle_cpu(sb, n, window, cfg.settle)
        pct = got["pct_per_job"]
        parts = " + ".join(pct)
        for proc_name, v in pct.items():
            rows.append(Row("idle_cpu", f"idle CPU, {n} watched sleeps: {proc_name} [{ch}]", unit, Stat.one(v)))
        total = Row("idle_cpu", f"idle CPU, {n} watched sleeps: {parts} [{ch}]", unit, Stat.one(sum(pct.values())))
        total.subprocess, total.inspect, total.target, total.extra = base_cell, insp, Target("<", 0.1), got
        rows.append(total)
    return rows


async def bench_load(ctx: Ctx) -> list[Row]:
    cfg, sb = ctx.cfg, ctx.sbs["socket"]
    ni, ns, window, lim = cfg.load_idle, cfg.load_stream, cfg.load_window, cfg.start_limit
    got = await ours.load(sb, ni, ns, window, lim, cfg.settle)
    base = await sp.load(ni, ns, window, cfg.settle)
    burst = await ours.burst_start(sb, ni, lim)  # last: it may leave the agent struggling for a while
    insp = ctx.insp.reason or "skipped: ~0.5 s per RPC (a CLI process each)"
    ok = burst["failed"] == 0
    burst_cell: Cell = Stat.one(burst["seconds"]) if ok else f"{burst['failed']}/{ni} starts raised"
    g, bs = got, base

    def row(name: str, unit: str, ours_cell: Cell, base_cell: Cell = None) -> Row:
        return Row("load", f"load: {name}", unit, ours_cell, base_cell)

    rows = [
        row(f"{ni} exec_remote() at once (burst)", "s", burst_cell, Stat.one(bs["start_idle_s"])),
        row(f"start {ni} idle jobs, {lim} at a time", "s", Stat.one(g["start_idle_s"])),
        row(f"start {ns} streaming jobs", "s", Stat.one(g["start_stream_s"]), Stat.one(bs["start_stream_s"])),
        row("first byte of echo hi while loaded", "ms", Stat.of(g["first_byte_ms"]), Stat.of(bs["first_byte_ms"])),
        row("poll RPC round trip (wait=0) while loaded", "ms", Stat.of(g["poll_rtt_ms"])),
        row(f"aggregate stdout of {ns} streams", "MB/s", Stat.one(g["stream_mb_s"]), Stat.one(bs["stream_mb_s"])),
        row(f"agent RSS with {ni + ns} jobs", "MiB", Stat.one(g["agent_rss_mib_loaded"])),
        row(f"kill all {ni + ns} jobs, {lim} at a time", "s", Stat.one(g["kill_all_s"]), Stat.one(bs["kill_all_s"])),
    ]
    rows[0].inspect = insp
    rows[0].target, rows[0].verdict, rows[0].extra = "every start succeeds", ok, burst
    rows[1].extra = {"ours": {k: v for k, v in got.items() if not isinstance(v, list)}, "subprocess": base}
    if not ok:
        ctx.notes.append(
            f"load burst: {burst['failed']} of {ni} concurrent exec_remote() starts raised"
            f" ({burst.get('first_error', '')[:100]}); the sandbox answered again after"
            f" {burst['recovered_after_s']} s; the agent had {burst['running_in_agent']} new jobs running"
            f" ({burst['orphans']} more than the {burst['handles_ok']} handles the client got: orphans)"
        )
    ctx.notes.append(
        f"load: agent RSS {got['agent_rss_mib_before']:.0f} MiB before, {got['agent_rss_mib_peak']:.0f} peak,"
        f" {got['agent_rss_mib_after']:.0f} after; agent CPU {got['agent_cpu_pct']:.0f}% of a core during the window;"
        f" start failures {got['start_failures']} (orphans killed after: {got['orphans_killed']}),"
        f" watchers failed {got['watchers_failed']}, kill failures {got['kill_failures']};"
        f" the {ni} watchers took {got['watchers_joined_s']:.1f} s to connect, {lim} at a time;"
        " the subprocess baseline reads the same streams in this process"
    )
    return rows


RUNNERS: dict[str, Callable[[Ctx], Awaitable[list[Row]]]] = {
    "first_byte": bench_first_byte,
    "late_output": bench_late_output,
    "run_true": bench_run_true,
    "throughput": bench_throughput,
    "kill": bench_kill,
    "idle_cpu": bench_idle_cpu,
    "load": bench_load,
}


def _use_pidfd_watcher() -> None:
    if sys.version_info < (3, 12):  # 3.11's default watcher runs a thread per child
        watcher = asyncio.PidfdChildWatcher()
        asyncio.set_child_watcher(watcher)
        watcher.attach_loop(asyncio.get_running_loop())


async def _stop_agent(pid: int | None) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace, only: list[str]) -> dict[str, Any]:
    _use_pidfd_watcher()
    benchlib.raise_fd_limit()
    cfg = Config.make(args.quick)
    state = Path(tempfile.mkdtemp(prefix="rx-bench-"))
    insp = InspectHarness()
    sbs: dict[str, rx.AsyncSandbox] = {}
    rows: list[Row] = []
    errors: list[dict[str, str]] = []
    agent_pid: int | None = None
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    code = benchlib.code_info(HERE.parent)  # before anything is imported lazily or spawned
    if load_start[0] > 0.7 * (os.cpu_count() or 1) / 2:
        print(
            f"[bench] warning: the machine is busy (load {load_start[0]:.2f}): numbers will be noisy", file=sys.stderr
        )
    ctx = Ctx(cfg, sbs, insp)
    try:
        for ch in CHANNELS:
            sbs[ch] = await rx.open_sandbox(f"local://?dir={state / 'agent'}&channel={ch}&idle_timeout=600")
        agent_pid = sbs["socket"].info.pid
        if args.no_inspect:
            insp.reason = "skipped: --no-inspect"
        else:
            t0 = time.perf_counter()
            await insp.setup()
            print(f"[bench] inspect-ai set up in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if insp.ok:
            api = "exec_remote" if insp.has_exec_remote else "sandbox.exec (it has no exec_remote)"
            ctx.notes.append(
                f"inspect-ai {insp.version}: local sandbox via {api}; first call (tools injection) {insp.setup_s:.2f} s"
            )
        for name in only:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                got = await RUNNERS[name](ctx)
            except Exception as exc:
                errors.append(
                    {"bench": name, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                )
                got = [Row(name, name, "", f"error: {type(exc).__name__}: {exc}"[:100])]
                traceback.print_exc()
            rows += got
            print(f"[bench] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        for sb in sbs.values():
            with contextlib.suppress(Exception):
                await sb.aclose()
        t0 = time.perf_counter()
        await insp.teardown()
        print(f"[bench] teardown in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        await _stop_agent(agent_pid)
        shutil.rmtree(state, ignore_errors=True)
    return {
        "machine": {
            **benchlib.machine_info(),
            "started_at": started_at,
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "code": code,
        "argv": sys.argv[1:],
        "config": dataclasses.asdict(cfg),
        "only": only,
        "duration_s": round(time.perf_counter() - t_start, 1),
        "agent": {"pid": agent_pid, "channels": CHANNELS},
        "inspect_ai": {"version": insp.version, "api": insp.api if insp.ok else None, "skipped": insp.reason},
        "results": [r.to_json() for r in rows],
        "table": benchlib.render_table(rows, ctx.notes),
        "notes": ctx.notes,
        "errors": errors,
    }


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (< 30 s)")
    p.add_argument("--only", action="append", default=[], help=f"comma-separated subset of {','.join(BENCHES)}")
    p.add_argument("--out", type=Path, default=HERE / "results" / "latest.json", help="where to write the JSON")
    p.add_argument("--no-inspect", action="store_true", help="skip the inspect-ai comparison")
    args = p.parse_args(argv)
    only = [n.strip() for spec in args.only for n in spec.split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in only if n not in RUNNERS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {BENCHES}")
    return args, [n for n in BENCHES if n in only]


def main(argv: list[str] | None = None) -> int:
    args, only = parse_args(argv)
    report = asyncio.run(run(args, only))
    print(report["table"])
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    print(f"\nwrote {out} ({report['duration_s']} s)")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
