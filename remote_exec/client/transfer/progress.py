"""``ProgressBar``: a ``tqdm`` bar over the bytes a copy moves."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["ProgressBar", "progress_bar"]


async def progress_bar(total: int, desc: str, enabled: bool) -> ProgressBar:
    """A :class:`ProgressBar`, with tqdm made ready in a worker thread the first time: its import
    reads files, and its first bar makes a multiprocessing lock (another import, a semaphore),
    and the event loop must not wait on them. Cancelling abandons the preparation, which
    completes in its thread."""
    if enabled and total > 0 and not _ready.is_set():
        await asyncio.to_thread(_prepare)
    return ProgressBar(total, desc, enabled)


_ready = threading.Event()  # tqdm imported and its lock made, in this process


def _prepare() -> None:
    from tqdm.auto import tqdm

    tqdm.get_lock()  # type: ignore[no-untyped-call]  # made on the first call: here, not on the loop
    _ready.set()


class ProgressBar:
    """A tqdm bar over bytes (``tqdm.auto``: a widget in Jupyter), or nothing."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar = None
        if enabled and total > 0:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=True)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
