"""``python -m remote_exec.demo`` (``make demo``): the main job of remote_exec in one minute.

1. a streaming job with separate stdout and stderr, shown live;
2. a job that overruns its timeout and is killed inside the sandbox, partial output kept;
3. a TERM-ignoring process tree, killed as a whole group;
4. a job left running by one client and attached from another, output replayed.
"""

from __future__ import annotations

import asyncio
import sys
import time

from ..client.types import Completed, StderrChunk, StdoutChunk
from ..errors import ExecTimeoutError
from ..sandboxes import open_sandbox

__all__ = ["main"]

BLUE, RED, DIM, BOLD, RESET = (
    ("\033[34m", "\033[31m", "\033[2m", "\033[1m", "\033[0m") if sys.stdout.isatty() else ("",) * 5
)


def say(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


async def demo(url: str) -> None:
    t0 = time.monotonic()

    def stamp() -> str:
        return f"{DIM}{time.monotonic() - t0:6.3f}s{RESET}"

    async with open_sandbox(url) as sb:
        print(f"sandbox {url}: agent {sb.info.version}, pid {sb.info.pid}, instance {sb.info.instance_id}")

        say("1. streaming: stdout and stderr arrive separately, as they are written")
        script = "for i in 1 2 3; do echo step $i; echo warning $i >&2; sleep 0.3; done; exit 3"
        t0 = time.monotonic()
        async for ev in sb.exec_remote(["sh", "-c", script]):
            match ev:
                case StdoutChunk(data=d):
                    print(f"{stamp()} {BLUE}stdout{RESET} {d!r}")
                case StderrChunk(data=d):
                    print(f"{stamp()} {RED}stderr{RESET} {d!r}")
                case Completed(exit_code=code):
                    print(f"{stamp()} exit code {code}")

        say("2. timeout: enforced inside the sandbox, partial output kept")
        t0 = time.monotonic()
        try:
            await sb.run(["sh", "-c", "echo working...; sleep 60"], timeout=1.0, kill_grace=0.5)
        except ExecTimeoutError as exc:
            print(f"{stamp()} {type(exc).__name__}: {exc}")
            print(f"         partial stdout: {exc.result.stdout!r}")

        say("3. kill: SIGTERM to the whole process group, SIGKILL after the grace")
        tree = sb.exec_remote(["sh", "-c", "trap '' TERM; sleep 300 & echo tree up; wait"], kill_grace=0.5)
        async for ev in tree:
            print(f"{DIM}job {tree.job_id} (pid {tree.pid}){RESET} {ev}")
            break
        t0 = time.monotonic()
        await tree.kill()
        state = {j.job_id: j for j in await sb.jobs()}[tree.job_id or ""]
        print(f"{stamp()} killed: state={state.state}, exit code {state.exit_code} (SIGKILL: it ignored SIGTERM)")

        say("4. attach: a job outlives its client; another one replays and follows it")
        job = sb.exec_remote(["sh", "-c", "for i in 1 2 3 4; do echo tick $i; sleep 0.4; done"])
        await job.started()
        job_id = job.detach()
        print(f"started {job_id} and detached")
    async with open_sandbox(url) as other:
        print("a second client attaches:")
        proc = await other.attach(job_id or "")
        result = await proc.wait()
        print(f"replayed and followed: {result.stdout!r}, exit {result.returncode}")
    print(f"\n{BOLD}done.{RESET} Try: remote-exec run -- sh -c 'echo hi; sleep 1; echo bye'")


def main(argv: list[str] | None = None) -> int:
    """Run the demo against ``argv[0]`` (a sandbox URL; default ``local://``)."""
    args = sys.argv[1:] if argv is None else argv
    asyncio.run(demo(args[0] if args else "local://"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
