"""A bounded tail of a stream: keeps the last ``limit`` characters (or bytes), counts the rest."""

from __future__ import annotations

from collections import deque

__all__ = ["Tail"]


class Tail:
    """Accumulates chunks, keeping at most ``limit`` units; ``dropped`` counts what was cut."""

    __slots__ = ("_chunks", "_empty", "_size", "dropped", "limit")

    def __init__(self, limit: int, empty: str | bytes = "") -> None:
        self.limit = limit
        self._empty = empty
        self._chunks: deque[str | bytes] = deque()
        self._size = 0
        self.dropped = 0

    def add(self, data: str | bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size > self.limit:
            head = self._chunks[0]
            excess = self._size - self.limit
            if len(head) <= excess:
                self._chunks.popleft()
                self._size -= len(head)
                self.dropped += len(head)
            else:
                self._chunks[0] = head[excess:]
                self._size -= excess
                self.dropped += excess

    def value(self) -> str | bytes:
        if not self._chunks:
            return self._empty
        joined = self._empty.join(self._chunks)  # type: ignore[arg-type]
        self._chunks = deque([joined])
        return joined
