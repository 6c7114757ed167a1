"""Injecting the frozen agent bundle into a sandbox that has no agent, checksum-verified.

Everything goes through the sandbox's own exec primitive (``docker exec``, ``kubectl exec``,
``ssh``...), with nothing but POSIX ``sh``, ``mkdir``, ``cat``, ``tar -xz`` and ``uname``/``id``
inside (busybox is enough; Python is not needed):

1. **probe** (one exec): the sandbox's ``uname -m``, its uid, whether it has ``sha256sum``,
   and whether a bundle with our SHA-256 was injected and verified before. If so, reuse it.
2. **upload**: the tarball through stdin of ``cat`` into a private (0700) directory
   ``/tmp/.remote-exec-<uid>-<sha prefix>``, under a temporary name.
3. **verify, then extract**: ``sha256sum`` of the file AS STORED IN THE SANDBOX must equal
   the host's digest before ``tar`` touches it; without ``sha256sum`` the file is read back
   and hashed on the host. A mismatch deletes the upload and fails: nothing from it runs.
   Extraction is into a fresh directory renamed into place, then a ``ready`` stamp holding
   the full digest is written: the stamp is what step 1 trusts.
4. **ensure**: start the freshly injected agent and check its ``protocol_version``.

What this guards against is corruption on the way in (a truncated or altered upload, a stale
file of another build). A sandbox that is itself hostile can subvert any agent it runs;
verification cannot help there, and is not meant to.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import AgentUnavailableError
from ..protocol import PROTOCOL_VERSION
from .bundle import AgentBundle, find_bundle, local_bundles

__all__ = ["AGENT_EXE", "InjectTarget", "Probe", "inject_agent", "injected_dir", "probe"]

AGENT_EXE = "agent/remote-exec-agent"
"""The agent executable, relative to the injection directory."""

# Prints key=value lines; $1 is the root dir (/tmp), then "arch:sha256" for each bundle the host has.
_PROBE = r"""
root=$1; shift
arch=$(uname -m) || exit 9
uid=$(id -u 2>/dev/null) || uid=$(awk '/^Uid:/{print $2}' /proc/self/status 2>/dev/null)
[ -n "$uid" ] || uid=x
echo "arch=$arch"; echo "uid=$uid"
sha256sum </dev/null >/dev/null 2>&1 && echo sha256sum=1  # works, not merely on PATH
command -v tar >/dev/null 2>&1 && echo tar=1
for b in "$@"; do
  [ "${b%%:*}" = "$arch" ] || continue
  sha=${b#*:}; rest=${sha#????????????????}; d="$root/.remote-exec-$uid-${sha%"$rest"}"
  echo "dir=$d"
  if [ -L "$d" ] || { [ -e "$d" ] && { [ ! -d "$d" ] || [ ! -O "$d" ]; }; }; then echo state=unsafe; exit 0; fi
  [ -d "$d" ] || { echo state=absent; exit 0; }
  case $(ls -ld "$d") in drwx------*) ;; *) echo state=unsafe; exit 0;; esac
  if [ -x "$d/agent/remote-exec-agent" ] && [ "$(cat "$d/ready" 2>/dev/null)" = "$sha" ]; then
    echo state=ready
  else
    echo state=absent
  fi
done
"""

# $1 dir, $2 the upload's size when stdin never ends (a v4 exec WebSocket cannot say EOF: the
# size does), else "", $3 upload name. The directory is created private, or must be ours and not a symlink.
_UPLOAD = r"""
umask 077
[ -d "$1" ] || mkdir -m 700 "$1" || exit 3
{ [ -O "$1" ] && [ ! -L "$1" ]; } || { echo "unsafe $1"; exit 3; }
chmod 700 "$1" || exit 3
if [ -n "$2" ]; then exec head -c "$2" > "$1/$3"; fi
exec cat > "$1/$3"
"""

# $1 dir, $2 full sha256, $3 upload name, $4 "1" to verify here with sha256sum.
_EXTRACT = r"""
set -eu
d=$1 sha=$2 part=$3
cd "$d"
if [ "$4" = 1 ]; then
  got=$(sha256sum "$part"); got=${got%% *}
  if [ "$got" != "$sha" ]; then rm -f "$part"; echo "mismatch $got"; exit 10; fi
