"""``ProgressBar``: a ``tqdm`` bar over the bytes a copy moves."""

from __future__ import annotations

__all__ = ["ProgressBar"]


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
