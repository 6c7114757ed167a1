"""A Pod's JSON checked and turned into one ``docker run`` per container.

What the fast tier maps (the rest of a Pod a real cluster accepts is refused with a 422 naming
the field, rather than silently run differently):

- ``command`` replaces the image's entrypoint (``--entrypoint`` + the rest as arguments),
  ``args`` its CMD, as the kubelet does; ``env`` (plain values), ``workingDir``;
- ``resources.limits.memory`` → ``--memory`` (and the same ``--memory-swap``: no swap, so a
  pod over its limit is OOM-killed as in a cluster), ``limits.cpu`` → ``--cpus``;
- ``securityContext``: ``readOnlyRootFilesystem``, ``capabilities``, ``runAsUser``/``runAsGroup``,
  ``allowPrivilegeEscalation: false`` (no-new-privileges), ``privileged``;
- ``emptyDir`` volumes: an anonymous Docker volume (``medium: Memory``: a tmpfs), exec allowed,
  removed with the container;
- ``shareProcessNamespace: true`` → ``--init``: a PID 1 that reaps orphans, as the pause
  container does in a cluster (without it PID 1 is the pod's own command, as in a cluster).

``restartPolicy`` must be ``Never`` and defaults to it (a cluster's default, ``Always``, would
need a kubelet restarting containers). Scheduling fields (``nodeName``, ``nodeSelector``,
``tolerations``, ``serviceAccountName`` …) are accepted and ignored: there is one node.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from .objects import JSON, bad_request, invalid

__all__ = ["LABEL_INSTANCE", "PodPlan", "container_name", "parse_pod", "parse_quantity"]

LABEL_NS = "io.kubernetes.pod.namespace"
LABEL_POD = "io.kubernetes.pod.name"
LABEL_CONTAINER = "io.kubernetes.container.name"
LABEL_UID = "io.kubernetes.pod.uid"
LABEL_INSTANCE = "rx-test.k8sapi/instance"  # which fast-tier server owns the container

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti|)$")
_FACTORS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_FACTORS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

# Pod spec fields that change what runs and that this tier cannot honour: refused, not ignored.
_REFUSED_SPEC = ("initContainers", "ephemeralContainers", "hostNetwork", "hostPID", "hostIPC", "runtimeClassName")
_REFUSED_CONTAINER = ("envFrom", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe", "tty")


@dataclass(frozen=True)
class PodPlan:
    """A checked Pod: its name, its metadata and spec as stored, and each container's run."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: JSON
    runs: list[tuple[str, list[str]]]  # (container name, `docker run` arguments after "run")


def container_name(namespace: str, pod: str, container: str) -> str:
    """The Docker name of a pod's container."""
    return f"k8s_{namespace}_{pod}_{container}"


def parse_quantity(value: Any, field: str, pod: str) -> float:
    """A Kubernetes quantity (``64Mi``, ``1G``, ``500m``, ``2``) as a number of units."""
    m = _QUANTITY.match(str(value))
    if m is None:
        raise invalid(pod, field, f'Invalid value: "{value}": must be a quantity like 64Mi or 500m')
    number, suffix = float(m.group(1)), m.group(2)
    return number / 1000 if suffix == "m" else number * _FACTORS[suffix]


