"""The widgets' front-end files: their text when installed, files anywidget hot-reloads in a checkout."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anywidget
import pytest

from remote_exec.jupyter._assets import STATIC, WatchedFiles

ROOT = Path(__file__).resolve().parents[2]
TYPES = "from remote_exec.jupyter import Dashboard, JobView, ShellView as S\n" + (
    "print(*(type(getattr(c, k)).__name__ for c in (Dashboard, JobView, S) for k in ('_esm', '_css')))"
)


def _class_attribute_types(hmr: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ANYWIDGET_HMR"}
    if hmr is not None:
        env["ANYWIDGET_HMR"] = hmr
    out = subprocess.run([sys.executable, "-c", TYPES], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_files_live_in_the_package() -> None:
    assert STATIC == ROOT / "remote_exec" / "jupyter" / "static"
    assert not list(ROOT.glob("widgets/*.js"))  # the old second place is gone


def test_text_by_default_watched_files_with_anywidget_hmr_in_a_checkout() -> None:
    assert _class_attribute_types(None) == ["str"] * 6
    assert _class_attribute_types("1") == ["WatchedFiles"] * 6


@pytest.fixture
def files(tmp_path: Path) -> Iterator[tuple[Path, Path, WatchedFiles]]:
    common, own = tmp_path / "common.js", tmp_path / "w.js"
    common.write_text("const A = 1;")
    own.write_text("export default { render() {} };")
    watched = WatchedFiles(common, own)
    yield common, own, watched
    watched.stop_thread()


def _until_changed(watched: WatchedFiles, path: Path, text: str) -> list[str]:
    """Rewrite ``path`` as an editor saves (new file renamed over it) until ``changed`` fires.

    The watcher starts in its thread: a save before it listens is not seen, hence the retries.
    """
    seen: list[str] = []
    fired = threading.Event()

    def on_change(contents: str) -> None:
        seen.append(contents)
        fired.set()

    watched.changed.connect(on_change)
    deadline = time.monotonic() + 20
    while not fired.is_set() and time.monotonic() < deadline:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        fired.wait(0.5)
    assert fired.is_set(), "no change reported within 20 s"
    return seen


def synced(w: anywidget.AnyWidget) -> object:
    """The ``_esm`` the front end gets (the trait anywidget made of the class attribute)."""
    return w.get_state("_esm")["_esm"]


def test_an_atomic_save_of_either_file_reaches_the_widget(files: tuple[Path, Path, WatchedFiles]) -> None:
    common, own, watched = files

    class Probe(anywidget.AnyWidget):
        _esm = watched

    w = Probe()
    try:
        assert synced(w) == "const A = 1;\nexport default { render() {} };"
        seen = _until_changed(watched, common, "const A = 2;")
        assert seen[-1] == "const A = 2;\nexport default { render() {} };"
        assert synced(w) == seen[-1]  # anywidget pushed the new text into the synced trait
        seen = _until_changed(watched, own, "export default {};")
        assert synced(w) == "const A = 2;\nexport default {};"
    finally:
        w.close()


# -- the bundle built from npm packages (make widgets) ---------------------------------------------

JS = ROOT / "js"
BUNDLE_INPUTS = re.compile(r"export const INPUTS = \[([^\]]*)\];")


def _inputs_digest() -> str:
    """js/build.mjs's hash of its inputs, recomputed (the list is read from build.mjs itself)."""
    found = BUNDLE_INPUTS.search((JS / "build.mjs").read_text())
    assert found, "js/build.mjs no longer lists its INPUTS"
    digest = hashlib.sha256()
    for name in re.findall(r'"([^"]+)"', found.group(1)):
        digest.update(f"{name}\0".encode())
        digest.update((JS / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@pytest.mark.parametrize("suffix", [".js", ".css"])
def test_the_committed_terminal_bundle_is_built_from_the_committed_inputs(suffix: str) -> None:
    """Editing js/ (a source, the lockfile, the build script) without `make widgets` fails here."""
    head = (STATIC / f"terminal_view{suffix}").read_text(encoding="utf-8")[:400]
    found = re.search(r"inputs sha256:([0-9a-f]{64})", head)
    assert found, f"terminal_view{suffix} has no inputs hash in its header"
    assert found.group(1) == _inputs_digest(), f"terminal_view{suffix} is stale: run `make widgets`"
    assert "Permission is hereby granted" in (STATIC / f"terminal_view{suffix}").read_text()[:3000]  # MIT notice


# -- the prebuilt JupyterLab extension (make labextension) -----------------------------------------

LABEXT = ROOT / "labextension"
LABEXT_INPUTS = re.compile(r"^INPUTS = \[([^\]]*)\]$", re.M)


def test_the_committed_labextension_is_built_from_the_committed_inputs() -> None:
    """Editing labextension/ (its source, style, package.json, lockfile) without `make labextension`
    fails here; so does a build whose entry point is missing."""
    found = LABEXT_INPUTS.search((ROOT / "tools" / "build_labextension.py").read_text())
    assert found, "tools/build_labextension.py no longer lists its INPUTS"
    digest = hashlib.sha256()
    for name in re.findall(r'"([^"]+)"', found.group(1)):
        digest.update(f"{name}\0".encode())
        digest.update((LABEXT / name).read_bytes())
        digest.update(b"\0")
    stamp = (LABEXT / "built.sha256").read_text().strip()
    assert stamp == digest.hexdigest(), "labextension/built is stale: run `make labextension`"
    built = json.loads((LABEXT / "built" / "package.json").read_text())
    source = json.loads((LABEXT / "package.json").read_text())
    build = built["jupyterlab"].pop("_build")
    assert built == source  # the builder copies package.json and adds only where the bundle is
    assert (LABEXT / "built" / build["load"]).is_file()
