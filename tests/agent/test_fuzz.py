"""Hypothesis throws malformed and near-valid JSON-RPC at the real agent: it must always answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remote_exec.protocol import METHODS, Method

from .rawhttp import post, rpc

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = sorted({f for spec in METHODS.values() for f in spec.params.model_fields})
params = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=5)
near_valid = st.fixed_dictionaries(
    {
        "jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", 2]),
        # server_handover makes the agent leave by design (the next connect starts another)
        "method": st.sampled_from(sorted(set(METHODS) - {Method.SERVER_HANDOVER})) | st.text(max_size=15),
    },
    optional={"id": st.integers() | st.text(max_size=5) | st.none() | st.floats(), "params": params | json_values},
)


def check_answer(status: int, body: bytes) -> None:
    assert status in (200, 204)
    if status == 204:
        return
    answer = json.loads(body)
    items = answer if isinstance(answer, list) else [answer]
    for item in items:
        assert item["jsonrpc"] == "2.0"
        assert ("result" in item) != ("error" in item)
        if "error" in item:
            assert isinstance(item["error"]["code"], int) and item["error"]["message"]
            assert item["error"]["code"] != -32603, item  # invalid input is never an internal error


def agent_alive(sock: Path, pid: int) -> None:
    assert rpc(sock, "server_info")["result"]["pid"] == pid


@FUZZ
@given(body=st.binary(max_size=300))
def test_random_bytes(agent_sock: Path, body: bytes) -> None:
    status, answer = post(agent_sock, body)
    check_answer(status, answer)


@FUZZ
@given(msg=json_values)
def test_random_json(agent_sock: Path, msg: Any) -> None:
    check_answer(*post(agent_sock, json.dumps(msg).encode()))


@FUZZ
@given(msg=near_valid | st.lists(near_valid, min_size=1, max_size=3))
def test_near_valid_requests(agent_sock: Path, msg: Any) -> None:
    for m in msg if isinstance(msg, list) else [msg]:
        if m.get("method") == "exec_remote_start" and isinstance(m.get("params"), dict) and "command" in m["params"]:
            m["params"]["command"] = ["true"]  # fuzz the options, never run random text as a command
    check_answer(*post(agent_sock, json.dumps(msg).encode()))


def test_agent_survived_the_fuzzing(agent_sock: Path) -> None:
    pid = rpc(agent_sock, "server_info")["result"]["pid"]
    for body in [
        b"\xff\xfe\x00",
        b"{" * 100000,
        b'{"jsonrpc":"2.0","id":1,"method":"exec_remote_poll","params":{"job_id":"' + b"x" * 500 + b'"}}',
    ]:
        check_answer(*post(agent_sock, body))
    agent_alive(agent_sock, pid)
