"""``BlockingSandboxPool``: the blocking twin of :class:`~remote_exec.SandboxPool`.

For threaded apps (a Flask or Gradio worker per request, Streamlit's script threads) and plain
notebook cells. The pool itself is ONE :class:`~remote_exec.SandboxPool` running on the blocking
API's shared event-loop thread, so everything it promises holds across threads: concurrent
requests for one key, from any threads, share one opening; eviction, expiry and closing work
as there.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal

from ..client.sandbox import AsyncSandbox
from ..pool import PoolStats, SandboxFactory, SandboxPool
from .sandbox import Sandbox, borrowing, lease_portal, release_portal

__all__ = ["BlockingSandboxPool"]

T = TypeVar("T")


class BlockingSandboxPool:
    """Sandboxes keyed by a session key, for blocking code: ``with rx.BlockingSandboxPool(url) as pool``.

    ``pool.get(key)`` returns the key's sandbox as a blocking :class:`~remote_exec.Sandbox`,
    opening it on first use (the same object for as long as that sandbox lives);
    ``with pool.lease(key) as sb`` pins it for the block. Safe to use from any number of
    threads at once. The pool owns its sandboxes: leaving the ``with`` block (or
    :meth:`close`) closes them all; closing one yourself makes the next ``get`` open a new one.
    Parameters and behaviour are those of :class:`~remote_exec.SandboxPool`.

    A call blocks its thread until done; a thread blocked in ``get`` while the key's sandbox
    opens cannot be interrupted except by the opening ending (it fails or succeeds).
    """

    def __init__(self, sandboxes: str | SandboxFactory, *, max_size: int = 16, idle_ttl: float | None = None) -> None:
        self.async_pool = SandboxPool(sandboxes, max_size=max_size, idle_ttl=idle_ttl)
        self._portal: BlockingPortal | None = None
        self._context: contextlib.AbstractContextManager[SandboxPool] | None = None
        self._faces: weakref.WeakKeyDictionary[AsyncSandbox, Sandbox] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- lifetime ---------------------------------------------------------------------------

    def __enter__(self) -> BlockingSandboxPool:
        if self._portal is not None:
            raise RuntimeError("this pool was opened already; make a new one")
        self._portal = lease_portal()
        try:
            # The pool's task group lives in one task of the loop thread, from enter to exit.
            self._context = self._portal.wrap_async_context_manager(self.async_pool)
            self._context.__enter__()
        except BaseException:
            self._context = None
            release_portal()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every sandbox of the pool (see :meth:`SandboxPool.aclose`); idempotent."""
        context, self._context = self._context, None
        if context is None:
            return
        try:
            context.__exit__(None, None, None)
        finally:
            release_portal()

    # -- using it ---------------------------------------------------------------------------

    def get(self, key: str) -> Sandbox:
        """The sandbox for ``key``, opened now if the pool has none (see :meth:`SandboxPool.get`).

        :raises RuntimeError: the pool is not open (use ``with``).
        :raises RemoteExecError: opening failed, or whatever a factory raised.
        """
        return self._face(self._call(self.async_pool.get, key))

    @contextlib.contextmanager
    def lease(self, key: str) -> Iterator[Sandbox]:
        """``with pool.lease(key) as sb``: :meth:`get`, with the sandbox pinned for the block."""
        with self._open_portal().wrap_async_context_manager(self.async_pool.lease(key)) as sandbox:
            yield self._face(sandbox)

    def discard(self, key: str) -> bool:
        """Take ``key``'s sandbox out of the pool and close it (see :meth:`SandboxPool.discard`)."""
        return self._call(self.async_pool.discard, key)

    def keys(self) -> list[str]:
        """The keys in the pool, least recently used first."""
        return self._call_sync(self.async_pool.keys)

    def __len__(self) -> int:
        return self._call_sync(self.async_pool.__len__)

    def __contains__(self, key: object) -> bool:
        return self._call_sync(self.async_pool.__contains__, key)

    @property
    def stats(self) -> PoolStats:
        """The pool's size and counters, as of now."""
        return self._call_sync(lambda: self.async_pool.stats)

    def __repr__(self) -> str:
        return repr(self.async_pool).replace("<SandboxPool", "<BlockingSandboxPool", 1)

    # -- internals ---------------------------------------------------------------------------

    def _open_portal(self) -> BlockingPortal:
        if self._portal is None or self._context is None:
            raise RuntimeError("the pool is not open: use it inside `with rx.BlockingSandboxPool(...)`")
        return self._portal

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self._open_portal().call(fn, *args)

    def _call_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """A synchronous read of the pool's state, run on its loop thread (never torn by a change)."""
        if self._portal is None or self._context is None:
            return fn(*args)  # nothing runs on the pool any more: read it here
        return self._portal.call(fn, *args)

    def _face(self, sandbox: AsyncSandbox) -> Sandbox:
        """The one blocking face of a pooled sandbox."""
        with self._lock:
            face = self._faces.get(sandbox)
            if face is None:
                face = self._faces[sandbox] = borrowing(sandbox, self._open_portal())
            return face
