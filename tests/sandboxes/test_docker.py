"""Docker, docker+image and k8s specifics, against a real private dockerd (no fakes).

The contract suite runs on these backends too (backend_docker.py); this file covers what is
particular to them: the injected bundle in a container without Python, the checksum refusing a
tampered upload, reuse without re-upload, the hardening of ``docker+image://`` containers, and
clear errors.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import remote_exec as rx
from remote_exec.client.channel import PipeProcess, PipeReader, PipeWriter
from remote_exec.protocol import PROTOCOL_VERSION
from remote_exec.sandboxes import transport_for
from remote_exec.sandboxes.docker import DockerTransport, PodmanTransport
from remote_exec.sandboxes.docker_image import DockerImageTransport
from remote_exec.sandboxes.k8s import K8sTransport

from .backend_docker import KUBECTL, docker_or_skip, fast_api_or_skip, image_or_skip
from .conftest import unavailable
from .dockerd import Dockerd, DockerUnavailable, bundle_path, busybox_image

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def engine() -> Dockerd:
    return docker_or_skip()


@pytest.fixture(scope="module")
def nopy(engine: Dockerd) -> str:
    return image_or_skip(engine, "nopy")


@pytest.fixture
def container(engine: Dockerd) -> Iterator[list[str]]:
    """Names appended here are removed after the test."""
    names: list[str] = []
    yield names
    for name in names:
        engine.docker("rm", "-f", name, check=False)


def fresh(engine: Dockerd, names: list[str], image: str, *args: str) -> str:
    """A new container (PID 1 ``sleep infinity``) with a unique name, removed after the test."""
    name = engine.run(f"rx-test-{secrets.token_hex(4)}", image, *args)
    names.append(name)
    return name


def docker_transport(sb: rx.AsyncSandbox) -> DockerTransport:
    assert isinstance(sb.transport, DockerTransport)
    return sb.transport


def sh(engine: Dockerd, name: str, script: str) -> str:
    return engine.docker("exec", name, "sh", "-c", script, check=False).stdout.decode()


class Recording(DockerTransport):
    """A docker:// transport that records every argv it runs in the container."""

    def __init__(self, container: str) -> None:
        super().__init__(container)
        self.spawned: list[list[str]] = []

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        self.spawned.append(list(argv))
        return await super().spawn(argv)

    def uploads(self) -> int:
        return sum(1 for argv in self.spawned if argv[-1].startswith("upload-"))


# -- the bundle ---------------------------------------------------------------------------


def test_bundle_is_small_checksummed_and_agent_only() -> None:
    try:
        path = bundle_path()
    except DockerUnavailable as exc:
        unavailable(str(exc))
        return
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.with_name(path.name + ".sha256").read_text() == f"{digest}  {path.name}\n"
    assert path.stat().st_size < 25 * 1024 * 1024  # ~13 MiB; 60+ if host packages leak in
    with tarfile.open(path) as tar:
        names = tar.getnames()
    assert all(n == "remote-exec-agent" or n.startswith("remote-exec-agent/") for n in names)
    assert "remote-exec-agent/remote-exec-agent" in names
    tops = {n.split("/")[2] for n in names if n.startswith("remote-exec-agent/_internal/") and n.count("/") >= 2}
    assert {"aiohttp", "pydantic_core"} <= tops
    assert not tops & {"IPython", "numpy", "mypy", "hypothesis", "asyncssh", "anyio", "jupyterlab", "pytest"}


async def test_bundle_runs_where_there_is_no_python(engine: Dockerd, nopy: str, container: list[str]) -> None:
    name = fresh(engine, container, nopy)
    assert sh(engine, name, "command -v python3 python; ls /usr/lib /usr/lib64 | grep -i pyth; echo end") == "end\n"
    transport = Recording(name)
    async with rx.AsyncSandbox(transport) as sb:
        assert transport.uploads() == 1
        argv = transport.agent_argv
        assert argv is not None and argv[0].startswith("/tmp/.remote-exec-0-")
        assert sb.info.protocol_version == PROTOCOL_VERSION
        res = await sb.run(["sh", "-c", "echo $((6 * 7)); cat /proc/$PPID/cmdline | tr '\\0' ' '"])
        out, parent = str(res.stdout).split("\n", 1)
        assert out == "42"
        assert "remote-exec-agent serve" in parent  # the frozen agent re-executed itself as server
    # The directory is private to its user.
    assert sh(engine, name, "ls -ld /tmp/.remote-exec-0-*").startswith("drwx------")


