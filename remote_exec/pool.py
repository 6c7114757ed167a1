"""``SandboxPool``: one sandbox per session key, opened once, kept warm, closed when unneeded.

For apps and dashboards that serve many users or notebooks: each key (a user id, a notebook
path, a kernel id) gets its own sandbox, opened on first use and reused afterwards. The pool
holds at most ``max_size`` of them (the least recently used idle one is closed beyond that) and
closes any left unused for ``idle_ttl`` seconds. Nothing polls: a background task sleeps until
the next idle deadline.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import anyio
from anyio.abc import TaskGroup

from .client.sandbox import AsyncSandbox
from .errors import SandboxError
from .sandboxes import open_sandbox

__all__ = ["PoolStats", "SandboxFactory", "SandboxPool"]

log = logging.getLogger("remote_exec.pool")

SandboxFactory = Callable[[str], str | Awaitable[AsyncSandbox]]
"""Makes the sandbox for a key: returns its URL, or an awaitable of an ``AsyncSandbox``."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of a pool's size and counters (see :attr:`SandboxPool.stats`).

    :ivar size: keys in the pool, sandboxes being opened included.
    :ivar in_use: keys with a lease held (or a ``get`` waiting for its sandbox).
    :ivar opened: sandboxes opened.
    :ivar reused: ``get``/``lease`` calls served without opening (waiting on an opening counts).
    :ivar failed: openings that raised.
    :ivar evicted: idle sandboxes closed because the pool was over ``max_size``.
    :ivar expired: sandboxes closed after ``idle_ttl`` seconds unused.
    :ivar replaced: sandboxes found closed by a ``get`` (and opened again).
    :ivar discarded: keys removed by :meth:`SandboxPool.discard`.
    """

    size: int
    in_use: int
    opened: int
    reused: int
    failed: int
    evicted: int
    expired: int
    replaced: int
    discarded: int


_COUNTERS = ("opened", "reused", "failed", "evicted", "expired", "replaced", "discarded")


class _Entry:
    """One key's slot: its sandbox (or the opening of it) and who uses it."""

    __slots__ = ("error", "key", "last_used", "ready", "retired", "sandbox", "scope", "users")

    def __init__(self, key: str, now: float) -> None:
        self.key = key
        self.sandbox: AsyncSandbox | None = None
        self.error: Exception | None = None
        self.ready = anyio.Event()  # the opening ended: sandbox or error is set
        self.scope = anyio.CancelScope()  # the opening's
        self.users = 0  # leases held + gets waiting for the opening
        self.last_used = now
        self.retired = False  # out of the pool; closed once users drops to 0


