"""The notebook face ships its front-end files in the wheel and stays out of everyone else's way."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WIDGET_FILES = sorted(p.name for p in (ROOT / "widgets").iterdir() if p.suffix in (".js", ".css"))


def test_every_widget_has_its_js_and_css() -> None:
    from remote_exec.jupyter import Dashboard, JobView, ShellView

    for name in ("common", "job_view", "dashboard", "shell_view"):
        assert f"{name}.js" in WIDGET_FILES and f"{name}.css" in WIDGET_FILES
    for cls, name in ((JobView, "job_view"), (Dashboard, "dashboard"), (ShellView, "shell_view")):
        assert (ROOT / "widgets" / f"{name}.js").read_text() in str(cls._esm)
        assert "export default" in str(cls._esm)


@pytest.mark.slow
def test_the_wheel_carries_the_widget_files_and_finds_them(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "dist")],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    for name in WIDGET_FILES:
        assert f"remote_exec/_widgets/{name}" in names
    code = "from remote_exec.jupyter._assets import widget_dir; print(widget_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(tmp_path / "site")},
        cwd=tmp_path,  # not the checkout: `python -c` imports from the working directory first
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == str(tmp_path / "site" / "remote_exec" / "_widgets"), out.stderr


def test_nothing_below_the_notebook_face_imports_it() -> None:
    code = (
        "import sys, remote_exec as rx\n"
        "import remote_exec.blocking, remote_exec.client.sandbox, remote_exec.sandboxes, remote_exec.fleet\n"
        "rx.connect, rx.open_sandbox\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'anywidget')"
        " or m.startswith('remote_exec.jupyter'))\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_ext_is_reachable_from_the_top_level_package() -> None:
    import remote_exec

    assert callable(remote_exec.load_ipython_extension) and callable(remote_exec.unload_ipython_extension)