async def test_injected_agent_is_reused_without_upload(engine: Dockerd, nopy: str, container: list[str]) -> None:
    name = fresh(engine, container, nopy)
    first, second = Recording(name), Recording(name)
    async with rx.AsyncSandbox(first) as a:
        pid = a.info.pid
    async with rx.AsyncSandbox(second) as b:
        assert b.info.pid == pid  # the same agent server, still running
    assert (first.uploads(), second.uploads()) == (1, 0)


async def test_each_user_gets_its_own_private_agent(engine: Dockerd, nopy: str, container: list[str]) -> None:
    name = fresh(engine, container, nopy)
    async with rx.open_sandbox(f"docker://{name}?user=nobody") as sb:
        assert (await sb.run(["id", "-u"])).stdout == "65534\n"
        argv = docker_transport(sb).agent_argv
        assert argv is not None and argv[0].startswith("/tmp/.remote-exec-65534-")


def malicious_bundle() -> bytes:
    """A well-formed bundle whose "agent" leaves a mark if it is ever run."""
    script = b"#!/bin/sh\necho pwned > /tmp/PWNED\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data, mode in [("remote-exec-agent/remote-exec-agent", script, 0o755)]:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _SwappedStdin:
    """Writes ``payload`` instead of what it is given: the upload is corrupted on the way in."""

    def __init__(self, inner: PipeWriter, payload: bytes) -> None:
        self._inner, self._payload = inner, payload

    def write(self, data: bytes) -> None:
        self._inner.write(self._payload)

    async def drain(self) -> None:
        await self._inner.drain()

    def close(self) -> None:
        self._inner.close()


class _Tampered:
    def __init__(self, proc: PipeProcess, payload: bytes) -> None:
        self._proc = proc
        assert proc.stdin is not None
        self._stdin = _SwappedStdin(proc.stdin, payload)

    @property
    def stdin(self) -> PipeWriter | None:
        return self._stdin

    @property
    def stdout(self) -> PipeReader | None:
        return self._proc.stdout

    def kill(self) -> None:
        self._proc.kill()

    async def wait(self) -> int:
        return await self._proc.wait()


class Tampering(DockerTransport):
    """A docker:// transport whose bundle upload arrives altered (a sandbox that corrupts it)."""

    async def spawn(self, argv: Sequence[str]) -> PipeProcess:
        proc = await super().spawn(argv)
        return _Tampered(proc, malicious_bundle()) if argv[-1].startswith("upload-") else proc


@pytest.mark.parametrize("where", ["in the sandbox", "on the host"])
async def test_tampered_upload_is_refused(
    engine: Dockerd, nopy: str, container: list[str], where: str, tmp_path: Path
) -> None:
    if where == "in the sandbox":
        name = fresh(engine, container, nopy)
    else:  # a sandbox whose sha256sum is broken: the file is read back and hashed on the host
        broken = tmp_path / "sha256sum"
        broken.write_text("#!/bin/sh\nexit 127\n")
        broken.chmod(0o755)
        usr = image_or_skip(engine, "usr")
        name = fresh(engine, container, usr, "-v", "/usr:/usr:ro", "-v", f"{broken}:/usr/bin/sha256sum:ro")
    with pytest.raises(rx.AgentUnavailableError, match="SHA-256 check") as info:
        await rx.AsyncSandbox(Tampering(name)).open()
    assert ("sandbox computed" if where == "in the sandbox" else "read back") in str(info.value)
    # Nothing of the upload was extracted, kept or run.
    assert sh(engine, name, "test -e /tmp/PWNED && echo RAN; ls -A /tmp/.remote-exec-0-*") == ""
    # The same sandbox accepts the genuine bundle.
    async with rx.open_sandbox(f"docker://{name}") as sb:
        assert (await sb.run(["echo", "ok"])).stdout == "ok\n"


