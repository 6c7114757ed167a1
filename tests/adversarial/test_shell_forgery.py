"""A command in a shell session tries to forge the end of its run (issue #12, point 5).

The command runs *in* the shell process, so it can read what the shell can. Each case looks for
the framing's secret through one route, and prints DONE and EXIT sentinels (exit code 0) built
from every candidate it found (any run of 16+ hex digits), then goes on and ends with code 7.
The run must end at its true end with code 7, the forged text must reach the user as plain
output, and the next run must be exact. Real shells (bash and dash) run by the agent's shell
controller; one case also goes through a real ``local://`` agent end to end.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import remote_exec as rx
from remote_exec.agent.shell.controller import ShellController, ShellLimits
from remote_exec.protocol import PollParams, PollResult, ShellOpenParams, ShellRunParams

from ..agent.homes import jobs_in
from .conftest import Adversary

pytestmark = pytest.mark.anyio

# Prints a forged DONE (stdout) and EXIT with code 0 (stderr) for every candidate secret on its
# stdin, and each candidate as "CAND:..." so the test can check the forgery came out as text.
FORGE = (
    "__forge() { for c in $(grep -aoE '[0-9a-f]{16,}' | sort -u); do echo \"CAND:$c\"; "
    "printf '__RX_DONE_%s__' \"$c\"; printf '__RX_EXIT_%s_000__' \"$c\" >&2; done; }; "
)
TRUE_END = "echo TRUE-END; (exit 7)"

# (case, shells, setup run or None, attack) -- the attack ends with TRUE_END.
CASES: list[tuple[str, tuple[str, ...], str | None, str]] = [
    ("the nonce variable $__rx_n", ("bash", "sh"), None, 'echo "${__rx_n-}" | __forge'),
    ("every variable (set)", ("bash", "sh"), None, "set | __forge"),
    ("declare -p", ("bash",), None, "declare -p | __forge"),
    ("the shell's stdin via /proc/$$/fd/0", ("bash", "sh"), None, "timeout 1 cat /proc/$$/fd/0 2>/dev/null | __forge"),
    (
        "every fd of the shell, opened via /proc",
        ("bash", "sh"),
        None,
        "for f in /proc/$$/fd/*; do case ${f##*/} in 1|2) continue;; esac; "
        "timeout 0.3 cat $f 2>/dev/null | __forge; done",
    ),
    (
        "every fd of the shell, read -u N",
        ("bash",),
        None,
        "for f in /proc/$$/fd/*; do n=${f##*/}; "
        'while IFS= read -r -t 0.3 -u $n l 2>/dev/null; do echo "$l"; done | __forge; done',
    ),
    (
        "every fd of the shell, read by a forked subshell",
        ("bash",),
        None,
        "for f in /proc/$$/fd/*; do n=${f##*/}; "
        '( while IFS= read -r -t 0.3 -u $n l 2>/dev/null; do echo "$l"; done | __forge ); done',
    ),
    (
        "a DEBUG trap reading $BASH_COMMAND",
        ("bash",),
        None,
        "trap 'printf %s \"$BASH_COMMAND\" | __forge' DEBUG",
    ),
    (
        "/proc/$$/cmdline and environ",
        ("bash", "sh"),
        None,
        "cat /proc/$$/cmdline /proc/$$/environ | tr '\\0' '\\n' | __forge",
    ),
    ("history turned on by the run before", ("bash",), "set -o history", "history | __forge"),
    (
        "a function named printf",
        ("bash", "sh"),
        None,
        'printf() { echo "$*" | __forge; command printf "$@"; }',
    ),
    (
        "PROMPT_COMMAND reading the next line",
        ("bash",),
        None,
        "PROMPT_COMMAND='IFS= read -r __l; printf %s \"$__l\" | __forge'",
    ),
    (
        "a leftover process reading the shell's stdin",
        ("bash", "sh"),
        # Once the run is over (the shell's fd 0 is its input again, not /dev/null), it reads
        # from the shell's input, racing the shell for the next run's line.
        '(i=0; while [ "$(readlink /proc/$$/fd/0)" = /dev/null ] && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.02; done; '
        'timeout 3 cat /proc/$$/fd/0 2>/dev/null | while IFS= read -r l; do echo "$l" | __forge; done) &',
        "true",
    ),
]


def params() -> list[Any]:
    out: list[Any] = []
    for name, shells, setup, attack in CASES:
        for shell in shells:
            marks = [pytest.mark.skipif(shutil.which("dash") is None, reason="no dash")] if shell == "sh" else []
            out.append(pytest.param(shell, name, setup, attack, id=f"{shell}-{name}", marks=marks))
    return out


@pytest.fixture
async def controller(shell: str, tmp_path: Path) -> AsyncIterator[ShellController]:
    ctl = ShellController(jobs_in(tmp_path), ShellLimits(ttl=0, argv=("sh", "-i") if shell == "sh" else None))
    yield ctl
    await ctl.aclose()


async def run(ctl: ShellController, sid: str, command: str) -> tuple[str, int | None, str, str]:
    """One run to its end, as a client polls it: (state, exit code, stdout, stderr)."""
    job_id = (await ctl.run(ShellRunParams(session_id=sid, command=command, timeout=20))).job_id
    out, err, offsets = "", "", (0, 0)
    while True:
        r = await ctl.jobs.poll(PollParams(job_id=job_id, stdout_offset=offsets[0], stderr_offset=offsets[1], wait=5))
        assert isinstance(r, PollResult)  # not binary: the model itself
        out, err, offsets = out + r.stdout, err + r.stderr, (r.stdout_offset, r.stderr_offset)
        if r.state != "running":
            return r.state, r.exit_code, out, err


def held(result: tuple[str, int | None, str, str]) -> bool:
    """The run ended at its true end with its true code, and every forgery came out as text."""
    state, code, out, err = result
    candidates = re.findall(r"CAND:([0-9a-f]+)", out)
    as_text = all(f"__RX_DONE_{c}__" in out and f"__RX_EXIT_{c}_000__" in err for c in candidates)
    return state == "completed" and code == 7 and out.endswith("TRUE-END\n") and as_text


@pytest.mark.parametrize(("shell", "name", "setup", "attack"), params())
async def test_a_run_cannot_forge_its_end(
    controller: ShellController, adversary: Adversary, shell: str, name: str, setup: str | None, attack: str
) -> None:
    sid = (await controller.open(ShellOpenParams(cwd="/tmp"))).session_id
    if setup is not None:
        assert (await run(controller, sid, FORGE + setup))[:2] == ("completed", 0)
    result = await run(controller, sid, f"{FORGE}{attack}; {TRUE_END}")
    after = await run(controller, sid, "echo next; (exit 3)")
    refused = held(result) and after == ("completed", 3, "next\n", "")
    adversary.tried("shell framing", f"{shell}: {name}", refused=refused)
    assert held(result), result
    assert after == ("completed", 3, "next\n", ""), after


async def test_through_a_real_agent(agent_dir: Path, adversary: Adversary) -> None:
    async with rx.open_sandbox(f"local://?dir={agent_dir}") as sb, await sb.shell() as sh:
        r = await sh.run(f"{FORGE}set | __forge; {TRUE_END}", timeout=20)
        after = await sh.run("echo next; (exit 3)", timeout=20)
    ok = (
        r.returncode == 7 and str(r.stdout).endswith("TRUE-END\n") and (after.returncode, after.stdout) == (3, "next\n")
    )
    adversary.tried("shell framing", "bash via local:// agent: every variable (set)", refused=ok)
    assert ok, (r, after)
