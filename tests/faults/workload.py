"""The fault suite's jobs: each writes a stream fully determined by its index, so the host knows
every byte it must receive (and its sha256) and the exit code it must see.

A job streams paced lines (``read -t`` on its stdin paces it without forking a ``sleep``), so it
is mid-stream while the agent dies, then waits for a ``go`` line on stdin (written by the host
once the faults are over; the keeper holds the pipe while no agent runs), then ends with its own
exit code: 0 to 4, or death by SIGKILL. Every 40th job is a bulk one (``seq``, ~1.3 MB at once,
read by the host at offsets while agents come and go).

One job in ten runs in a pseudo-terminal (``tty=True``): the same script, whose stdout and
stderr are then one stream in the order written, every ``\n`` a ``\r\n`` (the terminal's
``onlcr``), and no stderr. It turns the terminal's echo off first (``stty -echo``), so that the
go line is not written back into the output at whatever moment it arrives; the host therefore
types it only once the job's first output has arrived (:func:`tty`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Expected", "expected", "go_line", "job_command", "tty"]

PACE_EVERY = 10  # lines between two paced pauses
PACE = 0.25  # seconds a pause waits for stdin at most


def _lines(k: int) -> int:
    return 60 + (k * 13) % 240


def _pad(k: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz0123456789"[k % 36] * ((k * 37) % 150)


def _bulk(k: int) -> bool:
    return k % 40 == 39


def tty(k: int) -> bool:
    """Whether job ``k`` runs in a pseudo-terminal (never a bulk job, nor one attached only at the
    end: the host waits for a tty job's first output before it types its go line)."""
    return k % 10 == 3


def job_command(tag: str, k: int) -> list[str]:
    """Job ``k``'s argv (bash: ``read -t``); ``tag`` marks its command line for the process table."""
    if _bulk(k):
        return ["bash", "-c", f": {tag}; seq 1 {150000 + k}; echo bulk {k} >&2; exit 3"]
    # A ``read -t`` that times out keeps what it read of a line (bash reads a pipe byte by byte
    # and checks its deadline before each byte: the go line landing just before the deadline,
    # the job descheduled after its "g", gave ``go=g`` and "got g"). The partial line is kept in
    # ``acc`` and the next read continues it; ``IFS= read -r`` keeps its spaces.
    script = f""": {tag}; {"stty -echo; " if tty(k) else ""}K={k}; i=0; go=; acc=
while [ $i -lt {_lines(k)} ]; do
  printf '{tag} job %d line %d %s\\n' $K $i '{_pad(k)}'
  [ $((i % 7)) -eq 0 ] && printf 'job %d err %d\\n' $K $i >&2
  i=$((i+1))
  if [ $((i % {PACE_EVERY})) -eq 0 ] && [ -z "$go" ]; then
    if IFS= read -r -t {PACE} part; then go=$acc$part; else acc=$acc$part; fi
  fi
done
[ -z "$go" ] && IFS= read -r part && go=$acc$part
printf 'got %s\\n' "$go"; printf 'end %d\\n' $K >&2
[ $((K % 9)) -eq 8 ] && kill -9 $$
exit $((K % 5))"""
    return ["bash", "-c", script]


def go_line(k: int) -> bytes:
    return b"go %d\n" % k


@dataclass(frozen=True)
class Expected:
    """What job ``k`` must deliver: its streams' sizes and sha256, its exit code."""

    stdout_len: int
    stdout_sha: str
    stderr_sha: str
    exit_code: int
    needs_go: bool


def expected(tag: str, k: int) -> Expected:
    if _bulk(k):
        out = "".join(f"{i}\n" for i in range(1, 150001 + k)).encode()
        err = f"bulk {k}\n".encode()
        return Expected(len(out), hashlib.sha256(out).hexdigest(), hashlib.sha256(err).hexdigest(), 3, False)
    pad = _pad(k)
    out_lines = [f"{tag} job {k} line {i} {pad}\n" for i in range(_lines(k))]
    err_lines = [f"job {k} err {i}\n" for i in range(_lines(k)) if i % 7 == 0]
    out = ("".join(out_lines) + f"got go {k}\n").encode()
    err = ("".join(err_lines) + f"end {k}\n").encode()
    code = -9 if k % 9 == 8 else k % 5
    if tty(k):  # one stream, in the order the script writes it; the terminal's \r\n
        both = [line + (f"job {k} err {i}\n" if i % 7 == 0 else "") for i, line in enumerate(out_lines)]
        out = ("".join(both) + f"got go {k}\nend {k}\n").replace("\n", "\r\n").encode()
        err = b""
    return Expected(len(out), hashlib.sha256(out).hexdigest(), hashlib.sha256(err).hexdigest(), code, True)
