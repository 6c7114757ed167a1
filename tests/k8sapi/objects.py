"""The API objects the fast tier answers with: ``Status`` errors, a pod's status from ``docker inspect``, ``Table``.

Their shapes are the real API server's, because the clients under test parse them: kubectl
prints ``Error from server (NotFound): pods "x" not found`` from a ``Status`` body's reason and
message, the official Python client validates required fields of a ``V1ContainerStatus``
(``image``, ``imageID``, ``ready``, ``restartCount``), and ``kubectl get`` asks for a
``meta.k8s.io/v1`` ``Table`` (server-side printing) before anything else.
"""

from __future__ import annotations

import datetime
from typing import Any

__all__ = [
    "JSON",
    "ApiError",
    "bad_request",
    "container_status",
    "human_age",
    "invalid",
    "not_found",
    "now_rfc3339",
    "phase_of",
    "pod_table",
    "rfc3339",
    "status_failure",
]

JSON = dict[str, Any]


class ApiError(Exception):
    """An error answered as a ``Status`` body with its HTTP code."""

    def __init__(self, status: JSON) -> None:
        super().__init__(status.get("message", ""))
        self.status = status
        self.code = int(status.get("code", 500))


def status_failure(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    """A ``metav1.Status`` as the API server sends it for a failed request."""
    body: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message}
    body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def not_found(kind: str, name: str) -> ApiError:
    """``pods "x" not found`` (``kind`` is the resource, plural)."""
    return ApiError(status_failure(404, "NotFound", f'{kind} "{name}" not found', {"name": name, "kind": kind}))


def bad_request(message: str) -> ApiError:
    return ApiError(status_failure(400, "BadRequest", message))


def invalid(name: str, field: str, message: str, cause: str = "FieldValueInvalid") -> ApiError:
    """A 422 as the API server's validation gives it (``Pod "x" is invalid: field: message``)."""
    details = {"name": name, "kind": "Pod", "causes": [{"reason": cause, "message": message, "field": field}]}
    return ApiError(status_failure(422, "Invalid", f'Pod "{name}" is invalid: {field}: {message}', details))


def rfc3339(moment: datetime.datetime) -> str:
    """Kubernetes' timestamps: UTC, whole seconds."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    return rfc3339(datetime.datetime.now(datetime.UTC))


def _docker_time(value: Any) -> str | None:
    """Docker's nanosecond timestamps as Kubernetes ones; None for its zero time (never)."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    return value.split(".")[0].rstrip("Z") + "Z"


def container_status(spec: JSON, inspect: JSON | None, waiting: tuple[str, str] | None) -> JSON:
    """One ``containerStatuses`` entry: from the container's ``docker inspect``, or, while it does
    not exist, waiting (``ContainerCreating``, or why it could not be made: ``waiting``)."""
    status: JSON = {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "started": False,
        "lastState": {},
    }
    if inspect is None:
        reason, message = waiting or ("ContainerCreating", "")
        status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        return status
    state = inspect.get("State") or {}
    status["containerID"] = f"docker://{inspect.get('Id', '')}"
    status["imageID"] = f"docker-pullable://{inspect.get('Image', '')}"
    status["restartCount"] = int(inspect.get("RestartCount") or 0)
    started = _docker_time(state.get("StartedAt"))
    if state.get("Status") in ("running", "paused"):
        status["state"] = {"running": {"startedAt": started}}
        status["ready"] = status["started"] = state.get("Status") == "running"
    elif state.get("Status") == "created" and state.get("Error"):  # it could not start: containerd's verdict
        failed = {"exitCode": 128, "reason": "StartError", "message": str(state["Error"])}
        status["state"] = {"terminated": {**failed, "containerID": status["containerID"]}}
    elif state.get("Status") == "created":
        status["state"] = {"waiting": {"reason": "ContainerCreating"}}
    else:  # exited, dead, removing: what the kubelet reports from the runtime's verdict
        code = int(state.get("ExitCode") or 0)
        reason = "OOMKilled" if state.get("OOMKilled") else "Completed" if code == 0 else "Error"
        terminated: JSON = {"exitCode": code, "reason": reason, "containerID": status["containerID"]}
        terminated |= {"startedAt": started, "finishedAt": _docker_time(state.get("FinishedAt"))}
        status["state"] = {"terminated": terminated}
    return status


def phase_of(statuses: list[JSON]) -> str:
    """The pod's phase (restartPolicy Never): Pending while any container waits, Running while
    any runs, then Succeeded if every container exited 0, else Failed."""
    states = [s["state"] for s in statuses]
    if any("waiting" in s for s in states):
        return "Pending"
    if any("running" in s for s in states):
        return "Running"
    return "Succeeded" if all(s["terminated"]["exitCode"] == 0 for s in states) else "Failed"


def human_age(since: str, now: datetime.datetime | None = None) -> str:
    """kubectl's AGE column (``HumanDuration``): 45s, 3m20s, 12m, 5h3m, 3d4h, 400d."""
    then = datetime.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    s = int(((now or datetime.datetime.now(datetime.UTC)) - then).total_seconds())
    if s < 0:
        return "0s"
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 192:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def _status_word(pod: JSON) -> str:
    """kubectl's STATUS: the phase, or a container's waiting or terminated reason."""
    word = str(pod["status"].get("phase", "Unknown"))
    for cs in pod["status"].get("containerStatuses", []):
        state = cs.get("state", {})
        reason = state.get("waiting", {}).get("reason") or state.get("terminated", {}).get("reason")
        if reason:
            word = str(reason)
    return word


_COLUMNS = [
    ("Name", "string", "name", 0),
    ("Ready", "string", "", 0),
    ("Status", "string", "", 0),
    ("Restarts", "string", "", 0),
    ("Age", "string", "", 0),
    ("IP", "string", "", 1),
    ("Node", "string", "", 1),
]


def pod_table(pods: list[JSON], resource_version: str, include: str) -> JSON:
    """The ``Table`` ``kubectl get pods`` asks for (``include``: the ``includeObject`` query)."""
    rows = []
    for pod in pods:
        statuses = pod["status"].get("containerStatuses", [])
        ready = sum(1 for s in statuses if s.get("ready"))
        restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
        meta = pod["metadata"]
        cells = [meta["name"], f"{ready}/{len(statuses)}", _status_word(pod), str(restarts)]
        cells += [human_age(meta["creationTimestamp"]), "<none>", pod["spec"].get("nodeName", "<none>")]
        row: JSON = {"cells": cells}
        if include == "Object":
            row["object"] = pod
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
        rows.append(row)
    columns = [{"name": n, "type": t, "format": f, "description": "", "priority": p} for n, t, f, p in _COLUMNS]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