class SandboxPool:
    """Sandboxes keyed by a session key: ``async with rx.SandboxPool(url, max_size=8) as pool``.

    ``await pool.get(key)`` returns the key's sandbox, opening it on first use; concurrent calls
    for one key share ONE opening. ``async with pool.lease(key) as sb`` does the same and pins
    the sandbox for the block: a leased sandbox is never evicted or expired. If every sandbox is
    leased, the pool grows past ``max_size`` rather than wait (waiting could deadlock a task that
    holds one lease and asks for another key) and shrinks back as leases end. Leaving the
    ``async with`` block closes every sandbox, leased or not.

    A sandbox found closed (``sb.aclose()`` was called on it) is replaced by a new one on the
    next ``get``/``lease``. A broken channel is re-made by the sandbox itself on its next call;
    if a sandbox keeps failing (``AgentUnavailableError``), :meth:`discard` it. The pool is for
    one event loop; use it from any number of its tasks. Failures to close a sandbox in the
    background (eviction, expiry) are logged to the ``remote_exec.pool`` logger.

    :param sandboxes: a sandbox URL, opened once per key with :func:`~remote_exec.open_sandbox`;
        or a callable taking the key and returning a URL, or an awaitable of an ``AsyncSandbox``
        (an ``async def``, or ``lambda key: rx.open_sandbox(...)``). The pool owns (and closes)
        every sandbox it gets this way. A key comes from your users: build a URL from it with
        :func:`~remote_exec.sandbox_url` (which quotes it), never by pasting it into a string.
    :param max_size: how many keys the pool holds before it evicts idle sandboxes.
    :param idle_ttl: seconds a sandbox may stay unused (no ``get``, no lease) before it is
        closed; ``None`` keeps it until evicted.
    :param clock: monotonic seconds that ``idle_ttl`` is counted in (default
        :func:`time.monotonic`); a test passes a fake one, advances it and calls
        :meth:`expire_idle` instead of waiting out the TTL.
    :raises ValueError: ``max_size`` < 1 or ``idle_ttl`` <= 0.
    """

    def __init__(
        self,
        sandboxes: str | SandboxFactory,
        *,
        max_size: int = 16,
        idle_ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, not {max_size}")
        if idle_ttl is not None and not idle_ttl > 0:
            raise ValueError(f"idle_ttl must be positive (or None), not {idle_ttl}")
        self._source = sandboxes
        self.max_size = max_size
        self.idle_ttl = idle_ttl
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._lingering: set[_Entry] = set()  # retired but still leased
        self._counts: Counter[str] = Counter()
        self._tg: TaskGroup | None = None  # runs openings, background closes and the reaper
        self._busy = 0  # tasks running in _tg
        self._drained: anyio.Event | None = None  # set when _busy drops to 0 during aclose
        self._state: Literal["new", "open", "closed"] = "new"
        self._wake: anyio.Event | None = None  # wakes the reaper before its deadline
        self._reap_at = math.inf

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> SandboxPool:
        if self._state != "new":
            raise RuntimeError(f"this pool is {self._state}; make a new one")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._state = "open"
        if self.idle_ttl is not None:
            self._spawn(self._reap, name="SandboxPool reaper")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        try:
            await self.aclose()
        except BaseException:
            await self._tg.__aexit__(exc_type, exc, tb)
            raise
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close every sandbox, leased or not, concurrently; cancel openings in progress.

        Idempotent; shielded from cancellation (it also waits for the pool's background tasks).
        Whoever waits for a cancelled opening gets ``RuntimeError``, as do later calls.

        :raises ExceptionGroup: closing some sandboxes failed (the others were still closed).
        """
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        entries = [*self._entries.values(), *self._lingering]
        self._entries.clear()
        self._lingering.clear()
        if self._wake is not None:
            self._wake.set()  # the reaper sees the state and returns
        errors: list[Exception] = []

        async def close(sb: AsyncSandbox) -> None:
            try:
                await sb.aclose()
            except Exception as exc:
                errors.append(exc)

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for entry in entries:
                    entry.retired = True
                    if entry.sandbox is None:
                        entry.scope.cancel()
                    else:
                        tg.start_soon(close, entry.sandbox)
            while self._busy:  # the reaper, cancelled openings, background closes
                self._drained = anyio.Event()
                await self._drained.wait()
        if errors:
            raise ExceptionGroup(f"closing {len(errors)} pooled sandbox(es) failed", errors)

    # -- using it ---------------------------------------------------------------------------

    async def get(self, key: str) -> AsyncSandbox:
        """The sandbox for ``key``, opened now if the pool has none (or only a closed one).

        Concurrent calls for one key wait for a single opening and get the same sandbox. If the
        opening fails, every waiter gets its exception and the next call tries again. The
        sandbox is not pinned: it may be evicted or expire (be closed) once you yield control,
        so use :meth:`lease` around work that must not be cut short.

        Cancelling ``get()`` does not cancel the opening: it completes and the sandbox stays in
        the pool, idle, for the next caller.

        :raises RuntimeError: the pool is not open (use ``async with``), or closed while waiting.
        :raises SandboxError: the key was discarded while its sandbox was being opened.
        :raises RemoteExecError: opening failed (e.g. ``AgentUnavailableError``), or whatever a
            factory raised.
        """
        entry = await self._checkout(key)
        self._release(entry, trim=False)  # never hand out a sandbox that is being evicted
        assert entry.sandbox is not None
        return entry.sandbox

    @contextlib.asynccontextmanager
    async def lease(self, key: str) -> AsyncIterator[AsyncSandbox]:
        """``async with pool.lease(key) as sb``: :meth:`get`, with the sandbox pinned for the block.

        A leased sandbox is never evicted or expired; only :meth:`aclose` closes it while leased
        (:meth:`discard` waits for the last lease to end). Raises as :meth:`get` does.

        Cancelling the wait for the sandbox does what cancelling :meth:`get` does (the opening
        completes for the next caller); cancelling the block releases the lease on the way out.
        """
        entry = await self._checkout(key)
        try:
            assert entry.sandbox is not None
            yield entry.sandbox
        finally:
            self._release(entry)

    async def discard(self, key: str) -> bool:
        """Take ``key``'s sandbox out of the pool and close it; the next ``get`` opens a new one.

        An unleased sandbox is closed before this returns; a leased one when its last lease
        ends. An opening in progress is cancelled (its waiters get ``SandboxError``).
        Returns whether the pool had ``key``.

        :raises RemoteExecError: closing the sandbox failed (it is out of the pool anyway).
        """
        entry = self._entries.get(key)
        if entry is None:
            return False
        self._counts["discarded"] += 1
        if entry.sandbox is not None and not entry.users:
            entry.retired = True
            del self._entries[key]
            await entry.sandbox.aclose()
        else:
            self._retire(entry)
        return True

    def keys(self) -> list[str]:
        """The keys in the pool, least recently used first (openings in progress included)."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def stats(self) -> PoolStats:
        """The pool's size and counters, as of now."""
        c = self._counts
        in_use = sum(1 for e in self._entries.values() if e.users)
        return PoolStats(len(self._entries), in_use, *(c[f] for f in _COUNTERS))

    def __repr__(self) -> str:
        return f"<SandboxPool {self._state} {len(self._entries)}/{self.max_size} idle_ttl={self.idle_ttl}>"

    # -- internals ---------------------------------------------------------------------------

    async def _checkout(self, key: str) -> _Entry:
        """``key``'s entry with its sandbox open and one use counted (undo with ``_release``)."""
        while True:
            if self._state != "open" or self._tg is None:
                raise RuntimeError(f"the pool is {self._state}: use it inside `async with rx.SandboxPool(...)`")
            entry = self._entries.get(key)
            if entry is not None and entry.sandbox is not None and entry.sandbox.closed:
                self._counts["replaced"] += 1
                self._retire(entry)
                entry = None
            if entry is None:
                entry = self._entries[key] = _Entry(key, self._clock())
                self._spawn(self._open, entry, name=f"SandboxPool opening {key!r}")
            else:
                self._counts["reused"] += 1
            entry.users += 1  # before trimming: this entry is never the victim
            self._trim()
            try:
                await entry.ready.wait()
            except BaseException:
                self._release(entry)
                raise
            if entry.error is not None:
                entry.users -= 1  # the failed entry has left the pool already
                raise entry.error
            if not entry.retired:
                return entry
            self._release(entry)  # discarded while we waited: open a fresh one

    def _release(self, entry: _Entry, *, trim: bool = True) -> None:
        entry.users -= 1
        entry.last_used = self._clock()
        if self._entries.get(entry.key) is entry:
            self._entries.move_to_end(entry.key)
        if entry.users or entry.sandbox is None or self._state != "open":
            return
        if entry.retired:
            self._lingering.discard(entry)
            self._close_later(entry.sandbox)
            return
        self._now_idle(entry)
        if trim:
            self._trim()

    def _trim(self) -> None:
        """Evict least recently used idle sandboxes while the pool is over ``max_size``."""
        excess = len(self._entries) - self.max_size
        for entry in list(self._entries.values()):
            if excess <= 0:
                break
            if not entry.users and entry.sandbox is not None:
                self._counts["evicted"] += 1
                self._retire(entry)
                excess -= 1

    def _retire(self, entry: _Entry) -> None:
        """Take ``entry`` out of the pool; close its sandbox now if unused, else when its use ends."""
        entry.retired = True
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        if entry.sandbox is None:
            entry.scope.cancel()
        elif entry.users:
            self._lingering.add(entry)
        else:
            self._close_later(entry.sandbox)

    def _close_later(self, sb: AsyncSandbox) -> None:
        if self._state == "open" and not sb.closed:
            self._spawn(self._close_logged, sb, name=f"SandboxPool closing {sb.url}")

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: object, name: str) -> None:
        assert self._tg is not None
        self._busy += 1
        self._tg.start_soon(self._counted, fn, args, name=name)

    async def _counted(self, fn: Callable[..., Awaitable[None]], args: tuple[object, ...]) -> None:
        try:
            await fn(*args)
        finally:
            self._busy -= 1
            if not self._busy and self._drained is not None:
                self._drained.set()

    @staticmethod
    async def _close_logged(sb: AsyncSandbox) -> None:
        try:
            await sb.aclose()
        except Exception:  # nobody waits for a background close: report it, keep the pool going
            log.warning("closing pooled sandbox %s failed", sb.url, exc_info=True)

    async def _open(self, entry: _Entry) -> None:
        """Open ``entry``'s sandbox (a task of the pool, so a waiter's cancellation spares it)."""
        sb: AsyncSandbox | None = None
        try:
            with entry.scope:
                sb = await self._make(entry.key)
        except Exception as exc:
            entry.error = exc
            self._counts["failed"] += 1
        if entry.error is None and (sb is None or entry.retired):  # cancelled by discard or aclose
            entry.error = (
                RuntimeError(f"the pool closed while opening the sandbox for {entry.key!r}")
                if self._state != "open"
                else SandboxError(f"the sandbox for {entry.key!r} was discarded while being opened")
            )
        if entry.error is None:
            entry.sandbox, entry.last_used = sb, self._clock()
            self._counts["opened"] += 1
        elif self._entries.get(entry.key) is entry:
            del self._entries[entry.key]  # a failure is not cached: the next get tries again
        entry.ready.set()
        if entry.sandbox is None:
            if sb is not None:
                await self._close_logged(sb)
        elif not entry.users:  # every waiter was cancelled: the sandbox idles in the pool
            self._now_idle(entry)
            self._trim()

    async def _make(self, key: str) -> AsyncSandbox:
        made = self._source if isinstance(self._source, str) else self._source(key)
        if isinstance(made, str):
            return await open_sandbox(made)
        sb = await made
        if not isinstance(sb, AsyncSandbox):
            raise TypeError(f"the pool's factory returned {type(sb).__name__}, not an AsyncSandbox")
        if sb.closed:
            raise SandboxError(f"the pool's factory returned a closed sandbox for {key!r}")
        return await sb.__aenter__()  # opens it unless already open

    def _now_idle(self, entry: _Entry) -> None:
        """``entry`` just became idle: wake the reaper if this is now the earliest deadline."""
        if self.idle_ttl is not None and self._wake is not None and entry.last_used + self.idle_ttl < self._reap_at:
            self._wake.set()

    def expire_idle(self) -> int:
        """Close every sandbox unused for ``idle_ttl`` seconds by the pool's clock; return how many.

        The pool does this itself at each idle deadline; call it after advancing an injected
        ``clock``. Leased sandboxes are spared. The sandboxes close in the background (their
        ``closed`` turns true soon after). Without ``idle_ttl`` it does nothing.
        """
        if self.idle_ttl is None or self._state != "open":
            return 0
        now, expired = self._clock(), 0
        self._reap_at = math.inf
        for entry in list(self._entries.values()):
            if entry.users or entry.sandbox is None:
                continue
            if entry.last_used + self.idle_ttl <= now:
                expired += 1
                self._counts["expired"] += 1
                self._retire(entry)
            else:
                self._reap_at = min(self._reap_at, entry.last_used + self.idle_ttl)
        return expired

    async def _reap(self) -> None:
        """Expire idle sandboxes at each deadline; sleep until the next one in between."""
        while self._state == "open":
            self.expire_idle()
            self._wake = anyio.Event()
            with anyio.move_on_after(self._reap_at - self._clock()):
                await self._wake.wait()
