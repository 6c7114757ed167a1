"""A shell session's output, sorted: each run's bytes to its run, the sentinels found, the rest
kept for the next run; and the record that tells the next agent where to read on.

The shell writes its stdout and stderr into the session's files (:mod:`.follow`); this reads
them through the current run's :class:`~.framing.Frame`. Output between runs (a background job
writing late) is kept, up to :data:`STRAY_LIMIT` per stream, and handed to the next run, as a
terminal would show it at the next prompt.

**The record and the disk.** The record (:mod:`.record`) names the run in progress and the
offsets its output starts at, written before its line is sent. A durable session's run copies
its visible output into a job dir of its own (:mod:`.runlog`): capped as a job's, kept after the
run as a finished job's. So the session's ``out``/``err`` need to keep only what the next agent
would re-read: every :data:`DROP_STEP` bytes of a run the record takes a *checkpoint* (the file
offsets up to which the framing has passed everything on, and how many visible bytes the run
had by then), and the files' heads before it are punched out; between runs the same happens at
the offsets a next run's stray head starts at. A re-adopted run reads on from its checkpoint
and skips the visible bytes its log holds already, so nothing is written to it twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..jobs.logfile import Inotify
from .follow import DROP_STEP, ShellFiles
from .framing import Frame
from .run import ShellRun
from .store import SessionStore

__all__ = ["STRAY_LIMIT", "ShellOutput", "run_record"]

STRAY_LIMIT = 1 << 20  # bytes of between-runs output kept for the next run, per stream


class ShellOutput:
    """The output side of one session, shared by the session as its core object.

    :ivar files: the session's files being read (None before the shell runs).
    :ivar frame: the frame being looked for (the current run's, or the first one's), or None.
    :ivar run: the run whose frame is being read.
    :ivar identity: what the record says of the session besides its output (its id, argv,
        pid, start time, marker, temporary dir, creation time), set once it has a shell.
    """

    def __init__(
        self,
        store: SessionStore,
        deliver_startup: Callable[[int, bytes], None],
        after_feed: Callable[[Frame], None],
        on_complete: Callable[[int | None], None],
    ) -> None:
        self.files: ShellFiles | None = None
        self.frame: Frame | None = None
        self.run: ShellRun | None = None
        self.identity: dict[str, Any] = {}
        self._store = store
        self._deliver_startup = deliver_startup  # output of no run (the first frame's): startup noise
        self._after_feed = after_feed
        self._on_complete = on_complete
        self._stray = {1: bytearray(), 2: bytearray()}
        self._run_rec: dict[str, Any] | None = None  # the current run's record (its checkpoints)
        self._kept_from = 0  # the files' offsets (summed) of the last checkpoint: what is kept

    def follow(self, path: Path, pos: tuple[int, int], pid: int, inotify: Inotify | None) -> None:
        """Read the output files in ``path`` from ``pos`` on (from the next turn of the loop).

        :raises OSError: a file is missing.
        :raises ValueError: ``pos`` is no offset (a record's, which the shell's user may write).
        """
        if min(pos) < 0:
            raise ValueError(f"offsets {pos} are not a file's")
        self.files = ShellFiles(path, pos, pid, self._on_data, inotify)
        self.files.open()
        self._kept_from = pos[0] + pos[1]

    def save(self, run: dict[str, Any] | None) -> None:
        """Write the record (durable sessions only): where the next agent picks the session up.

        :raises OSError: the disk is full.
        """
        if self.files is None:
            return
        idle = [self.files.pos[fd] - len(self._stray[fd]) for fd in (1, 2)]
        self._store.save({**self.identity, "idle": idle, "run": run})

    def begin_run(self, run: ShellRun, frame: Frame) -> None:
        """Record ``run`` (before its line is sent), hand it the stray bytes, look for ``frame``.

        :raises OSError: the record cannot be written (the disk is full): nothing changed.
        """
        files = self.files
        assert files is not None
        run_rec = run_record(run, frame.public, self._stray, files.pos)
        run_rec["log"] = True  # always now; an older agent reading this record still looks for it
        run_rec["stdin"] = run.feed is not None
        self.save(run_rec)  # before the line is sent: an agent killed after that finds the run on disk
        self._run_rec = run_rec
        # Nothing before this run's first stray byte is read again, by this agent or the next.
        kept = (files.pos[1] - len(self._stray[1]), files.pos[2] - len(self._stray[2]))
        files.drop_before(kept)
        self._kept_from = sum(kept)
        for fd, stray in self._stray.items():
            if stray:
                run.deliver(fd, bytes(stray))
                stray.clear()
        self.run = run
        self.frame = frame

    def resume_run(self, run: ShellRun, frame: Frame, run_rec: dict[str, Any]) -> None:
        """Go on with the run an earlier agent recorded (the files followed from its checkpoint,
        or its start), its log re-opened by its maker: from its checkpoint its log holds what
        came before; from its start its stray head is re-read and its log's bytes skipped."""
        files = self.files
        assert files is not None
        start, stray, ck = run_rec["start"], run_rec["stray"], run_rec.get("ck")
        self.run, self.frame, self._run_rec = run, frame, run_rec
        if ck is not None:
            frame.resume_started()
            for fd in (1, 2):  # the log holds these already (written after the checkpoint)
                logged = int(ck["logged"][fd - 1])
                if logged < 0:
                    raise ValueError(f"a checkpoint at {logged} is not a log's")
                run.log.skip[fd] = max(0, run.log.files[fd].end - logged)
        else:
            for fd in (1, 2):
                head = files.replay(fd, int(stray[fd - 1]), int(start[fd - 1]), STRAY_LIMIT)
                if head:
                    run.deliver(fd, head)
        run.begin(elapsed=max(0.0, time.time() - run.started_at))

    def end_run(self) -> ShellRun | None:
        """The frame is over (complete, or the shell gone): look for none; return its run."""
        run, self.run = self.run, None
        self.frame = None
        self._run_rec = None
        return run

    def flush(self) -> None:
        """The shell exited: read the files to the end and let out what the frame held back."""
        if self.files is not None:
            self.files.drain()  # the files hold all the shell wrote: read it to the end
        if self.frame is not None:
            for fd in (1, 2):
                held = self.frame.flush(fd)
                if held:
                    self._deliver(fd, held)

    def close(self) -> None:
        """Stop reading the files."""
        if self.files is not None:
            self.files.close()

    # -- file callbacks (event loop) ------------------------------------------------------------

    def _on_data(self, fd: int, data: bytes) -> None:
        frame = self.frame
        if frame is None:
            self._keep_stray(fd, data)
            self.checkpoint_idle()
            return
        visible, rest = frame.feed(fd, data)
        if visible:
            self._deliver(fd, visible)
            if self.run is not None:
                self._checkpoint(frame, self.run)
        self._after_feed(frame)
        if rest:
            self._keep_stray(fd, rest)
        if frame.complete:
            self._on_complete(frame.exit_code)

    def _deliver(self, fd: int, data: bytes) -> None:
        if self.run is not None:
            self.run.deliver(fd, data)
        else:
            self._deliver_startup(fd, data)

    def _keep_stray(self, fd: int, data: bytes) -> None:
        stray = self._stray[fd]
        stray += data
        if len(stray) > STRAY_LIMIT:
            del stray[: len(stray) - STRAY_LIMIT]

    def _checkpoint(self, frame: Frame, run: ShellRun) -> None:
        """Every :data:`DROP_STEP` bytes of a run: record how far the framing got, and punch the
        files' heads before it (the run's log holds what they said). See the module docstring."""
        files = self.files
        if files is None or self._run_rec is None or not frame.midway:
            return
        at = [files.pos[fd] - frame.held(fd) for fd in (1, 2)]
        if sum(at) - self._kept_from < DROP_STEP:
            return
        rec = {**self._run_rec, "ck": {"at": at, "logged": run.log.logged()}}
        try:
            self.save(rec)
        except OSError:
            return  # a full disk: the files keep their heads until a record can be written
        self._run_rec = rec
        self._kept_from = sum(at)
        files.drop_before((at[0], at[1]))

    def checkpoint_idle(self) -> None:
        """Between runs, every :data:`DROP_STEP` bytes of late output, and once a run is over
        (its log and end saved): record the offsets the kept stray bytes start at, and punch
        the files' heads before them. At a run's end this drops what its last checkpoints left
        (a run read in few, large pieces on a loaded machine kept up to its whole output)."""
        files = self.files
        if files is None or self.run is not None or self.frame is not None:
            return
        idle = [files.pos[fd] - len(self._stray[fd]) for fd in (1, 2)]
        if sum(idle) - self._kept_from < DROP_STEP:
            return
        try:
            self.save(None)
        except OSError:
            return
        self._kept_from = sum(idle)
        files.drop_before((idle[0], idle[1]))


def run_record(run: ShellRun, public: str, stray: dict[int, bytearray], pos: dict[int, int]) -> dict[str, Any]:
    """What the next agent needs of a run about to begin: who it is and where its output starts
    (its stray head at ``stray``, its frame at ``start``); its secret is *not* here."""
    return {
        "job_id": run.job_id,
        "params": run.params.model_dump(mode="json", exclude_none=True),
        "public": public,
        "stray": [pos[fd] - len(stray[fd]) for fd in (1, 2)],
        "start": [pos[1], pos[2]],
        "started_at": run.started_at,
        "started_boot": run.started_boot,
    }
