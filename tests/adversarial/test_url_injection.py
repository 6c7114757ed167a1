"""A pool key cannot choose another sandbox (issue #12, point 7).

A key is whatever the app's users send. Pasted into a URL (``f"local://?dir=/srv/agents/{key}"``)
a key ``x&dir=/elsewhere`` added a second ``dir=`` (and the last one won), and ``x#...`` cut the
URL short at its fragment. Now every transport refuses a repeated single-valued option and any
``#``, and ``rx.sandbox_url`` builds the URL from quoted parts so a key stays inside its value.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import remote_exec as rx
from remote_exec.sandboxes import transport_for
from remote_exec.sandboxes.jail import JailTransport
from remote_exec.sandboxes.local import LocalTransport
from remote_exec.sandboxes.ssh import SSHTransport

from .conftest import Adversary

KEYS = {
    "ampersand": "x&dir={other}",
    "fragment": "x#",
    "question-mark": "x?dir={other}",
    "percent-26": "x%26dir={other}",
    "plus-and-space": "x+ y",
}


@pytest.fixture
def root() -> Iterator[Path]:
    # Short: an agent's socket path must fit in 108 bytes, and keys make it longer.
    d = Path(tempfile.mkdtemp(prefix="rx-keys-"))
    yield d
    for sock in _started_agents(d):  # keys holding "/" made nested dirs
        state = sock.parent
        url = f"local://?dir={quote(os.fspath(state), safe='/')}"  # (no sandbox_url: works on old code too)
        with contextlib.suppress(rx.RemoteExecError, OSError), rx.connect(url) as sb:
            os.kill(sb.info.pid, signal.SIGTERM)
    shutil.rmtree(d, ignore_errors=True)


def _started_agents(root: Path) -> list[Path]:
    """Every agent socket under ``root``, found before anything is done to them: a lazy walk
    while agents run (and while the teardown connects to them) met a job dir an agent was
    replacing (its ``jobs.spare``, remade after each start) and failed with FileNotFoundError.
    ``os.walk`` skips a dir that went away; a state dir's own dirs are not walked into."""
    found = []
    for top, dirs, files in os.walk(root):
        if "agent.sock" in files:
            found.append(Path(top) / "agent.sock")
            dirs[:] = [d for d in dirs if not d.startswith(("jobs", "shells", "trash"))]
    return found


@pytest.mark.anyio
async def test_pool_keys_in_sandbox_url_keep_their_own_dir(root: Path, adversary: Adversary) -> None:
    keys = {case: key.format(other=root / "other") for case, key in KEYS.items()}
    async with rx.SandboxPool(lambda key: rx.sandbox_url("local", dir=root / key)) as pool:
        for case, key in keys.items():
            sb = await pool.get(key)
            assert isinstance(sb.transport, LocalTransport)
            refused = sb.transport.state_dir == root / key and (root / key / "agent.sock").exists()
            adversary.tried("url injection", f"pool key via sandbox_url: {case}", refused=refused)
            assert refused, (key, sb.transport.state_dir)
    assert not (root / "other").exists()  # no key opened the other dir


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("case", "key", "error"),
    [
        ("ampersand", "x&dir={root}/victim", "given more than once"),
        ("fragment", "victim#x", "no #fragment"),  # would have opened .../victim, another key's dir
    ],
    ids=["ampersand", "fragment"],
)
async def test_pool_keys_pasted_into_a_url_are_refused(
    root: Path, adversary: Adversary, case: str, key: str, error: str
) -> None:
    # The README's old pattern: each attack now fails with a precise error instead of opening
    # the dir of the key "victim".
    key = key.format(root=root)
    async with rx.SandboxPool(lambda k: f"local://?dir={root}/{k}") as pool:
        with pytest.raises(rx.SandboxError, match=error) as caught:
            await pool.get(key)
    refused = caught.value is not None and not _started_agents(root) and not (root / "victim").exists()
    adversary.tried("url injection", f"pool key pasted into an f-string URL: {case}", refused=refused)
    assert refused


REPEATS = [
    "local://?dir=/a&dir=/b",
    "local://?channel=socket&dir=/a&channel=stdio",
    "ssh://h?dir=/a&dir=/b",
    "ssh://h?python=python3&python=/tmp/evil",
    "jail://?work=/a&work=/b",
    "jail://?net=none&net=host",
    "docker://c?dir=/a&dir=/b",
    "podman://c?user=a&user=root",
    "docker+image://img?network=none&network=host",
    "k8s://ns/pod?dir=/a&dir=/b",
]


@pytest.mark.parametrize("url", REPEATS)
def test_every_transport_refuses_a_repeated_option(url: str, adversary: Adversary) -> None:
    with pytest.raises(rx.SandboxError, match=r"option\(s\) \['\w+'\] given more than once") as caught:
        transport_for(url)
    adversary.tried("url injection", f"repeated option: {url}", refused=caught.value is not None)


@pytest.mark.parametrize(
    "url",
    ["local://?dir=/srv/a#b", "ssh://h?dir=/a#x", "jail://?work=/a#", "docker://c?dir=/a#b", "k8s://ns/pod#x"],
)
def test_every_transport_refuses_a_fragment(url: str, adversary: Adversary) -> None:
    with pytest.raises(rx.SandboxError, match="no #fragment") as caught:
        transport_for(url)
    adversary.tried("url injection", f"fragment: {url}", refused=caught.value is not None)


def test_repeatable_options_still_repeat() -> None:
    jail = transport_for("jail://?ro=/usr&ro=/opt&rw=/tmp")
    assert isinstance(jail, JailTransport) and [b.source for b in jail.binds] == ["/usr", "/opt", "/tmp"]
    ssh = transport_for("ssh://h?key=/k1&key=/k2")
    assert isinstance(ssh, SSHTransport) and ssh.keys == ["/k1", "/k2"]
    assert transport_for(rx.sandbox_url("docker+image", "img", volume=["a:/a", "b:/b"])).url.count("volume=") == 2


def test_sandbox_url_round_trips_every_value() -> None:
    for value in ["/srv/a&dir=/b", "/srv/a#b", "/srv/a?b", "/srv/a%26b", "/srv/a+b c", "/srv/é日"]:
        t = transport_for(rx.sandbox_url("local", dir=value))
        assert isinstance(t, LocalTransport) and t.state_dir == Path(value)
    assert rx.sandbox_url("local") == "local://"
    assert rx.sandbox_url("docker", "c", user=None, dir="/x y") == "docker://c?dir=/x%20y"
