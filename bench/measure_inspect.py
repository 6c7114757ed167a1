"""The same measurements against inspect-ai's ``local`` sandbox, when ``inspect_ai`` is importable.

inspect-ai's ``SandboxEnvironment.exec_remote`` talks to its sandbox-tools server by running the
tools CLI once per JSON-RPC request (``sandbox.exec([SANDBOX_CLI, ...])``) and polls with sleeps
of at least ``MIN_POLL_INTERVAL`` (5 s) between empty polls. The sandbox is wrapped in
``SandboxEnvironmentProxy`` as inside an eval (its poll path requires the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from typing import Any

from benchlib import MB, find_pids_with_env, proc_cpu_or_zero, self_cpu

TRAP_CMD = ["sh", "-c", "trap '' TERM; sleep 300 & echo ready; wait"]


class InspectHarness:
    """One inspect-ai local sandbox for the whole run; ``reason`` says why it is unavailable."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.version: str | None = None
        self.has_exec_remote = False
        self.setup_s: float | None = None
        self._env: Any = None
        self._envs: dict[str, Any] | None = None
        self.sb: Any = None

    @property
    def ok(self) -> bool:
        return self.reason is None and self.sb is not None

    async def setup(self) -> None:
        try:
            inspect_ai = importlib.import_module("inspect_ai")
            local = importlib.import_module("inspect_ai.util._sandbox.local")
            events = importlib.import_module("inspect_ai.util._sandbox.events")
        except Exception as exc:  # ImportError, or a broken install
            self.reason = f"skipped: inspect_ai not importable ({type(exc).__name__}: {exc}); pip install inspect-ai"
            return
        self.version = getattr(inspect_ai, "__version__", None)
        cls = local.LocalSandboxEnvironment
        self.has_exec_remote = hasattr(cls, "exec_remote")
        try:
            self._envs = await cls.sample_init("remote_exec_bench", None, {})
            self._env = self._envs["default"]
            self.sb = events.SandboxEnvironmentProxy(self._env)
            t0 = time.perf_counter()
            if self.has_exec_remote:  # the first call injects the sandbox tools and starts their server
                await self.sb.exec_remote(["true"], stream=False)
            else:
                await self.sb.exec(["true"])
            self.setup_s = time.perf_counter() - t0
        except Exception as exc:
            self.reason = f"skipped: inspect-ai local sandbox failed to start ({type(exc).__name__}: {exc})"
            await self.teardown()

    async def teardown(self) -> None:
        if self._envs is not None:
            local = importlib.import_module("inspect_ai.util._sandbox.local")
            with contextlib.suppress(Exception):
                await local.LocalSandboxEnvironment.sample_cleanup("remote_exec_bench", None, self._envs, False)
            self._envs = None

    @property
    def api(self) -> str:
        return "exec_remote" if self.has_exec_remote else "sandbox.exec"

    def server_pids(self) -> list[int]:
        tools_dir = getattr(self._env, "_sandbox_tools_dir", None)
        if tools_dir is None:
            return []
        return find_pids_with_env("INSPECT_SANDBOX_TOOLS_DIR", str(tools_dir), cmdline_has=b"server")

    # -- measurements ------------------------------------------------------------------------

    async def _first_chunk(self, cmd: list[str]) -> float:
        """Seconds from the exec_remote call to the first stdout event (then drained)."""
        t0 = time.perf_counter()
        if not self.has_exec_remote:
            await self.sb.exec(cmd)  # no streaming: the output comes with the end
            return time.perf_counter() - t0
        proc = await self.sb.exec_remote(cmd)
        first: float | None = None
        async for ev in proc:
            if first is None and type(ev).__name__ == "ExecStdout":
                first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"{cmd} produced no stdout event")
        return first

    async def first_byte(self, reps: int) -> list[float]:
        return [await self._first_chunk(["echo", "hi"]) * 1e3 for _ in range(reps)]

    async def late_output(self, reps: int, sleep: float) -> list[float]:
        return [await self._first_chunk(["sh", "-c", f"sleep {sleep}; echo x"]) for _ in range(reps)]

    async def run_true(self, reps: int) -> dict[str, list[float]]:
        res: dict[str, list[float]] = {"exec_remote": [], "exec": []}
        for _ in range(reps):
            if self.has_exec_remote:
                t0 = time.perf_counter()
                await self.sb.exec_remote(["true"], stream=False)
                res["exec_remote"].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            await self.sb.exec(["true"])
            res["exec"].append((time.perf_counter() - t0) * 1e3)
        return res

    async def throughput(self, size_mb: int) -> dict[str, Any]:
        cmd = ["sh", "-c", f"head -c {size_mb}M /dev/zero | tr '\\0' a"]
        t0 = time.perf_counter()
        n = 0
        if self.has_exec_remote:
            async for ev in await self.sb.exec_remote(cmd):
                if type(ev).__name__ == "ExecStdout":
                    n += len(ev.data)
        else:
            n = len((await self.sb.exec(cmd)).stdout)
        dt = time.perf_counter() - t0
        return {"mb_s": n / dt / MB, "seconds": round(dt, 3), "bytes": n, "size_mb": size_mb}

    async def idle_cpu(self, n: int, window: float) -> dict[str, Any]:
        """CPU of this process + its reaped children (the per-request CLIs) + the tools server."""
        procs = [await self.sb.exec_remote(["sleep", "300"]) for _ in range(n)]

        async def watch(proc: Any) -> None:
            async for _ in proc:
                pass

        tasks = [asyncio.create_task(watch(p)) for p in procs]
        try:
            await asyncio.sleep(1.0)
            servers = self.server_pids()
            s0 = sum(proc_cpu_or_zero(p) for p in servers)
            c0, t0 = self_cpu(children=True), time.perf_counter()
            await asyncio.sleep(window)
            elapsed = time.perf_counter() - t0
            used = {
                "client+clis": self_cpu(children=True) - c0,
                "server": sum(proc_cpu_or_zero(p) for p in servers) - s0,
            }
        finally:
            await asyncio.gather(*(p.kill() for p in procs), return_exceptions=True)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        pct = {k: v / elapsed / n * 100 for k, v in used.items()}
        return {"pct_per_job": pct, "cpu_s": used, "window_s": elapsed, "jobs": n, "server_pids": servers}

    async def kill_latency(self, reps: int, trap: bool) -> list[float]:
        """Seconds ``proc.kill()`` takes (inspect's kill takes no grace: the server applies its own)."""
        out = []
        for _ in range(reps):
            proc = await self.sb.exec_remote(TRAP_CMD if trap else ["sleep", "300"])
            # Its first poll comes at once, the next >= 5 s later: just give the trap time to be set.
            await asyncio.sleep(0.5 if trap else 0.05)
            t0 = time.perf_counter()
            await proc.kill()
            out.append(time.perf_counter() - t0)
        return out
