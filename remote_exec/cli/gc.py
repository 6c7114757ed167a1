"""``remote-exec gc``: delete the pods ``k8s+image://`` left behind whose TTL has passed.

A pod a sandbox created is deleted when the sandbox closes; one kept (``keep=1``) or left by a
host that died carries its creation time and TTL as annotations. ``gc`` lists the namespace's
pods labelled ``app.kubernetes.io/managed-by=remote-exec`` and deletes the expired ones
(``--dry-run``: only lists them). It touches no pod without that label.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..sandboxes.k8s import check_name
from ..sandboxes.k8s_image import expired_pods
from ..termsafe import terminal_safe

__all__ = ["add_gc_parser", "gc"]


def add_gc_parser(sub: Any) -> None:
    """Add the ``gc`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "gc",
        help="delete expired pods that k8s+image:// sandboxes left behind",
        description="Delete the pods remote_exec made in a namespace whose TTL has passed.",
    )
    p.add_argument("--namespace", "-n", default="default", help="the namespace (default: default)")
    p.add_argument("--context", help="the kubeconfig context (default: its current one)")
    p.add_argument("--kubeconfig", help="the kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--dry-run", action="store_true", help="list the expired pods, delete nothing")


async def gc(args: argparse.Namespace) -> int:
    """List (and unless ``--dry-run``, delete) the namespace's expired pods; one line each."""
    from ..sandboxes.k8sapi import KubeApi

    namespace = check_name("namespace", args.namespace)
    api = await KubeApi.acquire(args.kubeconfig, args.context)
    try:
        names = await expired_pods(api, namespace, delete=not args.dry_run)
    finally:
        await api.release()
    verb = "expired (not deleted: --dry-run)" if args.dry_run else "deleted"
    for name in names:
        print(f"{verb} pod {namespace}/{terminal_safe(name)}")
    if not names:
        print(f"no expired remote_exec pods in {namespace}")
    return 0
