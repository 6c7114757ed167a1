"""Smoke test of ``bench/widgets.py --quick``: it runs, prints its table and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_widget_bench_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "widgets.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "widgets.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["bench"] == "widgets" and report["passed"], report
    for r in report["results"].values():
        assert r["max_messages_in_1s"] <= 10
        assert r["output_bytes"] > 0 and r["traffic_bytes"] > 0
    assert "B/out B" in proc.stdout