fi
umask 077
mkdir "$part.x"
tar -xzf "$part" -C "$part.x" || { rm -rf "$part" "$part.x"; echo "tar failed"; exit 11; }
rm -f "$part"
# A complete tree renamed into place at once; a concurrent injection of the same digest may have won.
[ -e agent ] || mv "$part.x/remote-exec-agent" agent
rm -rf "$part.x"
echo "$sha" > "ready.$part" && mv -f "ready.$part" ready
echo extracted
"""


class InjectTarget(Protocol):
    """What injection needs of a transport (an ``ExecTransport`` is one)."""

    url: str
    agent_state_dir: str | None
    stdin_eof: bool
    """False where closing a command's stdin is no EOF it reads (a v4 exec WebSocket)."""

    async def exec_capture(
        self, argv: Sequence[str], input: bytes = b"", timeout: float = 120.0
    ) -> tuple[int, bytes]: ...


@dataclass(frozen=True)
class Probe:
    """What the probe learnt about the sandbox.

    :ivar state: ``ready`` (a verified bundle with our digest is there), ``absent`` or
        ``unsafe`` (the directory is not ours alone), or ``nobundle`` (the host has none for
        this arch).
    """

    arch: str
    uid: str
    has_sha256sum: bool
    has_tar: bool
    dir: str | None
    state: str


def injected_dir(root: str, uid: str, sha256: str) -> str:
    """Where a bundle with digest ``sha256`` lives in the sandbox for user ``uid``."""
    return f"{root}/.remote-exec-{uid}-{sha256[:16]}"


async def probe(target: InjectTarget, root: str = "/tmp") -> Probe:
    """Run the probe script in the sandbox (one exec).

    :raises AgentUnavailableError: the sandbox has no working ``sh``/``uname`` (or is unreachable).
    """
    bundles = await asyncio.to_thread(local_bundles)
    code, out = await target.exec_capture(["sh", "-c", _PROBE, "sh", root, *(f"{b.arch}:{b.sha256}" for b in bundles)])
    kv = dict(line.split("=", 1) for line in out.decode(errors="replace").splitlines() if "=" in line)
    if code != 0 or "arch" not in kv:
        raise AgentUnavailableError(
            f"cannot inspect {target.url} to inject the agent (exit {code}): it needs a POSIX sh and uname; "
            f"output: {out[:300]!r}"
        )
    return Probe(
        arch=kv["arch"],
        uid=kv.get("uid", "x"),
        has_sha256sum="sha256sum" in kv,
        has_tar="tar" in kv,
        dir=kv.get("dir"),
        state=kv.get("state", "nobundle"),
    )


async def _verify_on_host(target: InjectTarget, path: str, bundle: AgentBundle) -> None:
    # The sandbox lacks sha256sum: read the stored file back and hash it here.
    code, data = await target.exec_capture(["cat", path], timeout=300.0)
    got = hashlib.sha256(data).hexdigest()
    if code != 0 or got != bundle.sha256:
        await target.exec_capture(["rm", "-f", path])
        raise AgentUnavailableError(
            f"the agent bundle uploaded to {target.url} failed its SHA-256 check (expected {bundle.sha256}, "
            f"read back {got}): refusing to run it"
        )


