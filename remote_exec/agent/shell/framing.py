"""How one run is framed for the shell, and how its end is found again in the shell's output.

Each run is written to the shell's stdin as two lines, both tied to a fresh random nonce::

    __rx_n=NONCE; { trap - INT; printf GO >&2; eval ' COMMAND'; } </dev/null
    __rx_s=$?; trap : INT; case ${__rx_n-} in NONCE) __rx_n=; printf DONE; printf EXIT $__rx_s >&2;; esac

The first runs the command in the shell itself (so ``cd``, variables and functions persist),
with stdin from ``/dev/null`` (or the run's input file) so a reading command cannot eat the
next run's text. ``eval`` parses the command as one string: an unmatched quote is a syntax
error (status 2), not a continuation prompt waiting for more input forever.

The second line, the *finish line*, prints a DONE sentinel on stdout and an EXIT sentinel with
``$?`` on stderr. It is written once the GO sentinel shows that the shell runs the first line,
so it is still in the pipe when the command ends: sh (unlike bash) discards input it had
already buffered when an error or an interrupt aborts a command line. The shell's stdout and
stderr are separate pipes, so one sentinel can arrive before the other; a run completes only
when both were seen, which is what guarantees that the run's last stdout bytes are never lost.
The ``case`` guard prints the sentinels once per run, so the finish line can be written again
after an interrupt (which makes the shell discard the rest of the line it was running) without
ever printing them twice.

Between runs the shell catches SIGINT with a no-op trap, so an interrupt that lands while the
shell parses a frame cannot cut it in half; the frame restores the interactive handling
(``trap - INT``) and then prints GO, after which an interrupt aborts the command line as
Ctrl-C does in a terminal. The finish line holds no quotes, so even a line cut by an interrupt
cannot open a quote that would swallow the next frame.

The sentinels are printed from pieces (``printf __RX_%s_%s__ DONE NONCE``), so they never
appear whole in the script text: ``set -x`` or ``set -v`` output cannot fake them.
"""

from __future__ import annotations

import secrets

__all__ = ["Frame", "MarkerScanner", "finish_line", "frame_script", "init_script", "new_nonce"]

DIGIT = ord("#")  # in a marker template, matches one ASCII digit (the exit code)


def new_nonce() -> str:
    """A fresh nonce: 16 hex digits, so user output never contains a sentinel by accident."""
    return secrets.token_hex(8)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _marker(kind: str, nonce: str) -> bytes:
    return f"__RX_{kind}_{nonce}__".encode()


def _exit_template(nonce: str) -> bytes:
    return f"__RX_EXIT_{nonce}_###__".encode()


def init_script(bash: bool) -> bytes:
    """The shell's first line: no prompts, no history, and SIGINT caught while idle."""
    if bash:
        # History expansion would turn "!" in commands into errors; a history file is a leak.
        return b"PS1=; PS2=; PS0=; unset PROMPT_COMMAND HISTFILE MAILCHECK; set +H +o history; trap : INT\n"
    return b"PS1=; PS2=; trap : INT\n"


def frame_script(nonce: str, command: str, stdin_path: str | None) -> bytes:
    """The line that runs ``command`` once; :func:`finish_line` follows once it started."""
    source = "/dev/null" if stdin_path is None else _quote(stdin_path)
    # The leading space keeps a command starting with "-" from being read as an option of eval.
    go = f"printf __RX_%s_%s__ GO {nonce} >&2"
    return f"__rx_n={nonce}; {{ trap - INT; {go}; eval {_quote(' ' + command)}; }} <{source}\n".encode()


def finish_line(nonce: str) -> bytes:
    """The line that prints the run's sentinels; harmless to write again (after an interrupt)."""
    return (
        f"__rx_s=$?; trap : INT; case ${{__rx_n-}} in {nonce}) __rx_n=; printf __RX_%s_%s__ DONE {nonce}; "
        f"printf __RX_%s_%s_%03d__ EXIT {nonce} $__rx_s >&2;; esac\n"
    ).encode()