def _string_map(value: Any, pod: str, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid(pod, field, "Invalid value: must be a map of strings")
    return {str(k): v for k, v in value.items()}


def _strings(value: Any, pod: str, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(pod, field, "Invalid value: must be a list of strings")
    return list(value)


def parse_pod(namespace: str, body: Any, instance: str, uid: str) -> PodPlan:
    """Check a create request's body (raises :class:`~.objects.ApiError`: 400 or 422)."""
    if not isinstance(body, dict) or body.get("kind", "Pod") != "Pod" or body.get("apiVersion", "v1") != "v1":
        raise bad_request("the body must be a v1 Pod")
    meta: JSON = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    name = meta.get("name") or ""
    if not name and isinstance(meta.get("generateName"), str):
        name = meta["generateName"] + secrets.token_hex(3)[:5]
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise invalid(str(name), "metadata.name", "Invalid value: a lowercase RFC 1123 subdomain is required")
    if meta.get("namespace") not in (None, namespace):
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    spec = body.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise invalid(name, "spec.containers", "Required value", "FieldValueRequired")
    spec = dict(spec)
    spec.setdefault("restartPolicy", "Never")
    if spec["restartPolicy"] != "Never":
        raise invalid(
            name, "spec.restartPolicy", f'Unsupported value: "{spec["restartPolicy"]}": the fast tier runs "Never" only'
        )
    for key in _REFUSED_SPEC:
        if spec.get(key):
            raise invalid(
                name, f"spec.{key}", "Forbidden: not supported by the fast-tier API server", "FieldValueForbidden"
            )
    volumes = _volumes(spec.get("volumes"), name)
    labels = {
        LABEL_NS: namespace,
        LABEL_POD: name,
        LABEL_UID: uid,
        LABEL_INSTANCE: instance,
    }
    runs: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for i, c in enumerate(spec["containers"]):
        field = f"spec.containers[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not _DNS_LABEL.match(c["name"]):
            raise invalid(name, f"{field}.name", "Invalid value: a lowercase RFC 1123 label is required")
        if c["name"] in seen:
            raise invalid(name, f"{field}.name", f'Duplicate value: "{c["name"]}"', "FieldValueDuplicate")
        seen.add(c["name"])
        if not isinstance(c.get("image"), str) or not c["image"]:
            raise invalid(name, f"{field}.image", "Required value", "FieldValueRequired")
        for key in _REFUSED_CONTAINER:
            if c.get(key):
                raise invalid(name, f"{field}.{key}", "Forbidden: not supported by the fast-tier API server")
        args = ["-d", "--pull", "never", "--name", container_name(namespace, name, c["name"])]
        args += ["--hostname", name[:63]]
        for key, value in {**labels, LABEL_CONTAINER: c["name"]}.items():
            args += ["--label", f"{key}={value}"]
        args += ["--init"] if spec.get("shareProcessNamespace") else []
        args += _container_options(c, field, name, volumes)
        command = _strings(c.get("command"), name, f"{field}.command")
        rest = _strings(c.get("args"), name, f"{field}.args")
        args += ["--entrypoint", command[0], c["image"], *command[1:], *rest] if command else [c["image"], *rest]
        runs.append((c["name"], args))
    user_labels = _string_map(meta.get("labels"), name, "metadata.labels")
    annotations = _string_map(meta.get("annotations"), name, "metadata.annotations")
    return PodPlan(name, user_labels, annotations, spec, runs)


def _volumes(value: Any, pod: str) -> dict[str, bool]:
    """The pod's volumes by name: True for a memory-backed emptyDir. Other kinds are refused."""
    found: dict[str, bool] = {}
    for i, v in enumerate(value or []):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not isinstance(v.get("emptyDir"), dict):
            raise invalid(pod, f"spec.volumes[{i}]", "Forbidden: the fast tier has emptyDir volumes only")
        found[v["name"]] = v["emptyDir"].get("medium") == "Memory"
    return found


def _container_options(c: JSON, field: str, pod: str, volumes: dict[str, bool]) -> list[str]:
    args: list[str] = []
    limits = (c.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        limit = str(int(parse_quantity(limits["memory"], f"{field}.resources.limits.memory", pod)))
        args += ["--memory", limit, "--memory-swap", limit]
    if "cpu" in limits:
        args += ["--cpus", f"{parse_quantity(limits['cpu'], f'{field}.resources.limits.cpu', pod):g}"]
    for j, e in enumerate(c.get("env") or []):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or "valueFrom" in e:
            raise invalid(pod, f"{field}.env[{j}]", "Forbidden: the fast tier takes name and value only")
        args += ["-e", f"{e['name']}={e.get('value', '')}"]
    if c.get("workingDir"):
        args += ["-w", str(c["workingDir"])]
    sc = c.get("securityContext") or {}
    args += ["--read-only"] if sc.get("readOnlyRootFilesystem") else []
    args += ["--privileged"] if sc.get("privileged") else []
    args += ["--security-opt", "no-new-privileges"] if sc.get("allowPrivilegeEscalation") is False else []
    caps = sc.get("capabilities") or {}
    for cap in caps.get("drop") or []:
        args += ["--cap-drop", str(cap)]
    for cap in caps.get("add") or []:
        args += ["--cap-add", str(cap)]
    if "runAsUser" in sc:
        args += ["--user", f"{int(sc['runAsUser'])}" + (f":{int(sc['runAsGroup'])}" if "runAsGroup" in sc else "")]
    for j, mount in enumerate(c.get("volumeMounts") or []):
        if not isinstance(mount, dict) or mount.get("name") not in volumes or not mount.get("mountPath"):
            raise invalid(pod, f"{field}.volumeMounts[{j}]", "Not found: no emptyDir volume of that name")
        path = str(mount["mountPath"])
        if volumes[mount["name"]]:
            args += ["--tmpfs", f"{path}:rw,exec,mode=1777"]
        else:
            args += ["--mount", f"type=volume,dst={path}"]
    return args