async def upload(target: InjectTarget, found: Probe, bundle: AgentBundle) -> None:
    """Upload ``bundle`` into ``found.dir``, verify it there, and extract it.

    Cancelling leaves at most a temporary file in the private directory.

    :raises AgentUnavailableError: the upload failed, or failed its checksum (nothing of it runs).
    """
    assert found.dir is not None
    if not found.has_tar:
        raise AgentUnavailableError(f"cannot inject the agent into {target.url}: it has no `tar`")
    part = f"upload-{secrets.token_hex(6)}.tar.gz"
    data = await asyncio.to_thread(bundle.read)
    size = "" if target.stdin_eof else str(len(data))
    code, out = await target.exec_capture(["sh", "-c", _UPLOAD, "sh", found.dir, size, part], input=data, timeout=300.0)
    if code != 0:
        raise AgentUnavailableError(
            f"uploading the agent into {found.dir} in {target.url} failed (exit {code}): {out!r}"
        )
    if not found.has_sha256sum:
        await _verify_on_host(target, f"{found.dir}/{part}", bundle)
    verify_here = "1" if found.has_sha256sum else "0"
    code, out = await target.exec_capture(["sh", "-c", _EXTRACT, "sh", found.dir, bundle.sha256, part, verify_here])
    text = out.decode(errors="replace").strip()
    if code == 10:
        got = text.split()[-1] if text else "?"
        raise AgentUnavailableError(
            f"the agent bundle uploaded to {target.url} failed its SHA-256 check (expected {bundle.sha256}, "
            f"the sandbox computed {got}): refusing to run it"
        )
    if code != 0 or not text.endswith("extracted"):
        raise AgentUnavailableError(f"extracting the agent in {target.url} failed (exit {code}): {text[-300:]}")


async def start_injected(target: InjectTarget, argv: list[str]) -> None:
    """Run ``ensure`` with the injected agent and check the protocol it speaks.

    :raises AgentUnavailableError: it does not start (e.g. the sandbox lacks glibc) or speaks
        another protocol version.
    """
    extra = ["--dir", target.agent_state_dir] if target.agent_state_dir else []
    # stderr merged into stdout: if the bundle cannot start, its message is the error we report.
    code, out = await target.exec_capture(["sh", "-c", 'exec "$@" 2>&1', "sh", *argv, "ensure", *extra])
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        info = json.loads(lines[-1])["result"]
        version = info["protocol_version"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise AgentUnavailableError(
            f"the injected agent does not start in {target.url} (exit {code}); a bundle needs glibc (ld-linux, "
            f"libc, libm, libdl, libpthread, librt, libz). Output: {' | '.join(lines)[-600:]}"
        ) from None
    if version != PROTOCOL_VERSION:
        raise AgentUnavailableError(
            f"the injected agent in {target.url} speaks protocol {version}, this client {PROTOCOL_VERSION}"
        )


async def inject_agent(target: InjectTarget, root: str = "/tmp") -> list[str]:
    """Make sure the bundled agent is in the sandbox (upload it if needed), start it, return its argv.

    An agent injected before with the same SHA-256 is reused without re-uploading. Cancelling
    leaves at most a temporary upload behind in the private directory.

    :raises AgentUnavailableError: no bundle for the sandbox's arch on the host, an unsafe
        directory, a failed upload or checksum, or an agent that does not start.
    """
    found = await probe(target, root)
    if found.state == "nobundle":
        await asyncio.to_thread(find_bundle, found.arch)  # raises with the list of what we have
    if found.state == "unsafe":
        raise AgentUnavailableError(
            f"{found.dir} in {target.url} exists but is not a private directory of ours: refusing to use it"
        )
    bundle = await asyncio.to_thread(find_bundle, found.arch)
    if found.dir is None or found.dir != injected_dir(root, found.uid, bundle.sha256):
        raise AgentUnavailableError(f"the probe of {target.url} named an unexpected directory {found.dir!r}")
    argv = [f"{found.dir}/{AGENT_EXE}"]
    if found.state != "ready":
        await upload(target, found, bundle)
        # Only a fresh injection is started here, for a clear error if it cannot run (no glibc...).
        # A reused one ran before; the channel's relay starts its server and the sandbox's
        # open checks the protocol, which saves a ~0.4 s cold start per open.
        await start_injected(target, argv)
    return argv