class MarkerScanner:
    """Finds markers in one stream, in order, and separates them from the bytes around them.

    A marker the stream might be in the middle of (a possible prefix at the end of what arrived
    so far) is held back until the next bytes decide, so no part of a sentinel split across two
    reads ever reaches the user. ``drop_tail`` is held back the same way whenever the stream
    ends with it, and dropped if the stream then ends (bash's "exit" echo on the way out).
    """

    def __init__(self, markers: list[bytes], drop_tail: bytes = b"") -> None:
        self._markers = markers
        self._drop_tail = drop_tail
        self._held = b""
        self.found: list[bytes] = []

    @property
    def done(self) -> bool:
        """True once every marker was found."""
        return len(self.found) == len(self._markers)

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Scan ``data``; return (visible bytes, bytes after the last marker once it was found)."""
        if self.done:
            return b"", data
        buf = self._held + data if self._held else data
        self._held = b""
        visible: list[bytes] = []
        while not self.done:
            template = self._markers[len(self.found)]
            hit, partial = _search(buf, template)
            if hit < 0:
                keep = partial if partial >= 0 else len(buf) - _prefix_tail(buf, template)
                if self._drop_tail and buf.endswith(self._drop_tail):
                    keep = min(keep, len(buf) - len(self._drop_tail))
                visible.append(buf[:keep])
                self._held = buf[keep:]
                return b"".join(visible), b""
            visible.append(buf[:hit])
            self.found.append(buf[hit : hit + len(template)])
            buf = buf[hit + len(template) :]
        return b"".join(visible), buf

    def flush(self) -> bytes:
        """The stream ended: release what was held back (minus ``drop_tail``)."""
        held, self._held = self._held, b""
        if self._drop_tail and held.endswith(self._drop_tail):
            held = held[: -len(self._drop_tail)]
        return held


def _matches(buf: bytes, at: int, template: bytes) -> bool:
    """Whether ``buf[at:]`` agrees with ``template`` as far as both go."""
    for i in range(min(len(template), len(buf) - at)):
        want, got = template[i], buf[at + i]
        if want != got and not (want == DIGIT and 0x30 <= got <= 0x39):
            return False
    return True


def _search(buf: bytes, template: bytes) -> tuple[int, int]:
    """(offset of a whole match or -1, offset of a match cut off by the end of ``buf`` or -1)."""
    head = template.split(b"#", 1)[0]
    at = buf.find(head)
    while at >= 0:
        if _matches(buf, at, template):
            if len(buf) - at >= len(template):
                return at, -1
            return -1, at
        at = buf.find(head, at + 1)
    return -1, -1


def _prefix_tail(buf: bytes, template: bytes) -> int:
    """Length of the longest end of ``buf`` that is a proper prefix of the template's fixed head."""
    head = template.split(b"#", 1)[0]
    for k in range(min(len(head) - 1, len(buf)), 0, -1):
        if buf.endswith(head[:k]):
            return k
    return 0


class Frame:
    """The sentinels of one framed run, and the scanners looking for them in stdout and stderr."""

    def __init__(self, nonce: str, drop_exit_echo: bool) -> None:
        self.nonce = nonce
        self.finish_sent = False
        self._out = MarkerScanner([_marker("DONE", nonce)])
        # An interactive bash prints "exit" on stderr when `exit` ends it: not the user's output.
        self._err = MarkerScanner(
            [_marker("GO", nonce), _exit_template(nonce)], drop_tail=b"exit\n" if drop_exit_echo else b""
        )

    @property
    def started(self) -> bool:
        """The shell began running the command: an interrupt now reaches it."""
        return bool(self._err.found)

    @property
    def complete(self) -> bool:
        """Both sentinels were seen: every byte the command wrote is accounted for."""
        return self._out.done and self._err.done

    @property
    def exit_code(self) -> int | None:
        """The command's ``$?``, once the EXIT sentinel was seen."""
        if not self._err.done:
            return None
        return int(self._err.found[-1][-5:-2])

    def feed(self, fd: int, data: bytes) -> tuple[bytes, bytes]:
        """(the user's bytes, bytes after this stream's last sentinel) of a chunk of ``fd``."""
        return (self._out if fd == 1 else self._err).feed(data)

    def flush(self, fd: int) -> bytes:
        """Stream ``fd`` ended: the bytes it was holding back."""
        return (self._out if fd == 1 else self._err).flush()
