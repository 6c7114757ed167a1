"""PTY jobs (#16) through every transport: the agent allocates the terminal inside the sandbox."""

from __future__ import annotations

import secrets

import anyio
import pytest

import remote_exec as rx
from remote_exec.protocol import TtySize

pytestmark = pytest.mark.anyio

# A full-screen program's bytes: alternate screen, clear, cursor moves, colours, a title, back.
FULL_SCREEN = (
    r"printf '\033[?1049h\033[2J\033[H\033]0;title\007'; i=1; "
    r"while [ $i -le 40 ]; do printf '\033[%d;%dH\033[3%dm row %d \033[0m' $i $((i*2)) $((i%8)) $i; i=$((i+1)); done; "
    r"printf '\033[?1049l'; echo done"
)


class Screen:
    """What a tty job has shown so far, read event by event until a needle appears."""

    def __init__(self, proc: rx.ExecRemoteProcess) -> None:
        self.proc = proc
        self._events = aiter(proc)
        self.text = ""
        self.end: rx.Completed | None = None

    async def expect(self, needle: str, start: int = 0, timeout: float = 60.0) -> int:
        """Read until ``needle`` shows after ``start``; return the offset just past it."""
        with anyio.fail_after(timeout):
            while needle not in self.text[start:]:
                if self.end is not None:
                    raise AssertionError(f"{needle!r} never came; the job ended with {self.text!r}")
                ev = await anext(self._events)
                if isinstance(ev, rx.StdoutChunk):
                    self.text += str(ev.data)
                elif isinstance(ev, rx.Completed):
                    self.end = ev
                else:
                    raise AssertionError(f"a tty job has no stderr: {ev!r}")
        return self.text.index(needle, start) + len(needle)

    async def ended(self, timeout: float = 60.0) -> rx.Completed:
        with anyio.fail_after(timeout):
            while self.end is None:
                ev = await anext(self._events)
                if isinstance(ev, rx.StdoutChunk):
                    self.text += str(ev.data)
                elif isinstance(ev, rx.Completed):
                    self.end = ev
        return self.end


