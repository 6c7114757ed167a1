"""Port forwarding into sandboxes without any network: a ``jail://`` box and a ``docker+image://``
container (``network=none``, no Python: the injected agent bundle does the forwarding).

The servers there are reachable from the host only through the agent's channel.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

import aiohttp
import anyio
import pytest

import remote_exec as rx

from ..portserver import SandboxServer, fetch_sha256
from .backend_docker import docker_or_skip, image_or_skip
from .backend_jail import require_jail

pytestmark = pytest.mark.anyio

SIZE = 16 * 1024 * 1024


async def host_refuses(port: int) -> bool:
    """True when nothing on the host's own loopback answers on ``port``."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def test_forward_into_a_jail_without_network(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    require_jail(tmp_path / "probe")
    blob = os.urandom(SIZE)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "blob").write_bytes(blob)
    async with rx.open_sandbox(f"jail://?work={tmp_path / 'work'}") as sb:
        argv = [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", "/workspace"]
        server = await SandboxServer.start(sb, argv)
        assert await host_refuses(server.port)  # the box's loopback is its own
        async with sb.forward_port(server.port) as fwd:
            assert await fetch_sha256(f"{fwd}/blob") == (SIZE, hashlib.sha256(blob).hexdigest())
            echo = await SandboxServer.python(sb, "echo")
            async with sb.forward_port(echo.port) as to_echo:
                reader, writer = await asyncio.open_connection(*to_echo.address)
                writer.write(b"ping")
                writer.write_eof()
                with anyio.fail_after(10):
                    assert await reader.read() == b"ping"
                writer.close()


async def test_forward_into_a_container_without_network_or_python() -> None:
    engine = docker_or_skip()
    nopy = image_or_skip(engine, "nopy")
    async with rx.open_sandbox(f"docker+image://{nopy}?pull=never") as sb:
        script = f"mkdir /tmp/www && head -c {SIZE} /dev/urandom > /tmp/www/blob && sha256sum /tmp/www/blob"
        made = await sb.run(["sh", "-c", f"{script}; cat /proc/net/dev"])
        digest = str(made.stdout).split()[0]
        links = [line.split(":")[0].strip() for line in str(made.stdout).splitlines()[3:]]
        assert made.success and links == ["lo"], made  # network=none: loopback only
        httpd = sb.exec_remote(["httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/tmp/www"])  # busybox
        async with sb.forward_port(8080) as fwd:
            for attempt in range(50):  # until httpd listens: a refused connect is a reset here
                try:
                    got = await fetch_sha256(f"{fwd}/blob")
                    break
                except aiohttp.ClientConnectionError:
                    if attempt == 49:
                        raise
                    await anyio.sleep(0.1)
            assert got == (SIZE, digest)
        await httpd.kill(grace=0)
