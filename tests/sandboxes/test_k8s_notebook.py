"""The notebook's Kubernetes section run against the real tier (under nbval, where no cluster is
named, that cell says it is skipped): the cells that define the probe and ``show``, then the
``k8s://`` cell with ``RX_DEMO_K8S`` naming a pod of the real API server, in a real kernel."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ..k8sreal import bed_bin, shared_real_cluster

pytestmark = pytest.mark.skipif(bed_bin() is None, reason="the real tier is not built here (make k8s-bed)")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "05-sandboxes.ipynb"


def test_the_notebooks_kubernetes_cell_runs_against_the_real_api_server(tmp_path: Path) -> None:
    cluster = shared_real_cluster()
    assert cluster is not None
    cluster.pod("rx-notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    wanted = ("PROBE = ", "def target(", 'target("RX_DEMO_K8S")')
    cells = [c for c in nb.cells if c.cell_type == "code" and any(w in c.source for w in wanted)]
    assert len(cells) == 3, [c.source[:60] for c in cells]
    nb.cells = cells
    url = f"k8s://default/rx-notebook?kubeconfig={cluster.kubeconfig}&dir={tmp_path / 'agent'}"
    env = {"RX_DEMO_K8S": url, "REMOTE_EXEC_AGENT_DIR": str(tmp_path / "local"), "REMOTE_EXEC_NONINTERACTIVE": "1"}
    client = NotebookClient(nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env={**os.environ, **env})  # the kernel's environment
    finally:
        cluster.request("DELETE", "/api/v1/namespaces/default/pods/rx-notebook")
    out = "".join(o.get("text", "") for o in cells[-1].outputs)
    # kwok runs the pod's processes on this machine: what the probe sees is this machine's.
    assert "sees the kernel's process:" in out and "hostname:" in out and "skipped" not in out, out
