"""``PortForward.browser_url``: the URL a notebook's browser can reach, read from the environment a
Jupyter server gives its kernels (``remote_exec/client/browser.py``). The real server and proxy are
in tests/jupyter/test_browser.py; here each rule on its own, with the environment set as each
server sets it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from remote_exec.client.browser import BROWSER_URL_ENV, browser_url, jupyter_base_url

SERVER_VARS = ("JUPYTERHUB_SERVICE_PREFIX", "JPY_SESSION_NAME", BROWSER_URL_ENV)


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in SERVER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))


def test_outside_jupyter_the_url_is_the_local_listener() -> None:
    assert jupyter_base_url() is None
    assert browser_url(4321) == "http://127.0.0.1:4321"


def test_jupyterhub_and_binder_go_through_the_users_server_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jupyter_server_proxy")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice")  # as Binder sets it (with or without "/")
    assert browser_url(4321) == "/user/alice/proxy/4321/"


def test_a_kernel_of_a_jupyter_server_reads_its_base_url_from_the_servers_runtime_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("jupyter_server_proxy")
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/work.ipynb")
    assert browser_url(4321) == "/proxy/4321/"  # no runtime file: the default base URL
    info = {"base_url": "/lab-base/", "url": "http://127.0.0.1:8888/lab-base/", "pid": os.getppid()}
    (tmp_path / f"jpserver-{os.getppid()}.json").write_text(json.dumps(info))
    assert jupyter_base_url() == "/lab-base/"
    assert browser_url(4321) == "/lab-base/proxy/4321/"
    (tmp_path / f"jpserver-{os.getppid()}.json").write_text('{"base_url": "http://evil/"}')
    assert browser_url(4321) == "/proxy/4321/"  # only a path is taken from the file


def test_without_jupyter_server_proxy_the_url_stays_local(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "jupyter_server_proxy" else real(name, *a)
    )
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    assert browser_url(4321) == "http://127.0.0.1:4321"


def test_the_environment_variable_overrides_the_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    monkeypatch.setenv(BROWSER_URL_ENV, "local")
    assert browser_url(4321) == "http://127.0.0.1:4321"
    monkeypatch.setenv(BROWSER_URL_ENV, "https://lab.example/ports/{port}/")
    assert browser_url(4321) == "https://lab.example/ports/4321/"
