"""``ProgressBar``: a ``tqdm`` bar over the bytes a copy moves."""

from __future__ import annotations

import asyncio
import importlib
import sys

__all__ = ["ProgressBar", "progress_bar"]


async def progress_bar(total: int, desc: str, enabled: bool) -> ProgressBar:
    """A :class:`ProgressBar`, with tqdm imported in a worker thread the first time: an import
    reads files, and the event loop must not wait on them. Cancelling abandons the import, which
    completes in its thread."""
    if enabled and total > 0 and "tqdm.auto" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "tqdm.auto")
    return ProgressBar(total, desc, enabled)


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
