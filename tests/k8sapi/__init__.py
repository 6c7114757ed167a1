"""The fast tier: a small Kubernetes API server on loopback whose pods are containers of the test engine.

No cluster can run on the test machines in the suite's budget, and the real tier
(:mod:`tests.k8sreal`: kube-apiserver, etcd, kwok) takes a long build and fakes its exec. This
server speaks enough of core/v1 (discovery, pods with watch, exec over WebSocket, logs) for the
real ``kubectl``, the official ``kubernetes`` client and ``kubernetes_asyncio`` to work against
it, and runs each pod as a Docker container of the private engine
(:mod:`tests.sandboxes.dockerd`), named ``k8s_{namespace}_{pod}_{container}``.

- :mod:`.server`: the routes, authentication (a bearer token or a client certificate), start/stop;
- :mod:`.store`: the pods, their status from ``docker events`` + ``docker inspect``, watches;
- :mod:`.execws`: exec over WebSocket (``v5.channel.k8s.io``/``v4``) as ``docker exec``;
- :mod:`.podspec`, :mod:`.objects`, :mod:`.selection`, :mod:`.engine`, :mod:`.certs`: the rest;
- :mod:`.fixture`: :class:`FastApiServer`, to start one from a test (``python -m tests.k8sapi``).
"""

from __future__ import annotations

from .fixture import FastApiServer

__all__ = ["FastApiServer"]