async def test_a_terminal_with_stderr_merged(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        script = "[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo tty; echo err >&2; echo $TERM; stty size"
        res = await sb.run(["sh", "-c", script], tty=True, tty_size=(100, 30))
        assert (res.stdout, res.stderr, res.returncode) == ("tty\r\nerr\r\nxterm-256color\r\n30 100\r\n", "", 0)
        plain = await sb.run(["sh", "-c", "[ -t 0 ] || [ -t 1 ] || echo none"])
        assert plain.stdout == "none\n"  # the control: a plain job has no terminal
        default = await sb.run(["stty", "size"], tty=True, env={"TERM": "vt100"})
        assert default.stdout == "24 80\r\n"


async def test_resize_follows_and_is_listed(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        proc = sb.exec_remote(["sh", "-c", "echo ready; read x; stty size"], tty=True)
        screen = Screen(proc)
        await screen.expect("ready\r\n")
        assert proc.tty
        await proc.resize(132, 43)
        info = next(j for j in await sb.jobs() if j.job_id == proc.job_id)
        assert info.tty and info.tty_size == TtySize(cols=132, rows=43)
        await proc.write_stdin("\r")
        await screen.expect("43 132\r\n")
        assert (await screen.ended()).exit_code == 0
        with pytest.raises(rx.JobNotRunningError):
            await proc.resize(80, 24)
        plain = await sb.exec_remote(["true"]).started()
        with pytest.raises(rx.InvalidParamsError):
            await plain.resize(80, 24)


async def test_ctrl_c_reaches_the_foreground_command(sandbox_url: str) -> None:
    """``signal("INT")`` and a typed ``\\x03`` both end the command an interactive shell runs,
    as Ctrl-C does (the shell reports 130 and lives on); the shell itself is not signalled."""
    async with rx.open_sandbox(sandbox_url) as sb:
        proc = sb.exec_remote(["sh", "-i"], tty=True, env={"PS1": "P> ", "ENV": ""})
        screen = Screen(proc)
        at = await screen.expect("P> ")
        for interrupt in ("signal", "keystroke"):
            # g""o: the echo of the typed line does not match; "go" shows once sleep is in front.
            await proc.write_stdin("sh -c 'echo g\"\"o; exec sleep 100'\r")
            at = await screen.expect("go\r\n", at)
            if interrupt == "signal":
                await proc.signal("INT")
            else:
                await proc.write_stdin("\x03")
            await proc.write_stdin("echo rc=$?\r")
            at = await screen.expect("rc=130", at)
        await proc.write_stdin("exit\r")
        assert (await screen.ended()).exit_code == 0


async def test_ctrl_c_ends_a_leader(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        for how in ("signal", "keystroke"):
            proc = sb.exec_remote(["sh", "-c", "echo ready; exec sleep 100"], tty=True)
            screen = Screen(proc)
            await screen.expect("ready")
            await (proc.signal("INT") if how == "signal" else proc.write_stdin("\x03"))
            assert (await screen.ended()).exit_code == -2  # killed by SIGINT (a shell shows 130)


async def test_input_answered_through_stdin(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as sb:
        proc = sb.exec_remote(["sh", "-c", "printf 'name? '; read x; echo got $x"], tty=True)
        screen = Screen(proc)
        await screen.expect("name? ")
        await proc.write_stdin("ada\r")
        assert (await screen.ended()).stdout == "name? ada\r\ngot ada\r\n"
        cat = sb.exec_remote(["cat"], tty=True)
        await cat.write_stdin("abc\r")
        await cat.close_stdin()  # Ctrl-D at the start of a line: cat reads its end
        res = await cat.wait()
        assert (res.stdout, res.returncode) == ("abc\r\nabc\r\n", 0)
        if (await sb.run(["sh", "-c", "command -v python3"])).returncode != 0:
            return  # a Python-less sandbox: the shell's read above is the same contract
        res = await sb.run(["python3", "-c", "print('got', input())"], tty=True, input="grace\r")
        assert res.stdout == "grace\r\ngot grace\r\n"


async def test_full_screen_output_replays_byte_identically(sandbox_url: str) -> None:
    async with rx.open_sandbox(sandbox_url) as a, rx.open_sandbox(sandbox_url) as b:
        first = await a.run(["sh", "-c", FULL_SCREEN], tty=True, encoding="base64")
        assert isinstance(first.stdout, bytes) and first.stdout.startswith(b"\x1b[?1049h")
        assert first.stdout.endswith(b"\x1b[?1049ldone\r\n") and b"\x1b[40;80H" in first.stdout
        again = await (await b.attach(first.job_id)).wait()
        assert again.stdout == first.stdout  # the attach (base64, as the job) replays the same bytes
        assert (await b.read_output(first.job_id)).data == first.stdout
        if (await a.run(["sh", "-c", "command -v top"])).returncode == 0:
            top = await a.run(["top", "-b", "-n", "1"], tty=True, encoding="base64", tty_size=(120, 40))
            assert top.returncode == 0 and isinstance(top.stdout, bytes) and b"PID" in top.stdout
            replay = await (await b.attach(top.job_id)).wait()
            assert replay.stdout == top.stdout


async def test_survives_an_agent_sigkill(sandbox_url: str) -> None:
    """The agent is SIGKILLed (from inside the sandbox) in the middle of a flood: the keeper's
    copy of the terminal keeps it up, the next agent reads on; every line arrives once, in order,
    and the job still takes keystrokes."""
    n = 5000
    async with rx.open_sandbox(sandbox_url, response_margin=1.0) as sb:
        agent = sb.info.pid
        # Mid-flood, once the flag exists, the job kills the agent itself. Not on a keystroke: the
        # agent answers a write after the job has its keys, so a kill the keys set off races the
        # answer, and a retry of a write whose answer was lost types it again when the agent died
        # before it recorded its cursor (at least once; see DiskJob.write_stdin). Not from another
        # job either: that kill could land after the whole flood was read (seen).
        flag = f"/tmp/rx-kill-now-{secrets.token_hex(4)}"
        script = (
            f"read go; i=0; while [ $i -lt {n} ]; do echo line$i; i=$((i+1)); "
            f"if [ $i -eq {n // 2} ]; then while [ ! -e {flag} ]; do sleep 0.01; done; kill -9 {agent}; fi; "
            "done; read x; echo got $x"
        )
        proc = sb.exec_remote(["sh", "-c", script], tty=True, poll_interval=1.0)
        screen = Screen(proc)
        await proc.write_stdin("go\r")  # answered: the job waits for the flag
        await screen.expect(f"line{n // 2 - 1}\r\n")
        await sb.run(["touch", flag])  # (its answer may be lost with the agent: the call asks again)
        at = await screen.expect(f"line{n - 1}\r\n")
        assert (await sb.server_info()).pid != agent
        await proc.write_stdin("hello\r")
        await screen.expect("got hello\r\n", at)
        assert (await screen.ended()).exit_code == 0
    assert "".join(f"line{i}\r\n" for i in range(n)) in screen.text
    assert screen.text.count("line") == n
