"""``TransferResult``: what an upload or download did, and its one line for people."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TransferResult", "human_size"]


@dataclass
class TransferResult:
    """What an upload or download did.

    :ivar files_sent: files copied (new or changed).
    :ivar bytes_sent: their bytes.
    :ivar files_unchanged: files already there with the same size, mode and mtime (not sent).
    :ivar dirs_created: directories made on the receiving side.
    :ivar ignored: entries left out by the ignore rules (an ignored directory counts once).
    :ivar ignored_paths: those entries, relative to the tree's top (a directory ends in ``/``).
    :ivar deleted: with ``delete=True``, what was removed on the receiving side because the
        sending side has it no more (a removed directory is one entry, ending in ``/``).
    :ivar skipped: symlinks and special files, which are not transferred.
    :ivar seconds: wall time.
    """

    files_sent: int = 0
    bytes_sent: int = 0
    files_unchanged: int = 0
    dirs_created: int = 0
    ignored: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ignored_paths: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def describe(self, verb: str = "sent") -> str:
        """One line for people: ``sent 3 files (1.2 MiB) in 0.4 s; 7 unchanged, 12 ignored``."""
        extra = [f"{self.files_unchanged} unchanged", f"{self.ignored} ignored"]
        if self.deleted:
            extra.append(f"{len(self.deleted)} deleted")
        if self.skipped:
            extra.append(f"{len(self.skipped)} symlinks/special files skipped")
        files = "1 file" if self.files_sent == 1 else f"{self.files_sent} files"
        return f"{verb} {files} ({human_size(self.bytes_sent)}) in {self.seconds:.1f} s; " + ", ".join(extra)

    @property
    def mb_per_s(self) -> float:
        """Throughput of the bytes sent, in decimal MB per second."""
        return self.bytes_sent / self.seconds / 1e6 if self.seconds > 0 else 0.0


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
