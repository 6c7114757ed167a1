"""The bounded tail a handle keeps of each stream: the last ``limit`` units, and a count of the rest."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from remote_exec.client.tail import Tail


@given(st.integers(0, 64), st.lists(st.binary(max_size=40), max_size=30))
def test_a_tail_is_the_last_limit_bytes_and_counts_the_rest(limit: int, chunks: list[bytes]) -> None:
    tail = Tail(limit, b"")
    for i, chunk in enumerate(chunks):
        tail.add(chunk)
        whole = b"".join(chunks[: i + 1])
        kept = whole[max(0, len(whole) - limit) :]
        if i % 3 == 0:  # asked for now and then: a value taken midway changes nothing after it
            assert tail.value() == kept
        assert tail.dropped == len(whole) - len(kept)
    whole = b"".join(chunks)
    assert tail.value() == whole[max(0, len(whole) - limit) :]


@given(st.integers(0, 20), st.lists(st.text(max_size=10), max_size=20))
def test_a_text_tail_keeps_characters(limit: int, chunks: list[str]) -> None:
    tail = Tail(limit)
    for chunk in chunks:
        tail.add(chunk)
    whole = "".join(chunks)
    assert tail.value() == whole[max(0, len(whole) - limit) :]
    assert tail.dropped == len(whole) - len(tail.value())
