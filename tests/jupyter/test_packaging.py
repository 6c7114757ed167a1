"""The notebook face ships its front-end files in the wheel and stays out of everyone else's way."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ..venvs import install, make_venv

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "remote_exec" / "jupyter" / "static"
WIDGET_FILES = sorted(p.name for p in STATIC.iterdir() if p.suffix in (".js", ".css"))
DIST = "remote-exec-sandbox"  # the distribution's name on PyPI; the import name stays remote_exec
KERNEL_CELLS = [
    "import importlib.metadata, remote_exec\n"
    f"print('DIST', importlib.metadata.version({DIST!r}), remote_exec.__file__)",
    "%load_ext remote_exec",
    "%%exec_remote\necho hello from $((6 * 7))",
    "from remote_exec.jupyter import JobView as J\nprint('ESM', type(J._esm).__name__, 'export default' in J._esm)",
]


def test_every_widget_has_its_js_and_css() -> None:
    from remote_exec.jupyter import Dashboard, JobView, ShellView

    for name in ("common", "job_view", "dashboard", "shell_view"):
        assert f"{name}.js" in WIDGET_FILES and f"{name}.css" in WIDGET_FILES
    for cls, name in ((JobView, "job_view"), (Dashboard, "dashboard"), (ShellView, "shell_view")):
        assert (STATIC / f"{name}.js").read_text() in str(cls._esm)
        assert (STATIC / "common.js").read_text() in str(cls._esm)
        assert (STATIC / f"{name}.css").read_text() in str(cls._css)
        assert "export default" in str(cls._esm)


def _kernel_outputs(python: Path, jupyter_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run KERNEL_CELLS in a kernel of ``python`` (its own kernelspec, in ``jupyter_path``)."""
    spec = jupyter_path / "kernels" / "clean" / "kernel.json"
    spec.parent.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.write_text(json.dumps({"argv": argv, "display_name": "clean venv", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in KERNEL_CELLS])
    # Not the checkout's directory: the kernel imports from its working directory first.
    resources = {"metadata": {"path": str(jupyter_path)}}
    NotebookClient(nb, timeout=120, kernel_name="clean", resources=resources).execute()
    return "\n".join(o.get("text", "") for cell in nb.cells for o in cell.get("outputs", []))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_installs_by_its_name_and_loads_in_a_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built, installed with its extra in a fresh venv, imported there, ``%load_ext`` run in its kernel."""
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "dist")],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(DIST.replace("-", "_") + "-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        assert f"Name: {DIST}\n" in z.read(metadata).decode()
    for name in WIDGET_FILES:
        assert f"remote_exec/jupyter/static/{name}" in names
    assert "remote_exec/py.typed" in names
    # the server extension that saves job records in place of widgets, enabled where pip installs it
    assert any(n.endswith(".data/data/etc/jupyter/jupyter_server_config.d/remote_exec.json") for n in names)
    # and the route that carries the widgets' controls past a busy kernel (control_route.py)
    assert any(n.endswith(".data/data/etc/jupyter/jupyter_server_config.d/remote_exec_controls.json") for n in names)
    assert not any(n.startswith("remote_exec/_widgets") for n in names)  # one place only
    # the prebuilt JupyterLab extension, where JupyterLab looks for extensions pip installed
    lab_ext = ".data/data/share/jupyter/labextensions/remote-exec/"
    for name in ("package.json", "install.json", "static/style.js"):
        assert any(n.endswith(lab_ext + name) for n in names), name

    env_dir = tmp_path / "venv"
    python = make_venv(env_dir)
    done = install(python, f"{DIST}[jupyter] @ {wheel.as_uri()}", "ipykernel", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    agents = Path(tempfile.mkdtemp(prefix="rx-pkg-", dir="/tmp"))  # an agent socket path stays short
    monkeypatch.setenv("REMOTE_EXEC_AGENT_DIR", str(agents / "agent"))
    monkeypatch.setenv("REMOTE_EXEC_NONINTERACTIVE", "1")  # plain text: the outputs are streams
    monkeypatch.delenv("ANYWIDGET_HMR", raising=False)
    try:
        out = _kernel_outputs(python, tmp_path / "jupyter", monkeypatch)
    finally:
        _stop_agents(agents)
        shutil.rmtree(agents, ignore_errors=True)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    assert f"DIST {_version()} {site / 'remote_exec' / '__init__.py'}" in out, out
    assert "hello from 42" in out and "exit code: 0" in out, out
    assert "ESM str True" in out, out  # installed: the module's text, nothing watched
    assert (env_dir / "etc" / "jupyter" / "jupyter_server_config.d" / "remote_exec.json").is_file()
    controls = env_dir / "etc" / "jupyter" / "jupyter_server_config.d" / "remote_exec_controls.json"
    assert json.loads(controls.read_text()) == {
        "ServerApp": {"jpserver_extensions": {"remote_exec.jupyter.control_route": True}}
    }
    # JupyterLab (this one: the fresh venv has no JupyterLab) sees it there, enabled, no build step
    listed = subprocess.run(
        [sys.executable, "-m", "jupyterlab.labextensions", "list"],
        env={**os.environ, "JUPYTER_PATH": str(env_dir / "share" / "jupyter")},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)  # its colours
    found = re.search(
        rf"{re.escape(str(env_dir))}\S*labextensions\n\s+remote-exec v\S+ enabled OK \(python, {DIST}\)", text
    )
    assert found, text


def _version() -> str:
    from remote_exec import __version__

    return __version__


def _stop_agents(scratch: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from run_notebooks import stop_agents
    finally:
        sys.path.remove(str(ROOT / "tools"))
    stop_agents(scratch)


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


def test_load_ext_without_the_extra_names_what_to_install_where() -> None:
    code = (
        "import sys; sys.modules['anywidget'] = None  # as in a kernel env without the jupyter extra\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().extension_manager.load_extension('remote_exec')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        "ImportError: %load_ext remote_exec needs the jupyter extra in this kernel's environment (no anywidget): "
        f"{sys.executable} -m pip install '{DIST}[jupyter]'"
    ), out.stderr