async def test_bundle_needs_glibc(engine: Dockerd, container: list[str]) -> None:
    name = fresh(engine, container, busybox_image(engine))
    with pytest.raises(rx.AgentUnavailableError, match="needs glibc"):
        await rx.open_sandbox(f"docker://{name}")


async def test_missing_bundle_and_no_injection(
    engine: Dockerd, nopy: str, container: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = fresh(engine, container, nopy)
    with pytest.raises(rx.AgentUnavailableError, match="no remote_exec agent"):
        await rx.open_sandbox(f"docker://{name}?inject=never")
    monkeypatch.setenv("REMOTE_EXEC_AGENT_BUNDLE", str(tmp_path))
    with pytest.raises(rx.AgentUnavailableError, match=r"no agent bundle for x86_64|no agent bundle for aarch64"):
        await rx.open_sandbox(f"docker://{name}?inject=always")


# -- docker+image:// -------------------------------------------------------------------------


async def test_image_container_is_hardened_and_removed_on_close(engine: Dockerd, nopy: str) -> None:
    async with rx.open_sandbox(f"docker+image://{nopy}?pull=never") as sb:
        name = docker_transport(sb).container
        touch = await sb.run(["touch", "/x"])
        assert touch.returncode != 0 and "Read-only" in touch.stderr
        assert (await sb.run(["sh", "-c", "touch /tmp/ok && echo ok"])).stdout == "ok\n"
        caps = (await sb.run(["grep", "^Cap", "/proc/self/status"])).stdout
        assert {line.split()[0]: line.split()[1] for line in caps.splitlines()}["CapEff:"] == "0" * 16
        assert (await sb.run(["ls", "/sys/class/net"])).stdout.split() == ["lo"]
        nnp = (await sb.run(["grep", "^NoNewPrivs", "/proc/self/status"])).stdout
        assert nnp.split() == ["NoNewPrivs:", "1"]
        fmt = "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.HostConfig.PidsLimit}}"
        fmt += " {{.HostConfig.NetworkMode}}"
        assert engine.docker("inspect", "-f", fmt, name).stdout.decode().split() == ["true", "[ALL]", "512", "none"]
    assert engine.docker("inspect", name, check=False).returncode != 0  # removed


async def test_image_options(engine: Dockerd, nopy: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("shared\n")
    url = f"docker+image://{nopy}?pull=never&volume={tmp_path}:/data:ro&pids_limit=64&memory=256m&tmp_size=64m"
    async with rx.open_sandbox(url) as sb:
        name = docker_transport(sb).container
        assert (await sb.run(["cat", "/data/f"])).stdout == "shared\n"
        assert (await sb.run(["touch", "/data/g"])).returncode != 0
        fmt = "{{.HostConfig.PidsLimit}} {{.HostConfig.Memory}}"
        assert engine.docker("inspect", "-f", fmt, name).stdout.decode().split() == ["64", str(256 * 1024 * 1024)]
        # The agent (about 30 MB extracted) fits in 64 MB of /tmp; 60 MB more does not.
        full = await sb.run(["sh", "-c", "head -c 60000000 /dev/zero > /tmp/big"])
        assert full.returncode != 0


async def test_named_container_is_shared_and_removed_by_its_creator(engine: Dockerd, nopy: str) -> None:
    name = f"rx-named-{secrets.token_hex(4)}"
    url = f"docker+image://{nopy}?pull=never&name={name}"
    async with rx.open_sandbox(url) as a:
        proc = await a.exec_remote(["sh", "-c", "echo one; sleep 0.3; echo two"]).started()
        async with rx.open_sandbox(url) as b:
            other = await b.attach(proc.job_id or "")
            assert (await other.wait()).stdout == "one\ntwo\n"
        assert engine.docker("inspect", name, check=False).returncode == 0  # b only reused it
    assert engine.docker("inspect", name, check=False).returncode != 0  # a made it and removed it


async def test_name_of_a_foreign_container_is_refused(engine: Dockerd, nopy: str, container: list[str]) -> None:
    name = fresh(engine, container, nopy)
    with pytest.raises(rx.SandboxError, match="not made by remote_exec"):
        await rx.open_sandbox(f"docker+image://{nopy}?pull=never&name={name}")


# -- errors ------------------------------------------------------------------------------


async def test_clear_errors(engine: Dockerd, nopy: str, container: list[str], tmp_path: Path) -> None:
    with pytest.raises(rx.SandboxError, match=r"(?i)no such container"):
        await rx.open_sandbox("docker://rx-absent-container")
    stopped = fresh(engine, container, nopy)
    engine.docker("stop", "-t", "0", stopped)
    with pytest.raises(rx.SandboxError, match="not running"):
        await rx.open_sandbox(f"docker://{stopped}")
    with pytest.raises(rx.SandboxError, match="not found"):
        await rx.open_sandbox(f"docker://{stopped}?docker=/nonexistent/docker")
    with pytest.raises(rx.SandboxError, match="cannot start a container from rx-test/absent:1"):
        await rx.open_sandbox("docker+image://rx-test/absent:1?pull=never")
    api = fast_api_or_skip(tmp_path / "api")
    with pytest.raises(rx.SandboxError, match="pod rxtest/absent not found"):
        await rx.open_sandbox(f"k8s://rxtest/absent?kubeconfig={api.kubeconfig}")
    with pytest.raises(rx.SandboxError, match=r"NotFound.*absent"):  # kubectl's own words
        await rx.open_sandbox(f"k8s://rxtest/absent?kubeconfig={api.kubeconfig}&via=kubectl&kubectl={KUBECTL}")
    with pytest.raises(rx.SandboxError, match="not found"):
        await rx.open_sandbox("k8s://rxtest/absent?kubectl=/nonexistent/kubectl")


def test_command_lines_and_bad_urls() -> None:
    t = transport_for("docker://c1?user=1000:1000&host=unix:///x.sock&docker=/opt/docker")
    assert isinstance(t, DockerTransport)
    assert t.exec_argv(["id"]) == [
        "/opt/docker",
        "-H",
        "unix:///x.sock",
        "exec",
        "-i",
        "--user",
        "1000:1000",
        "c1",
        "id",
    ]
    p = transport_for("podman://c2?host=unix:///p.sock")
    assert isinstance(p, PodmanTransport)
    assert p.exec_argv(["id"]) == ["podman", "--url", "unix:///p.sock", "exec", "-i", "c2", "id"]
    k = transport_for("k8s://ns/pod/ctr?context=ctx&kubeconfig=/k&kubectl=/bin/kc")
    assert isinstance(k, K8sTransport)
    argv = k.exec_argv(["sh"])
    assert argv[:6] == ["/bin/kc", "--kubeconfig", "/k", "--context", "ctx", "exec"]
    assert argv[6:] == ["-i", "-n", "ns", "pod", "-c", "ctr", "--", "sh"]
    i = transport_for("docker+image://reg.example:5000/a/b:1.2?network=bridge&volume=/a:/b&volume=v:/c")
    assert isinstance(i, DockerImageTransport) and i.image == "reg.example:5000/a/b:1.2"
    run = i.run_argv()
    for flag in (["--read-only"], ["--cap-drop", "ALL"], ["--security-opt", "no-new-privileges"], ["--init"]):
        assert any(run[j : j + len(flag)] == flag for j in range(len(run)))
    assert run[-4:] == ["--entrypoint", "sleep", "reg.example:5000/a/b:1.2", "infinity"]
    assert run[run.index("-v") : run.index("-v") + 2] == ["-v", "/a:/b"] and "v:/c" in run
    assert run[run.index("--network") + 1] == "bridge"
    for url, match in [
        ("docker://", "needs a container"),
        ("docker://a/b", "needs a container"),
        ("docker://c?colour=red", "unknown option"),
        ("docker://c?user=a&user=b", "more than once"),
        ("docker://c?inject=maybe", "inject must be"),
        ("docker+image://img?keep=2", "keep must be"),
        ("docker+image://img?pull=sometimes", "pull must be"),
        ("docker+image://?pull=never", "bad image"),
        ("k8s://onlyns", "NAMESPACE/POD"),
        ("k8s://ns/Bad_Pod", "bad Kubernetes pod"),
        ("podman://c?docker=/x", "unknown option"),
    ]:
        with pytest.raises(rx.SandboxError, match=match):
            transport_for(url)
