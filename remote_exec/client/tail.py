"""A bounded tail of a stream: keeps the last ``limit`` characters (or bytes), counts the rest."""

from __future__ import annotations

from collections import deque

__all__ = ["Tail"]


class Tail:
    """Accumulates chunks, keeping at most ``limit`` units; ``dropped`` counts what was cut.

    The oldest chunk kept may start before the tail does: it is cut (a copy) only when the value
    is asked for, not at every chunk added — a fast stream past ``limit`` would otherwise copy
    about one chunk more per chunk it brings (another pass over every byte). So it holds up to
    ``limit`` plus one chunk (a push: at most a few MiB).
    """

    __slots__ = ("_chunks", "_empty", "_size", "_skip", "dropped", "limit")

    def __init__(self, limit: int, empty: str | bytes = "") -> None:
        self.limit = limit
        self._empty = empty
        self._chunks: deque[str | bytes] = deque()
        self._size = 0  # of the chunks held, from _skip on
        self._skip = 0  # units of the first chunk that are no longer in the tail
        self.dropped = 0

    def add(self, data: str | bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        excess = self._size - self.limit
        if excess <= 0:
            return
        self._size -= excess
        self.dropped += excess
        self._skip += excess
        while self._chunks and self._skip >= len(self._chunks[0]):
            self._skip -= len(self._chunks.popleft())

    def value(self) -> str | bytes:
        if not self._chunks:
            return self._empty
        if self._skip:
            self._chunks[0] = self._chunks[0][self._skip :]
            self._skip = 0
        joined = self._empty.join(self._chunks)  # type: ignore[arg-type]
        self._chunks = deque([joined])
        return joined
