"""The agent's JSON-RPC surface: precise errors for bad input, answers for everything."""

from __future__ import annotations

import json
from pathlib import Path

from remote_exec.protocol import PROTOCOL_VERSION

from .rawhttp import poll_to_end, post, rpc


def test_server_info(agent_sock: Path) -> None:
    info = rpc(agent_sock, "server_info")["result"]
    assert info["protocol_version"] == PROTOCOL_VERSION and info["pid"] > 0 and "long_poll" in info["capabilities"]


def test_parse_error(agent_sock: Path) -> None:
    status, body = post(agent_sock, b'{"jsonrpc": "2.0", "method": ')
    err = json.loads(body)
    assert status == 200 and err["id"] is None and err["error"]["code"] == -32700


def test_invalid_request_shapes(agent_sock: Path) -> None:
    for bad in [b"42", b'"x"', b"[]", b'{"method": "server_info", "id": 1}', b'{"jsonrpc": "2.0", "id": 1}',
                b'{"jsonrpc": "2.0", "id": 1, "method": 5}', b'{"jsonrpc": "2.0", "id": 1.5, "method": "server_info"}',
                b'{"jsonrpc": "2.0", "id": true, "method": "server_info"}',
                b'{"jsonrpc": "2.0", "id": 1, "method": "server_info", "extra": 1}']:  # fmt: skip
        _, body = post(agent_sock, bad)
        assert json.loads(body)["error"]["code"] == -32600, bad


def test_unknown_method_lists_methods(agent_sock: Path) -> None:
    err = rpc(agent_sock, "exec_remote_launch", {})["error"]
    assert err["code"] == -32601 and "exec_remote_start" in err["data"]["methods"]


def test_invalid_params_carry_details(agent_sock: Path) -> None:
    err = rpc(agent_sock, "exec_remote_start", {"command": [], "timeout": -1, "colour": "red"})["error"]
    assert err["code"] == -32602
    locs = {tuple(d["loc"]) for d in err["data"]}
    assert ("colour",) in locs and ("timeout",) in {loc[:1] for loc in locs}
    err = rpc(agent_sock, "exec_remote_poll", ["positional"])["error"]
    assert err["code"] == -32602 and "named" in err["message"]
    err = rpc(agent_sock, "exec_remote_signal", {"job_id": "x-1", "signal": "SIGNOPE"})["error"]
    assert err["code"] == -32602 and "SIGNOPE" in json.dumps(err["data"])


def test_job_errors_name_the_job(agent_sock: Path) -> None:
    job = rpc(agent_sock, "exec_remote_start", {"command": ["true"]})["result"]["job_id"]
    instance = job.rsplit("-", 1)[0]  # the state dir's id: job ids stay valid across agents
    err = rpc(agent_sock, "exec_remote_poll", {"job_id": f"{instance}-99999"})["error"]
    assert err["code"] == -32001 and err["data"]["job_id"] == f"{instance}-99999"
    err = rpc(agent_sock, "exec_remote_kill", {"job_id": "deadbeef-3"})["error"]
    assert err["code"] == -32012 and "deadbeef" in err["message"]


def test_cursor_past_end_is_invalid_params(agent_sock: Path) -> None:
    job = rpc(agent_sock, "exec_remote_start", {"command": ["echo", "hi"]})["result"]["job_id"]
    done = poll_to_end(agent_sock, job)
    assert done["stdout"] == "hi\n" and done["state"] == "completed" and done["exit_code"] == 0
    again = rpc(agent_sock, "exec_remote_poll", {"job_id": job, "stdout_offset": 0})["result"]
    assert again["stdout"] == "hi\n"  # cursors are re-readable: a lost response is just asked again
    err = rpc(agent_sock, "exec_remote_poll", {"job_id": job, "stdout_offset": 4})["error"]
    assert err["code"] == -32602 and "past the end" in err["message"]


def test_batch_and_notifications(agent_sock: Path) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "server_info"},
        {"jsonrpc": "2.0", "method": "server_info"},  # a notification: no answer
        {"jsonrpc": "2.0", "id": "b", "method": "nope"},
    ]
    status, body = post(agent_sock, json.dumps(batch).encode())
    answers = {a["id"]: a for a in json.loads(body)}
    assert status == 200 and set(answers) == {"a", "b"}
    assert "result" in answers["a"] and answers["b"]["error"]["code"] == -32601
    status, body = post(agent_sock, b'{"jsonrpc": "2.0", "method": "server_info"}')
    assert status == 204 and body == b""


def test_lone_surrogate_rejected_not_poisoning(agent_sock: Path) -> None:
    _, body = post(
        agent_sock,
        b'{"jsonrpc":"2.0","id":1,"method":"exec_remote_start","params":{"command":["true"],"label":"\\ud800"}}',
    )
    assert json.loads(body)["error"]["code"] == -32700
    assert "result" in rpc(agent_sock, "exec_remote_list")  # listing still works


def test_idempotent_start(agent_sock: Path) -> None:
    params = {"command": ["sleep", "0"], "idempotency_key": "k-123"}
    first = rpc(agent_sock, "exec_remote_start", params)["result"]
    second = rpc(agent_sock, "exec_remote_start", params)["result"]
    assert first == second


def test_stdin_offsets_make_writes_idempotent(agent_sock: Path) -> None:
    job = rpc(agent_sock, "exec_remote_start", {"command": ["cat"], "stdin_open": True})["result"]["job_id"]
    assert (
        rpc(agent_sock, "exec_remote_write_stdin", {"job_id": job, "data": "abc", "offset": 0})["result"]["written"]
        == 3
    )
    # the same write again (a retry after a lost response) writes nothing; an overlap writes the rest
    assert (
        rpc(agent_sock, "exec_remote_write_stdin", {"job_id": job, "data": "abc", "offset": 0})["result"]["written"]
        == 0
    )
    assert (
        rpc(agent_sock, "exec_remote_write_stdin", {"job_id": job, "data": "cde", "offset": 2})["result"]["written"]
        == 2
    )
    err = rpc(agent_sock, "exec_remote_write_stdin", {"job_id": job, "data": "z", "offset": 99})["error"]
    assert err["code"] == -32003
    rpc(agent_sock, "exec_remote_write_stdin", {"job_id": job, "eof": True})
    assert poll_to_end(agent_sock, job)["stdout"] == "abcde"


def test_concurrent_retries_of_one_start_make_one_job(agent_sock: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    params = {"command": ["sleep", "0.2"], "idempotency_key": "k-concurrent"}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: rpc(agent_sock, "exec_remote_start", params)["result"], range(8)))
    assert len({a["job_id"] for a in answers}) == 1
