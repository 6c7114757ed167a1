"""Backend "k8s-real": ``k8s://`` against a real kube-apiserver with a kwok node (tests/k8sreal.py).

Registered only where the real tier's binaries were built (``make k8s-bed``: ~11 minutes once
per machine, kept in ``~/.cache/remote-exec/k8s-bed``); elsewhere its cases skip with that
reason even when backends are required: a fresh machine cannot build it within CI's budget.
kwok runs an exec as a local process, so the "pod" is this machine: the agent gets a state dir
of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..k8sreal import bed_bin, real_cluster_running, shared_real_cluster
from .conftest import backend

if bed_bin() is not None:

    @backend("k8s-real")
    def _k8s_real(tmp: pytest.TempPathFactory) -> Iterator[str]:
        cluster = shared_real_cluster()
        assert cluster is not None
        cluster.pod("rx-contract")
        state = tmp.mktemp("k8s-real") / "agent"
        yield f"k8s://default/rx-contract?kubeconfig={cluster.kubeconfig}&dir={state}"
        if real_cluster_running(cluster):  # (stopped after its group's last test: nothing to delete)
            cluster.request("DELETE", "/api/v1/namespaces/default/pods/rx-contract")
