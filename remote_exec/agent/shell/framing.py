r"""How one run is framed for the shell, and how its end is found again in the shell's output.

The command runs *in* the shell process (so ``cd``, variables and functions persist), so it can
do whatever the shell can: read its variables, its descriptors, its input. The end of a run is
therefore marked with a secret the command cannot reach. Each run is ONE line on the shell's
stdin (bash shown; sh is the same without the bash-only parts)::

    HEAD; \printf __RX_%s_%s__ GO PUBLIC >&2; \command eval ' COMMAND' </dev/null; TAIL
    TAIL = case ${__rx_g-} in PUBLIC) ;; *) __rx_s=$? ...reset the shell...;
           __rx_g=PUBLIC && \printf DONE SECRET && \printf EXIT SECRET $__rx_s >&2;; esac

**Where the secret lives.** In the agent's memory (derived from the session's key and the
run's public id: see :mod:`.record`, which is how the next agent finds it again), and in the
shell only in the text of the run's line, which the shell reads and parses
whole before it runs any of it: while the command runs, the secret is in no variable, no
environment, no argument list, no file, and not in the shell's input (nothing else is written
there until the run ends). The shell's stdin is one end of a socketpair, not a pipe: a
socket cannot be opened through ``/proc/PID/fd/0`` (ENXIO), so no process can race the shell for
the next run's line either; the command's own stdin is ``/dev/null`` (or its input file), and
the copy of the socket bash keeps on a descriptor >= 10 while the command runs is empty. The GO
sentinel, printed before the command, carries a separate *public* id, never the secret.

**What the tail undoes before it names the secret.** Code the command ran in the shell may have
left hooks that would see or change the tail: a DEBUG trap (it sees each simple command's text
in ``$BASH_COMMAND`` before it runs), RETURN/ERR traps, ``functrace``, history (which would
record the next run's line), ``set -v`` (which echoes every line read, the next run's included)
and ``set -x``, ``PROMPT_COMMAND``/``PS0``/``PS1``/``PS2`` (run or expanded around each read of
input, where they could read the next run's line), a function named ``printf``, aliases. The
tail first saves ``$?`` and the user's ``x``/``v`` flags (restored by the next run's HEAD), then
switches bash to POSIX mode by assigning ``POSIXLY_CORRECT`` (an assignment cannot be shadowed
by a function or alias), in which special builtins (``trap``, ``set``, ``unset``) are found
before functions; it checks that POSIX mode took (``$SHELLOPTS`` is read-only), resets the
traps and options, unsets a ``printf`` function and the prompt hooks, and prints the sentinels
only if every reset succeeded (a read-only ``PROMPT_COMMAND`` leaves the run unfinished rather
than the next line exposed). Command words are ``\``-quoted, so aliases never apply to them;
the shell stays in POSIX mode between runs, so reserved words (``case``) are read before
aliases too, and the HEAD restores the user's mode (``${__rx_p}``) before the command.

**Residual routes** (see docs/security.md): a process allowed to ptrace the shell (same uid,
no Yama: ``/proc/PID/mem``, ``ptrace``, ``pidfd_getfd``) can read the parsed line; and code
running *in* the shell that arms bash's own debugger (``shopt -s extdebug`` with a DEBUG trap
that returns non-zero) can skip the tail's resets, as a debugger can. Neither is a data
route; both are the shell being debugged.

**Interrupts.** Between runs the shell catches SIGINT with a no-op trap, so an interrupt that
lands while the shell parses a line cannot cut it in half; the HEAD restores the interactive
handling (``trap - INT``) and then prints GO, after which an interrupt aborts the command line
as Ctrl-C does in a terminal, tail included. The agent then writes a *recovery* line (the same
tail: :func:`recovery_lines`), again and again until the run ends; the ``case`` guard on
``__rx_g`` makes the sentinels print once per run whichever of the tail and its copies runs
first. The tail catches SIGINT again first thing, so it is never itself cut. The recovery line
is the one time the secret is in the shell's input while the run may go on: only code running
in the shell itself that ignored the SIGINT and reads bash's saved descriptor could take it
(residual, documented). The command runs under ``command eval``, so an error in a special
builtin (a syntax error, ``${x?}``) ends the command, not the line (sh would drop the tail).

The sentinels are printed from pieces (``printf __RX_%s_%s__ DONE SECRET``), so they never
appear whole in the script text: ``set -x`` or ``set -v`` output cannot show them, and the tail
turns both off before it names the secret at all. The shell's stdout and stderr are separate
pipes, so one sentinel can arrive before the other; a run completes only when both were seen,
which is what guarantees that the run's last stdout bytes are never lost.
"""

from __future__ import annotations

import secrets

__all__ = ["Frame", "MarkerScanner", "frame_script", "init_script", "new_nonce", "recovery_lines"]

DIGIT = ord("#")  # in a marker template, matches one ASCII digit (the exit code)


