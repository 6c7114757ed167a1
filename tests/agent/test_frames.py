"""Binary payload frames: the codec, and the agent's answers to framed (and badly framed) requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remote_exec.protocol import frames

from .rawhttp import post, rpc

ALL_BYTES = bytes(range(256)) * 4 + b"\n\n\x00\xff\xfe" + "é€😀".encode()[:-1]  # invalid UTF-8 at the end


@given(message=st.binary(max_size=64).map(lambda b: b"{" + b.replace(b"\x00", b"") + b"}"), payload=st.binary())
def test_encode_split_round_trip(message: bytes, payload: bytes) -> None:
    got_message, got_payload = frames.split(frames.encode(message, payload))
    assert got_message == message
    assert got_payload is not None and bytes(got_payload) == payload
    assert frames.split(frames.encode(message)) == (message, None)


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (b"\x00abc\n{}", "malformed payload header"),
        (b"\x00\n{}", "malformed payload header"),
        (b"\x00-1\n{}", "malformed payload header"),
        (b"\x0012", "without its newline"),
        (b"\x0010\nabc{}", "10 bytes announced"),
    ],
)
def test_split_rejects_bad_headers(frame: bytes, why: str) -> None:
    with pytest.raises(frames.FrameError, match=why):
        frames.split(frame)


def test_split_enforces_limit() -> None:
    with pytest.raises(frames.FrameError, match="over the 4-byte limit"):
        frames.split(frames.encode(b"{}", b"12345"), limit=4)


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def _frames(data: bytes, limit: int = 1 << 20) -> list[frames.Frame | None]:
    reader = _reader(data)
    out: list[frames.Frame | None] = []
    while True:
        frame = await frames.read_frame(reader, limit)
        out.append(frame)
        if frame is None:
            return out


def test_read_frame_payload_may_hold_newlines() -> None:
    stream = frames.encode(b'{"a":1}', b"line\nline\n\x00") + b"\n" + b'{"b":2}\n' + b"\n"
    got = asyncio.run(_frames(stream))
    assert got[0] == (b'{"a":1}', b"line\nline\n\x00")
    assert got[1:] == [(b'{"b":2}', None), (b"", None), None]  # an empty line is not EOF


def test_read_frame_eof_inside_payload() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(_frames(b"\x0010\nabc"))


def test_read_frame_payload_over_limit() -> None:
    with pytest.raises(frames.FrameError, match="over the 8-byte limit"):
        asyncio.run(_frames(frames.encode(b"{}", b"x" * 9) + b"\n", limit=8))


# -- the agent ---------------------------------------------------------------------------------


def _request(method: str, params: dict[str, Any], payload: bytes | None = None, id_: int = 1) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()
    return frames.encode(body, payload)


def _answer(sock: Path, body: bytes) -> tuple[dict[str, Any], bytes | None]:
    status, raw = post(sock, body)
    assert status == 200, raw
    message, payload = frames.split(raw)
    return json.loads(message), None if payload is None else bytes(payload)


def _binary_poll_to_end(sock: Path, job_id: str) -> tuple[bytes, bytes, dict[str, Any]]:
    out, err, off = b"", b"", (0, 0)
    while True:
        params = {"job_id": job_id, "stdout_offset": off[0], "stderr_offset": off[1], "wait": 10, "binary": True}
        answer, payload = _answer(sock, _request("exec_remote_poll", params))
        res = answer["result"]
        n_out, n_err = res["payload_sizes"]
        assert res["stdout"] == res["stderr"] == ""
        assert payload is not None and len(payload) == n_out + n_err
        out, err = out + payload[:n_out], err + payload[n_out:]
        off = (res["stdout_offset"], res["stderr_offset"])
        if res["state"] != "running":
            return out, err, res


def test_binary_poll_and_payload_stdin_are_byte_exact(agent_sock: Path) -> None:
    for encoding in ("base64", "utf-8"):
        start = {"command": ["sh", "-c", "cat; printf 'e\\377rr' >&2"], "stdin_open": True, "encoding": encoding}
        job_id = rpc(agent_sock, "exec_remote_start", start)["result"]["job_id"]
        answer, _ = _answer(
            agent_sock, _request("exec_remote_write_stdin", {"job_id": job_id, "offset": 0, "eof": True}, ALL_BYTES)
        )
        assert answer["result"] == {"written": len(ALL_BYTES), "stdin_bytes": len(ALL_BYTES)}
        out, err, res = _binary_poll_to_end(agent_sock, job_id)
        # Raw bytes both ways: even a text job's invalid UTF-8 arrives as it was written.
        assert (out, err, res["exit_code"]) == (ALL_BYTES, b"e\xffrr", 0)


def test_binary_text_poll_cuts_on_character_boundaries(agent_sock: Path) -> None:
    # 1 KiB polls over 3-byte characters: a cut mid-character would break the client's decode.
    script = "for i in $(seq 1 200); do printf '€€€€€€€€€€'; done"
    job_id = rpc(agent_sock, "exec_remote_start", {"command": ["bash", "-c", script]})["result"]["job_id"]
    off, pieces = 0, []
    while True:
        params = {"job_id": job_id, "stdout_offset": off, "wait": 10, "binary": True, "max_bytes": 1024}
        answer, payload = _answer(agent_sock, _request("exec_remote_poll", params))
        res = answer["result"]
        pieces.append((payload or b"").decode("utf-8"))  # strict: every piece is whole characters
        off = res["stdout_offset"]
        if res["state"] != "running":
            break
    assert "".join(pieces) == "€" * 2000


def test_payload_to_a_method_without_one_is_invalid_params(agent_sock: Path) -> None:
    answer, payload = _answer(agent_sock, _request("exec_remote_list", {}, b"stray"))
    assert answer["error"]["code"] == -32602 and "takes no payload" in answer["error"]["message"]
    assert payload is None


def test_stdin_as_both_params_and_payload_is_refused(agent_sock: Path) -> None:
    job_id = rpc(agent_sock, "exec_remote_start", {"command": ["cat"], "stdin_open": True})["result"]["job_id"]
    answer, _ = _answer(agent_sock, _request("exec_remote_write_stdin", {"job_id": job_id, "data": "x"}, b"y"))
    assert answer["error"]["code"] == -32602
    rpc(agent_sock, "exec_remote_kill", {"job_id": job_id})


def test_bad_frame_header_is_a_parse_error(agent_sock: Path) -> None:
    answer, _ = _answer(agent_sock, b'\x00zz\n{"jsonrpc":"2.0","id":1,"method":"exec_remote_list"}')
    assert answer["error"]["code"] == -32700 and "frame" in answer["error"]["message"]
    answer, _ = _answer(agent_sock, b"\x00999\nshort")
    assert answer["error"]["code"] == -32700 and "999 bytes announced" in answer["error"]["message"]


def test_batches_carry_no_payloads(agent_sock: Path) -> None:
    listing = {"jsonrpc": "2.0", "id": 1, "method": "exec_remote_list", "params": {}}
    answer, _ = _answer(agent_sock, frames.encode(json.dumps([listing]).encode(), b"x"))
    assert answer["error"]["code"] == -32600 and "batch" in answer["error"]["message"]
    job_id = rpc(agent_sock, "exec_remote_start", {"command": ["echo", "hi"]})["result"]["job_id"]
    poll = {"job_id": job_id, "wait": 5, "binary": True}
    batch = [listing, {"jsonrpc": "2.0", "id": 2, "method": "exec_remote_poll", "params": poll}]
    status, raw = post(agent_sock, json.dumps(batch).encode())
    answers = {a["id"]: a for a in json.loads(raw)}
    assert status == 200 and "result" in answers[1]
    assert answers[2]["error"]["code"] == -32600 and "cannot be batched" in answers[2]["error"]["message"]


def test_frame_stream_socket_answers_out_of_order_and_closes_after_eof(agent_sock: Path) -> None:
    """The frame stream: many requests in flight, answers by completion, EOF ends it cleanly."""
    import socket

    job_id = rpc(agent_sock, "exec_remote_start", {"command": ["sh", "-c", "sleep 0.3; echo late"]})["result"]["job_id"]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(agent_sock.parent / "agent.stream"))
    long_poll = {"job_id": job_id, "wait": 10, "binary": True}
    conn.sendall(_request("exec_remote_poll", long_poll, id_=1) + b"\n" + _request("server_info", {}, id_=2) + b"\n")
    conn.sendall(b"\n")  # blank lines are skipped
    conn.shutdown(socket.SHUT_WR)  # EOF: answers still due must come before the server closes
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.close()

    async def parse() -> list[frames.Frame | None]:
        return await _frames(data)

    got = [f for f in asyncio.run(parse()) if f]
    ids = [json.loads(f.message)["id"] for f in got]
    assert ids == [2, 1]  # server_info did not wait behind the long poll
    assert got[1].payload == b"late\n"


def test_frame_stream_bad_header_ends_the_connection_with_an_answer(agent_sock: Path) -> None:
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(agent_sock.parent / "agent.stream"))
    with conn:
        conn.sendall(b"\x00nope\n{}\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    answer = json.loads(data)
    assert answer["error"]["code"] == -32000 and "bad request frame" in answer["error"]["message"]


def test_small_answers_overtake_queued_big_ones() -> None:
    """A ``kill`` answer must not wait behind a queue of 4 MiB poll answers (one at most)."""
    import socket

    from remote_exec.agent.stream import _Outbox

    async def scenario() -> list[bytes]:
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)  # the first big answer blocks
        _, writer = await asyncio.open_connection(sock=ours)
        outbox = _Outbox(writer)
        big = [bytes([65 + i]) * (1 << 20) for i in range(3)]
        sends = [asyncio.create_task(outbox.send(b)) for b in big]
        await asyncio.sleep(0)  # one loop turn: the three sends run up to their first wait
        assert outbox._pumping and len(outbox._big) == 2  # A is on its way, B and C queued
        sends.append(asyncio.create_task(outbox.send(b"small")))
        reader, peer = await asyncio.open_connection(sock=theirs, limit=4 << 20)
        lines = [(await reader.readline()).rstrip(b"\n") for _ in range(4)]
        await asyncio.gather(*sends)
        writer.close()
        peer.close()
        return lines

    lines = asyncio.run(scenario())
    assert [line[:5] for line in lines] == [b"A" * 5, b"small", b"B" * 5, b"C" * 5]


def test_the_loop_turns_between_answers_a_socket_takes_at_once() -> None:
    """Answers the socket takes whole still leave the loop a turn between each (where the
    connection's next requests are read): a pump that never yields starves its own reader."""
    import socket

    from remote_exec.agent.stream import _Outbox

    async def scenario() -> set[int]:
        ours, theirs = socket.socketpair()
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        _, writer = await asyncio.open_connection(sock=ours)
        outbox = _Outbox(writer)
        sends = [asyncio.create_task(outbox.send(bytes([65 + i]) * (100 << 10))) for i in range(4)]
        seen: set[int] = set()
        while not all(s.done() for s in sends):  # what another task sees, turn by turn
            seen.add(sum(s.done() for s in sends))
            await asyncio.sleep(0)
        writer.close()
        theirs.close()
        return seen

    assert {1, 2, 3} & asyncio.run(scenario())
