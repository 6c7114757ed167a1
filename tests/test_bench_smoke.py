"""Smoke test of the benchmark suite: ``bench/run.py --quick --only first_byte`` runs and writes JSON.

Benchmarks are not tests; this only guards the runner against rotting (imports, CLI, output).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick_first_byte_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "results" / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--quick",
            "--only",
            "first_byte",
            "--no-inspect",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    report = json.loads(out.read_text())
    assert report["errors"] == []
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["python"] and report["machine"]["kernel"]
    rows = report["results"]
    assert rows and all(r["bench"] == "first_byte" for r in rows)
    for row in rows:
        assert row["unit"] == "ms"
        assert row["ours"]["n"] > 0 and 0 < row["ours"]["median"] <= row["ours"]["p90"]
        assert row["subprocess"]["median"] > 0
        assert row["passed"] in (True, False)
    assert "first byte" in proc.stdout  # the table was printed


def test_bench_pty_writes_json(tmp_path: Path) -> None:
    """``bench/pty.py`` (PTY throughput) runs end to end on a tiny stream and writes its report."""
    out = tmp_path / "pty.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pty.py"), "--mib", "2", "--reps", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"tty", "plain", "bare_pty"}
    assert all(r["mb_s_median"] > 0 for r in results.values())
