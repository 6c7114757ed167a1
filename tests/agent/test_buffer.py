"""StreamBuffer and the UTF-8 cut rule, byte by byte."""

from __future__ import annotations

import base64
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remote_exec.agent.buffer import StreamBuffer, utf8_safe_end


@pytest.mark.parametrize(
    ("data", "final", "expected"),
    [
        (b"abc", False, 3),
        ("é".encode()[:1], False, 0),
        ("aé".encode()[:2], False, 1),
        ("a€".encode()[:3], False, 1),
        ("a😀".encode()[:4], False, 1),
        ("a😀".encode(), False, 5),
        ("a😀".encode()[:4], True, 4),
        (b"a\xff", False, 2),  # invalid byte: not held back
        (b"a\x80\x80\x80", False, 4),  # stray continuation bytes: not held back
    ],
)
def test_utf8_safe_end(data: bytes, final: bool, expected: int) -> None:
    assert utf8_safe_end(data, final) == expected


@given(text=st.text(), cuts=st.lists(st.integers(min_value=1, max_value=7), max_size=50))
def test_text_reads_reassemble_exactly(text: str, cuts: list[int]) -> None:
    """However the bytes arrive and however small the reads, the text comes back intact."""
    raw = text.encode()
    buf = StreamBuffer(limit=1 << 20)
    pos, offset, out = 0, 0, list[str]()
    for n in [*cuts, len(raw)]:
        buf.append(raw[pos : pos + n])
        pos += n
        if pos >= len(raw):
            buf.eof = True
        piece = buf.read(offset, 1024, "utf-8")
        out.append(cast(str, piece.data))  # text: read with an encoding
        offset = piece.end
        if buf.eof:
            break
    out.append(cast(str, buf.read(offset, 1 << 20, "utf-8").data))
    assert "".join(out) == text


def test_limit_drops_oldest_and_reports() -> None:
    buf = StreamBuffer(limit=10)
    buf.append(b"0123456789abcdef")
    assert (buf.base, buf.end) == (6, 16)
    piece = buf.read(0, 100, "utf-8")
    assert (piece.data, piece.dropped, piece.start, piece.end) == ("6789abcdef", 6, 6, 16)
    assert buf.read(8, 100, "base64").data == base64.b64encode(b"89abcdef").decode()
    with pytest.raises(ValueError, match="past the end"):
        buf.read(17, 100, "utf-8")


def test_back_pressure_threshold_and_keep_unread() -> None:
    buf = StreamBuffer(limit=100)
    buf.append(b"x" * 49)
    assert not buf.wants_pause()
    buf.append(b"x")
    assert buf.wants_pause()  # half the buffer unread
    buf.read(0, 1024, "utf-8")  # a reader caught up
    assert not buf.wants_pause()
    buf.append(b"y" * 120, keep_unread=True)  # a late chunk while pausing: unread bytes stay
    assert (buf.base, buf.end) == (50, 170) and buf.read(50, 1024, "utf-8").data == "y" * 120
