"""The keeper's names and numbers that its clients share (the agent's :mod:`..keeperlink`)."""

from __future__ import annotations

__all__ = ["HANDOVER_EXIT", "KEEPER_PROTOCOL", "KEEPER_SOCKET", "MAX_LINE"]

KEEPER_PROTOCOL = 2
KEEPER_SOCKET = "keeper.sock"
HANDOVER_EXIT = 75  # EX_TEMPFAIL: "I left on purpose, my jobs stay"
MAX_LINE = 1 << 20  # bytes of one request line (a longer one ends its connection)
