"""The fault suite's driver: ≥ 200 streaming jobs (one in ten in a pseudo-terminal) while the
agent is SIGKILLed (or handed over to another version) at seeded moments, then every byte, exit
code, job and process checked.

Moments are chosen by a seeded RNG and reached on real events, never on sleeps: a job of a wave
confirmed started (the others' starts still in flight), the host's received byte count passing a
drawn threshold (mid-stream), an answered ``server_info`` (between polls), stdin writes in flight.
After each fault the driver waits for the next agent (a ``server_info`` answered by another pid).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

import remote_exec as rx

from .workload import expected, go_line, job_command, tty

__all__ = ["Outcome", "RunIn", "Target", "run_suite"]

RunIn = Callable[[list[str]], Awaitable[tuple[int, bytes, bytes]]]
"""Runs argv inside the sandbox (as the agent's user): its exit code, stdout, stderr."""

WAVES = 8  # jobs start in waves, interleaved with the faults
POLL = 0.5  # the jobs' long-poll wait


@dataclass
class Target:
    """A sandbox to torment: its URL and a way to run a command inside it out of band.

    :ivar run_in: runs argv inside the sandbox (as the agent's user): its exit code, stdout, stderr.
    :ivar ours: whether a process (its command line) belongs to this suite's sandbox.
    """

    name: str
    url: str
    run_in: RunIn
    ours: Callable[[str], bool]


@dataclass
class Outcome:
    jobs: int
    faults: int
    kinds: dict[str, int]
    bytes_verified: int
    seconds: float
    versions: set[str] = field(default_factory=set)
    ttys: int = 0

    def summary(self, backend: str, seed: int) -> str:
        kinds = " ".join(f"{k}={v}" for k, v in sorted(self.kinds.items()))
        return (
            f"fault suite [{backend}] seed={seed}: {self.jobs} jobs ({self.ttys} in a terminal), "
            f"{self.faults} faults ({kinds}), "
            f"{self.bytes_verified} bytes verified by sha256, {self.seconds:.1f} s"
        )


class _Watch:
    """What the host has received of one job, through its normal iteration."""

    def __init__(self) -> None:
        self.out = hashlib.sha256()
        self.err = hashlib.sha256()
        self.n_out = 0
        self.n_err = 0
        self.code: int | None = None
        self.started = anyio.Event()  # its first output came: a tty job's echo is off (see workload)
        self.done = anyio.Event()


class _Progress:
    """Bytes received across all jobs, and a threshold someone waits for."""

    def __init__(self) -> None:
        self.total = 0
        self.want: int | None = None
        self.hit = anyio.Event()

    def add(self, n: int) -> None:
        self.total += n
        if self.want is not None and self.total >= self.want:
            self.hit.set()

    async def reach(self, n: int, timeout: float) -> bool:
        """Until ``n`` bytes were received in all; False if no more came within ``timeout``."""
        self.want, self.hit = n, anyio.Event()
        if self.total >= n:
            return True
        with anyio.move_on_after(timeout):
            await self.hit.wait()
            return True
        return False


async def _follow(proc: rx.ExecRemoteProcess, watch: _Watch, progress: _Progress) -> None:
    async for ev in proc:
        if isinstance(ev, rx.StdoutChunk | rx.StderrChunk):
            data = ev.data if isinstance(ev.data, bytes) else ev.data.encode()
            if isinstance(ev, rx.StdoutChunk):
                watch.out.update(data)
                watch.n_out += len(data)
                watch.started.set()
            else:
                watch.err.update(data)
                watch.n_err += len(data)
            progress.add(len(data))
        elif isinstance(ev, rx.Completed):
            watch.code = ev.exit_code
    watch.done.set()


async def _ps(target: Target) -> list[tuple[int, str]]:
    """The sandbox's live processes that are ours: (pid, command line); zombies left out."""
    out = await _must(target, ["ps", "-ww", "-eo", "pid=,stat=,args="])
    found = []
    for line in out.decode(errors="replace").splitlines():
        pid, stat, args = [*line.strip().split(None, 2), "", ""][:3]
        if pid.isdigit() and not stat.startswith("Z") and target.ours(args) and not args.startswith("ps "):
            found.append((int(pid), args))
    return found


async def _must(target: Target, argv: list[str]) -> bytes:
    code, out, err = await target.run_in(argv)
    assert code == 0, f"{argv} exited {code} in {target.name}: {out[-500:]!r} {err[-500:]!r}"
    return out


def _is_agent(args: str) -> bool:
    return "remote-exec-agent" in args or "remote_exec.agent" in args


async def run_suite(
    target: Target, seed: int, *, jobs: int = 200, kills: int = 20, upgrades: int = 0, log: Callable[[str], None]
) -> Outcome:
    """Run the suite against ``target``; raise AssertionError (naming the seed) on any loss."""
    rng = random.Random(seed)
    tag = f"rxfault-{seed}-"
    began = time.monotonic()
    faults = ["kill"] * kills + ["upgrade"] * upgrades
    rng.shuffle(faults)
    per_wave = -(-jobs // WAVES)
    wave_at = {round(i * len(faults) / WAVES): i for i in range(WAVES)}  # fault index -> wave
    kinds: dict[str, int] = {}
    procs: dict[int, rx.ExecRemoteProcess] = {}
    watches = {k: _Watch() for k in range(jobs)}
    unwatched = {k for k in range(jobs) if k % 10 == 5}  # read only at the end, by attach
    progress = _Progress()
    versions: set[str] = set()
    # The default response margin (5 s), not less: faults follow each other as soon as an agent
    # answers, so the keeper backs off from restarting agents that die young (up to 1.6 s) and a
    # docker exec relay waits for the next agent meanwhile; a response may lag that long.
    async with rx.open_sandbox(target.url) as sb, anyio.create_task_group() as tg:
        info = await sb.server_info()
        agent_argv, state_dir = await _agent_command(target, info.pid)

        def start_wave(w: int) -> list[int]:
            ks = list(range(w * per_wave, min(jobs, (w + 1) * per_wave)))
            for k in ks:
                procs[k] = sb.exec_remote(
                    job_command(tag, k),
                    encoding="base64",
                    stdin_open=True,
                    tty=tty(k),
                    label=f"{tag}-{k}",
                    poll_interval=POLL,
                )
                if k not in unwatched:
                    tg.start_soon(_follow, procs[k], watches[k], progress)
            return ks

        async def fault(i: int, what: str, pid: int) -> None:
            if what == "kill":
                await _must(target, ["kill", "-9", str(pid)])
                return
            # Another version over the same state dir: ``ensure`` hands the jobs over to it.
            version = f"0.0.{i}-fault"
            ensure = [*agent_argv, "ensure", "--dir", state_dir, "--report-version", version]
            code, out, err = await target.run_in(ensure)
            # The suite's own client reconnects through its ``ensure``, which hands them straight
            # back to the host's version: the new agent may be leaving already when this ``ensure``
            # asks it for its info at the end (after both the handover and its start succeeded).
            raced = code == 3 and b"agent server unreachable" in out
            assert code == 0 or raced, f"seed {seed}: ensure of {version} exited {code}: {out[-500:]!r} {err[-500:]!r}"
            versions.add(version)

        for i, what in enumerate(faults):
            pid = info.pid
            wave = wave_at.get(i)
            if wave is not None:
                ks = start_wave(wave)
                kind = rng.choice(["start", "start", "stream"])
            else:
                kind = rng.choice(["stream", "stream", "idle"] + (["stdin"] if i >= len(faults) - 3 else []))
            if kind == "start":
                await procs[rng.choice(ks)].started()  # that one is in; the rest may be in flight
            elif kind == "stream":
                if not await progress.reach(progress.total + rng.randint(1, 64 * 1024), timeout=3.0):
                    kind = "quiet"  # every live stream waits for its go: nothing more came
            elif kind == "idle":
                info = await sb.server_info()
            elif kind == "stdin":
                for k in rng.sample(sorted(procs), k=len(procs) // 4):
                    tg.start_soon(_go, procs[k], k, watches[k])
            kinds[f"{what}:{kind}"] = kinds.get(f"{what}:{kind}", 0) + 1
            log(f"fault {i}: {what} of agent {pid} ({kind}), {progress.total} bytes received so far")
            await fault(i, what, pid)
            info = await _next_agent(sb, pid)
        for w in range(WAVES):  # any wave the schedule did not reach (few faults)
            if w * per_wave < jobs and w * per_wave not in procs:
                start_wave(w)
        with anyio.fail_after(90):
            async with anyio.create_task_group() as gos:
                for k, proc in procs.items():
                    gos.start_soon(_go, proc, k, watches[k])
            for k in sorted(set(procs) - unwatched):
                await watches[k].done.wait()
        listed = {j.label: j for j in await sb.jobs() if j.label and j.label.startswith(tag + "-")}
        for k in sorted(unwatched):  # never watched live: attach now, replaying from the files
            tg.start_soon(_follow, await sb.attach(listed[f"{tag}-{k}"].job_id), watches[k], progress)
        with anyio.fail_after(60):
            for k in sorted(unwatched):
                await watches[k].done.wait()
        verified = _verify(tag, seed, watches, listed)
        await _no_leaks(target, tag, seed)
    ttys = sum(map(tty, range(jobs)))
    return Outcome(jobs, len(faults), kinds, verified, time.monotonic() - began, versions, ttys)


async def _go(proc: rx.ExecRemoteProcess, k: int, watch: _Watch) -> None:
    if tty(k):
        await watch.started.wait()  # typed before its ``stty -echo``, the line would be echoed
    if proc.returncode is not None:
        return
    try:
        await proc.write_stdin(go_line(k))
        await proc.close_stdin()
    except rx.JobNotRunningError:
        pass  # a bulk job has no use for its stdin and may be gone


async def _agent_command(target: Target, pid: int) -> tuple[list[str], str]:
    """How the agent was started (argv before ``serve``) and its state dir, from its command line."""
    argv = (await _must(target, ["cat", f"/proc/{pid}/cmdline"])).decode().split("\0")
    serve = argv.index("serve")
    return argv[:serve], argv[argv.index("--dir", serve) + 1]


async def _next_agent(sb: rx.AsyncSandbox, gone: int) -> rx.ServerInfo:
    """The agent that serves once ``gone`` has died or handed over (the call reconnects)."""
    with anyio.fail_after(60):
        while True:
            info = await sb.server_info()
            if info.pid != gone:
                return info
            # The old agent still answers (a handover not begun yet): ask again (a state, asked for).
            await anyio.sleep(0.05)


def _verify(tag: str, seed: int, watches: dict[int, _Watch], listed: dict[str, rx.JobInfo]) -> int:
    """Each job exactly once, each byte exactly once, each exit code right; return bytes checked."""
    wrong = []
    total = 0
    if len(listed) != len(watches):
        wrong.append(f"{len(listed)} jobs listed with the suite's labels, {len(watches)} started")
    for k, w in watches.items():
        want = expected(tag, k)
        got = (w.out.hexdigest(), w.err.hexdigest(), w.code)
        if got != (want.stdout_sha, want.stderr_sha, want.exit_code):
            wrong.append(
                f"job {k}: stdout {w.n_out} bytes (want {want.stdout_len}) sha ok={got[0] == want.stdout_sha}, "
                f"stderr sha ok={got[1] == want.stderr_sha}, exit {w.code} (want {want.exit_code})"
            )
        total += w.n_out + w.n_err
    assert not wrong, (
        f"seed {seed}: " + "; ".join(wrong[:10]) + (f" (+{len(wrong) - 10} more)" if len(wrong) > 10 else "")
    )
    return total


async def _no_leaks(target: Target, tag: str, seed: int) -> None:
    """No job process left; exactly one keeper and one agent (no strays from the faults)."""
    seen: tuple[object, ...] = ()
    with anyio.move_on_after(20):
        while True:
            table = await _ps(target)
            jobs = [p for p in table if tag in p[1]]
            keepers = [p for p in table if _is_agent(p[1]) and " keeper " in p[1]]
            agents = [p for p in table if _is_agent(p[1]) and " serve " in p[1] and " keeper " not in p[1]]
            if not jobs and len(keepers) == 1 and len(agents) == 1:
                return
            seen = (jobs, keepers, agents)
            # A killed job takes a moment to be reaped, a replaced agent to exit: ask the table again.
            await anyio.sleep(0.1)
    raise AssertionError(f"seed {seed}: leaks (jobs, keepers, agents): {seen}")
