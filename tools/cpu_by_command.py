"""Where a run's CPU went, by command line: process accounting joined to ``forkstat``'s exits.

The CI machine's cores are saturated through a whole ``make test``, so its wall time is CPU;
this finds what spends it (how it found the uncached bytecode and the Earley parser, see the
CHANGELOG). Record a run as root, then read it::

    touch /tmp/pacct && accton /tmp/pacct && (forkstat -e exit -g -x > /tmp/forkstat.log &)
    make test; accton off; pkill forkstat
    python tools/cpu_by_command.py /tmp/pacct /tmp/forkstat.log [REGEX]

Each accounted process (its CPU at exit) is named by the command line ``forkstat`` printed at
that pid's exit nearest its end (pids are reused in a long run); paths under /tmp and long
numbers are folded so that repeated commands add up. REGEX keeps the matching lines only. (Times
are matched by second of the day: a run across midnight is read in two.)
"""

from __future__ import annotations

import collections
import datetime
import re
import subprocess
import sys

FOLD = re.compile(r"/tmp/\S+|\d{3,}|[0-9a-f]{12,}")


def exits(forkstat_log: str) -> dict[int, list[tuple[int, str]]]:
    """Each pid's exits: (second of the day, command line)."""
    found: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    with open(forkstat_log, errors="replace") as f:
        for line in f:
            parts = line.split(None, 3)
            tail = re.search(r"⇥\s+\S+\s+\S+\s+(.*)", line)
            if len(parts) == 4 and parts[1] == "exit" and tail and parts[2].isdigit():
                h, m, s = map(int, parts[0].split(":"))
                found[int(parts[2])].append((h * 3600 + m * 60 + s, tail.group(1).strip()))
    return found


def cpu_by_command(pacct: str, forkstat_log: str) -> dict[str, float]:
    """CPU seconds per folded command line (``?comm``: no exit of that pid near its end)."""
    named = exits(forkstat_log)
    cpu: dict[str, float] = collections.defaultdict(float)
    dump = subprocess.run(["dump-acct", pacct], capture_output=True, text=True, check=True).stdout
    for line in dump.splitlines():
        f = [x.strip() for x in line.rsplit("|", 14)]  # from the right: a command name may hold a |
        start = datetime.datetime.strptime(f[-1], "%a %b %d %H:%M:%S %Y")
        end = start.hour * 3600 + start.minute * 60 + start.second + float(f[4]) / 100
        near = min(named.get(int(f[9]), []), key=lambda e: abs(e[0] - end), default=(0, ""))
        command = near[1] if abs(near[0] - end) < 3 else "?" + f[0]
        cpu[FOLD.sub("X", command)[:140]] += (float(f[2]) + float(f[3])) / 100  # centiseconds
    return cpu


def main() -> None:
    cpu = cpu_by_command(sys.argv[1], sys.argv[2])
    keep = re.compile(sys.argv[3] if len(sys.argv) > 3 else "")
    shown = sorted(((c, s) for c, s in cpu.items() if keep.search(c)), key=lambda cs: -cs[1])
    print(f"{sum(s for _, s in shown):.1f} s of CPU")
    for command, seconds in shown[:60]:
        print(f"{seconds:8.1f} s  {command}")


if __name__ == "__main__":
    main()
