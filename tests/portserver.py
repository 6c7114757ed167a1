"""TCP servers started *inside* a sandbox for the port-forwarding tests, and host-side clients.

:data:`SERVER` is a small asyncio server run with the sandbox's Python (``python -c``); it binds
``127.0.0.1:0`` and prints ``port N`` first, then one line per connection event, so a test
reads both the port and what the server saw from the job's stdout.

- ``echo``: echoes until the client's EOF, then prints ``eof after N bytes`` and closes
  (``reset after N bytes`` when the connection is reset).
- ``bye``: sends ``bye\\n`` and closes at once.
- ``flood N``: sends :func:`pattern` of N bytes, then closes.
"""

from __future__ import annotations

import hashlib
import random
import re
import sys

import aiohttp
import anyio

import remote_exec as rx

__all__ = ["SERVER", "SandboxServer", "fetch_sha256", "pattern"]

SERVER = r"""
import asyncio, random, sys

async def main(mode, arg):
    async def handle(reader, writer):
        n = 0
        try:
            if mode == "echo":
                while data := await reader.read(65536):
                    n += len(data)
                    writer.write(data)
                    await writer.drain()
                print(f"eof after {n} bytes", flush=True)
            elif mode == "bye":
                writer.write(b"bye\n")
            elif mode == "flood":
                writer.write(random.Random(int(arg)).randbytes(int(arg)))
                await writer.drain()
                print("flooded", flush=True)
            writer.close()
            await writer.wait_closed()
        except ConnectionError:
            print(f"reset after {n} bytes", flush=True)
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print("port", server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "0"))
"""


def pattern(n: int) -> bytes:
    """The ``flood n`` server's bytes (seeded with ``n``)."""
    return random.Random(n).randbytes(n)


class SandboxServer:
    """A server job in the sandbox whose stdout is read line by line.

    :ivar port: the port it listens on inside the sandbox (``port N`` or ``... port N ...``).
    """

    def __init__(self, proc: rx.ExecRemoteProcess) -> None:
        self.proc = proc
        self.port = 0
        self.output = ""

    @classmethod
    async def start(
        cls, sb: rx.AsyncSandbox | rx.ExecRemoteProcess, argv: list[str] | None = None, timeout: float = 30.0
    ) -> SandboxServer:
        """Start ``argv`` (or take a started job) and wait for it to print the port it listens on."""
        server = cls(sb if isinstance(sb, rx.ExecRemoteProcess) else sb.exec_remote(argv or []))
        match = await server.wait_for(r"\bport (\d+)", timeout)
        server.port = int(match.group(1))
        return server

    @classmethod
    async def python(
        cls, sb: rx.AsyncSandbox, mode: str, arg: str = "0", python: str = sys.executable
    ) -> SandboxServer:
        """:data:`SERVER` in ``mode``, run by the sandbox's ``python``."""
        return await cls.start(sb, [python, "-u", "-c", SERVER, mode, arg])

    async def wait_for(self, regex: str, timeout: float = 10.0) -> re.Match[str]:
        """Read the server's output until ``regex`` matches in it (searching everything read)."""
        with anyio.fail_after(timeout):
            while (match := re.search(regex, self.output)) is None:
                ev = await self.proc.__anext__()
                if isinstance(ev, rx.StdoutChunk | rx.StderrChunk):
                    self.output += str(ev.data)
                elif isinstance(ev, rx.Completed):
                    raise AssertionError(f"the server exited ({ev.exit_code}): {self.output}")
        return match

    async def stop(self) -> None:
        await self.proc.kill(grace=0)


async def fetch_sha256(url: str) -> tuple[int, str]:
    """GET ``url`` through a fresh client session: the body's size and SHA-256."""
    digest = hashlib.sha256()
    size = 0
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_chunked(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