def new_nonce() -> str:
    """A fresh secret: 32 hex digits, unguessable, so no output contains a sentinel by accident."""
    return secrets.token_hex(16)


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


def _head(public: str, bash: bool) -> str:
    # The user's -x/-v (saved by the last tail) come back before the command, and in bash the
    # user's POSIX mode (the shell idles in POSIX mode; see the module docstring).
    # It starts with a command: after a syntax error in eval, bash 5.2 fails to see a reserved
    # word as the first word of the next line.
    head = r"\: ; case ${__rx_m-} in *x*) \set -x;; esac; case ${__rx_m-} in *v*) \set -v;; esac; \trap - INT; "
    head += f"\\printf __RX_%s_%s__ GO {public} >&2; "
    if bash:  # last: from here on, `set` and `trap` may be the user's functions again
        head += r"\set ${__rx_p:-+o} posix; "
    return head


def _tail(public: str, nonce: str, bash: bool, status: str = "$?", save_posix: bool = True) -> str:
    """Print the sentinels once per run (guard ``__rx_g``), after undoing every hook first."""
    done = f"\\printf __RX_%s_%s__ DONE {nonce}"
    exit_ = f"\\printf __RX_%s_%s_%03d__ EXIT {nonce} $__rx_s >&2"
    if bash:
        posix = " __rx_p=${POSIXLY_CORRECT+-o}" if save_posix else ""
        body = (
            f"__rx_s={status} __rx_m=$-{posix} POSIXLY_CORRECT=y; case :$SHELLOPTS: in *:posix:*) "
            r"\trap - DEBUG RETURN ERR; \trap : INT; \set +xv +o history +o functrace +o errtrace; "
            r"\unset -f printf; \unset PROMPT_COMMAND && PS0= PS1= PS2= "
            f"__rx_g={public} && {done} && {exit_};; esac"
        )
    else:
        body = (
            f"__rx_s={status} __rx_m=$-; \\trap : INT; \\set +xv; \\unset -f printf; PS1= PS2= "
            f"__rx_g={public} && {done} && {exit_}"
        )
    return f"case ${{__rx_g-}} in {public}) ;; *) {body};; esac"


def frame_script(public: str, nonce: str, command: str, stdin_path: str | None, bash: bool = True) -> bytes:
    """The one line that runs ``command`` and then prints its sentinels."""
    source = "/dev/null" if stdin_path is None else _quote(stdin_path)
    # The leading space keeps a command starting with "-" from being read as an option of eval;
    # `command eval` keeps a special builtin's error from aborting the line (and the tail).
    run = f"\\command eval {_quote(' ' + command)} <{source}"
    return f"{_head(public, bash)}{run}; {_tail(public, nonce, bash)}\n".encode()


def recovery_lines(public: str, nonce: str, bash: bool = True) -> bytes:
    """The tail again, for after an interrupt aborted the run's line; a no-op once it ran.

    In bash the first line, an assignment (which no alias or function can touch), saves ``$?``
    and enters POSIX mode before the second is even read, so the second is parsed with
    reserved words ahead of any alias the command defined.
    """
    if not bash:
        return f"{_tail(public, nonce, bash)}\n".encode()
    return f"__rx_r=$? POSIXLY_CORRECT=y\n{_tail(public, nonce, bash, '$__rx_r', save_posix=False)}\n".encode()


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
    def held(self) -> int:
        """Bytes fed but neither shown nor matched yet (a marker's possible beginning)."""
        return len(self._held)

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
    """The sentinels of one framed run, and the scanners looking for them in stdout and stderr.

    ``public`` names the run in its GO sentinel (printed before the command runs, so the
    command may see it); ``nonce`` is the secret in DONE and EXIT, which it never sees.
    """

    def __init__(self, public: str, nonce: str, drop_exit_echo: bool) -> None:
        self.public = public
        self.nonce = nonce
        self._out = MarkerScanner([_marker("DONE", nonce)])
        # An interactive bash prints "exit" on stderr when `exit` ends it: not the user's output.
        self._err = MarkerScanner(
            [_marker("GO", public), _exit_template(nonce)], drop_tail=b"exit\n" if drop_exit_echo else b""
        )

    @property
    def started(self) -> bool:
        """The shell began running the command: an interrupt now reaches it."""
        return bool(self._err.found)

    @property
    def midway(self) -> bool:
        """Started, and no end sentinel seen yet: all it holds back is :meth:`held`."""
        return self.started and not self._out.done and not self._err.done

    def held(self, fd: int) -> int:
        """Bytes of stream ``fd`` fed but held back (a sentinel's possible beginning)."""
        return (self._out if fd == 1 else self._err).held

    def resume_started(self) -> None:
        """Go on from a checkpoint taken :attr:`midway`: GO was seen (by an earlier agent)."""
        self._err.found.append(_marker("GO", self.public))

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
