"""Malformed and oversized input on the agent's frame stream (hypothesis): it answers or closes
that one connection with a reason, never crashes, never answers an internal error, and keeps
serving everyone else."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remote_exec as rx
from remote_exec.protocol import METHODS, STREAM_SOCKET, Method

from .conftest import Adversary

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PROBE_ID = 987_654_321
DEADLINE = 10.0


@pytest.fixture(scope="module")
def stream_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    state = tmp_path_factory.mktemp("adv-agent") / "state"
    with rx.connect(f"local://?dir={state}") as sb:
        pid = sb.info.pid
    yield state / STREAM_SOCKET, pid
    from ..conftest import stop_agent

    stop_agent(state)


def _exchange(sock_path: Path, data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """Send ``data`` then a ``server_info`` probe on one connection; return the answers read
    until the probe's, and whether the probe was answered (False: the agent closed the
    connection, which it may do only after an error answer)."""
    probe = json.dumps({"jsonrpc": "2.0", "id": PROBE_ID, "method": "server_info"}).encode()
    answers: list[dict[str, Any]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(DEADLINE)
        s.connect(str(sock_path))
        s.sendall(data + b"\n" + probe + b"\n")
        buf = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return answers, False
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.startswith(b"\x00"):  # a payload header: skip the payload, keep its JSON
                    n = int(line[1:])
                    while len(buf) < n + 1 or b"\n" not in buf[n:]:
                        more = s.recv(1 << 16)
                        assert more, "EOF inside an answer's payload"
                        buf += more
                    line, buf = buf[n:].split(b"\n", 1)
                answer = json.loads(line)
                answers.append(answer)
                if answer.get("id") == PROBE_ID:
                    return answers, True


def _check(answers: list[dict[str, Any]], probed: bool) -> None:
    for answer in answers:
        assert answer["jsonrpc"] == "2.0"
        assert ("result" in answer) != ("error" in answer)
        if "error" in answer:
            assert answer["error"]["code"] != -32603, answer  # bad input is never an internal error
    if not probed:  # the connection was ended: only after saying why
        assert any("error" in a for a in answers), answers


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
FIELDS = sorted({f for spec in METHODS.values() for f in spec.params.model_fields})
# Paths and names an attacker would try wherever a path is accepted.
hostile_text = st.sampled_from(
    ["../../etc/passwd", "/etc/shadow", "a\x00b", "/dev/zero", "/dev/tty", "/proc/self/mem", "", "x" * 5000]
)
params = st.dictionaries(st.sampled_from(FIELDS), json_values | hostile_text, max_size=5)
requests = st.fixed_dictionaries(
    # server_handover makes the agent leave by design (its keeper waits for the next one)
    {
        "jsonrpc": st.just("2.0"),
        "method": st.sampled_from(sorted(set(METHODS) - {Method.SERVER_HANDOVER})),
        "id": st.integers(0, 10**6),
    },
    optional={"params": params},
)
bad_headers = st.sampled_from(
    [b"\x00", b"\x00abc", b"\x00-1", b"\x00" + b"9" * 30, b"\x00" + str(1 << 40).encode(), b"\x001 2", b"\x00\x00"]
)


@FUZZ
@given(body=st.binary(max_size=300).filter(lambda b: b"\n" not in b))
def test_random_lines(stream_agent: tuple[Path, int], adversary: Adversary, body: bytes) -> None:
    answers, probed = _exchange(stream_agent[0], body)
    _check(answers, probed)
    adversary.tried("agent: random frames", repr(body[:40]), refused=True)


@FUZZ
@given(req=requests, payload=st.none() | st.binary(max_size=64))
def test_near_valid_requests_with_hostile_params(
    stream_agent: tuple[Path, int], adversary: Adversary, req: dict[str, Any], payload: bytes | None
) -> None:
    if req["method"] in ("exec_remote_start", "shell_open", "shell_run", "port_connect"):
        req = {**req, "params": {}}  # never actually start processes or connections from fuzz input
    body = json.dumps(req).encode()
    if payload is not None:
        body = b"\x00%d\n" % len(payload) + payload + body
    answers, probed = _exchange(stream_agent[0], body)
    _check(answers, probed)
    adversary.tried("agent: hostile params", f"{req['method']} {str(req.get('params'))[:60]}", refused=True)


@FUZZ
@given(header=bad_headers)
def test_bad_payload_headers_end_only_that_connection(
    stream_agent: tuple[Path, int], adversary: Adversary, header: bytes
) -> None:
    answers, probed = _exchange(stream_agent[0], header)
    assert not probed and answers and "error" in answers[0], answers
    adversary.tried("agent: bad payload headers", repr(header[:40]), refused=True)


def test_agent_alive_and_small_after_fuzzing(stream_agent: tuple[Path, int], adversary: Adversary) -> None:
    answers, probed = _exchange(stream_agent[0], b"")
    assert probed and answers[-1]["result"]["pid"] == stream_agent[1]
    assert adversary.agent_peak(stream_agent[1]) < 200 * 1024  # KiB
