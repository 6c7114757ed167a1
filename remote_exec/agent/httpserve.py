"""The agent's HTTP endpoint: ``POST /rpc`` on its Unix socket ``agent.sock``, one JSON-RPC
request per HTTP request (the stateless CLI's ``remote-exec-agent call``, the seed design's
HTTP API). Imported by :mod:`.lazyhttp` only once a client sends a request: aiohttp is the agent's
heaviest import.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ..errors import RemoteExecError
from ..protocol import frames
from .intake import Intake, LineTooLong, read_body
from .rpc import error_answer

__all__ = ["http_runner"]


async def http_runner(
    handle_body: Callable[[bytes], Awaitable[bytes | None]],
    intake: Intake,
    max_request: int,
    shutdown_timeout: float,
) -> web.AppRunner:
    """A runner set up to serve ``POST /rpc`` (its ``server`` makes a protocol per connection:
    see :mod:`.lazyhttp`), each body read within ``intake``'s budget and answered by
    ``handle_body``, until its cleanup, which gives requests in flight ``shutdown_timeout``
    seconds (one waiting on a stuck worker thread is then abandoned rather than holding the
    agent up)."""

    async def rpc(request: web.Request) -> web.Response:
        try:
            body, held = await read_body(request.content, request.content_length, intake, max_request)
        except LineTooLong as exc:
            return web.Response(
                status=413, body=error_answer(RemoteExecError(str(exc))), content_type="application/json"
            )
        except RemoteExecError as exc:  # over the memory budget
            return web.Response(status=503, body=error_answer(exc), content_type="application/json")
        intake.handled(held)
        try:
            answer = await handle_body(body)
        finally:
            del body
            intake.answered(held)
        if answer is None:
            return web.Response(status=204)
        framed = answer.startswith(frames.MARK)  # a result with a binary payload
        return web.Response(body=answer, content_type="application/octet-stream" if framed else "application/json")

    http = web.Application(client_max_size=max_request)
    http.router.add_post("/rpc", rpc)
    runner = web.AppRunner(http, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    return runner
