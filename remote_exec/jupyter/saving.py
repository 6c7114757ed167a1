"""A Jupyter Server extension: a saved notebook keeps each view's record, not its widget.

JupyterLab renders a widget output with the highest-ranked renderer, the widget manager's, and
that one does not fall back to the output's other mimetypes: once the kernel that made the model
is gone (the notebook closed and reopened, a new kernel), it shows "Error displaying widget:
model not found" over the record the output also carries. So when the server writes a notebook
to disk, this hook drops the widget from every output that holds a remote_exec record (marked
by :data:`RECORD_META` in the output's metadata) and keeps the record's ``text/html`` and
``text/plain``: what the file holds is then what JupyterLab, ``jupyter nbconvert``, GitHub and
nbviewer all show, with no kernel, no network and no widget state.

Beside them, each record gets :data:`RECORD_MIME`: what its Reconnect needs (a job's id, sandbox
URL, label and state; a shell's session id; a dashboard's sandboxes) and the record's HTML
(validated and bounded here: the notebook came from the browser; see :func:`saved_record`). The JupyterLab
extension (``labextension/``) renders that bundle as the record plus a Reconnect button when the
notebook has a kernel, and shows the live view again on its own when the running kernel still
holds one (a reloaded page). Without the extension JupyterLab ranks ``text/html`` first and shows
the record as before; GitHub, nbviewer and nbconvert ignore the unknown type.

A live view keeps its newest record in a *draft* output beside it (:data:`RECORD_DRAFT`; see
:class:`~remote_exec.jupyter.record.RecordedDisplay`): rewriting the view's own output would make
JupyterLab render a new view. The hook moves each draft's record into its view's output (the same
checks apply) and drops every draft, so the file holds the record as of the save.
Only the file changes: the open notebook keeps its live views, which go on rewriting their
drafts until the job ends. A reopened (or reloaded)
notebook shows the record; ``%exec_remote_attach JOB`` (named in a running job's record), or the
extension's Reconnect, gives a live view again.

Enabled by ``etc/jupyter/jupyter_server_config.d/remote_exec.json``, which the wheel installs
into the environment's prefix (where the server that saves the notebook looks, so install
remote_exec in the server's environment too when the kernel runs elsewhere).
"""

from __future__ import annotations

from typing import Any

from ..protocol.names import is_job_id

__all__ = [
    "DRAFT_MIME",
    "RECORD_DRAFT",
    "RECORD_META",
    "RECORD_MIME",
    "WIDGET_MIME",
    "keep_records",
    "load_jupyter_server_extension",
]

RECORD_META = "remote_exec"
"""Key in an output's metadata that marks a bundle whose ``text/html`` is a record."""

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

RECORD_DRAFT = "remote_exec_draft"
"""Key in a draft output's metadata: the view it belongs to (``for``: the ``display`` of that
view's :data:`RECORD_META`) and, while the view's job runs, its newest record (``data``:
``text/html`` and ``text/plain``; ``mark``: the :data:`RECORD_META` mark). See
:class:`~remote_exec.jupyter.record.RecordedDisplay`: the view's own output is not rewritten
while it lives; the saver moves the draft's record into it."""

DRAFT_MIME = "application/vnd.remote-exec.draft+json"
"""A draft's data: the JupyterLab extension renders it as nothing (its output hidden)."""

RECORD_MIME = "application/vnd.remote-exec.record+json"
"""A saved job record as the JupyterLab extension reads it (see the module doc)."""

MAX_RECORD_HTML = 256 * 1024
"""Characters of record HTML the saver copies (a record is ~20 kB: 40 lines of 400 per stream)."""

_STATES = {"running", "completed", "failed", "killed", "timed out", "lost", "error", "disconnected"}


MAX_SANDBOXES = 64
"""Sandbox URLs a dashboard's saved record keeps (what its Reconnect opens at most)."""

_SHELL_STATES = {"open", "closed"}


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def saved_record(mark: object, html: object) -> dict[str, Any] | None:
    """The :data:`RECORD_MIME` bundle of a view's output (``mark``: its :data:`RECORD_META`), or
    ``None`` for anything malformed. Three kinds, each with what its Reconnect needs:

    - ``job`` (a JobView or a TerminalView; a mark with no kind is one): its job id, sandbox,
      label and state;
    - ``shell`` (a ShellView): its session id, sandbox and state (``open`` or ``closed``);
    - ``dashboard``: its sandboxes (at most :data:`MAX_SANDBOXES`).

    Ids must be of the safe form (``protocol/names.py``: data in every hint and call).
    """
    if not isinstance(mark, dict) or not isinstance(html, str) or len(html) > MAX_RECORD_HTML:
        return None
    kind = mark.get("kind", "job")
    if kind == "dashboard":
        urls = mark.get("sandboxes")
        if not isinstance(urls, list) or not 0 < len(urls) <= MAX_SANDBOXES:
            return None
        if not all(isinstance(u, str) and 0 < len(u) <= 2000 for u in urls):
            return None
        return {"kind": "dashboard", "sandboxes": list(urls), "html": html}
    key = {"job": "job_id", "shell": "session_id"}.get(kind) if isinstance(kind, str) else None
    if key is None or not is_job_id(mark.get(key)):
        return None
    state = mark.get("state")
    states = _STATES if kind == "job" else _SHELL_STATES
    return {
        "kind": kind,
        key: mark[key],
        "sandbox": _text(mark.get("sandbox"), 2000),
        "label": _text(mark.get("label"), 200),
        "state": state if state in states else "unknown",
        "html": html,
    }


def keep_records(model: dict[str, Any], **_: Any) -> None:
    """The pre-save hook: drop the widget from each output that carries a record, and add the
    job's :data:`RECORD_MIME`, in place.

    Anything else in the notebook is left exactly as the browser sent it.
    """
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    for cell in model["content"].get("cells") or []:
        if isinstance(cell, dict) and isinstance(cell.get("outputs"), list):
            cell["outputs"] = _merge_drafts(cell["outputs"])
        for output in (cell.get("outputs") if isinstance(cell, dict) else None) or []:
            if not isinstance(output, dict):
                continue
            data, meta = output.get("data"), output.get("metadata")
            if isinstance(data, dict) and isinstance(meta, dict) and RECORD_META in meta and "text/html" in data:
                data.pop(WIDGET_MIME, None)
                record = saved_record(meta[RECORD_META], data["text/html"])
                if record is None:
                    data.pop(RECORD_MIME, None)  # never a stale or forged one
                else:
                    data[RECORD_MIME] = record


def _draft_of(output: object) -> dict[str, Any] | None:
    meta = output.get("metadata") if isinstance(output, dict) else None
    draft = meta.get(RECORD_DRAFT) if isinstance(meta, dict) else None
    return draft if isinstance(draft, dict) else None


def _merge_drafts(outputs: list[Any]) -> list[Any]:
    """The cell's outputs without its drafts, each draft's record moved into the output of the
    view it names (same cell, same ``display``): the newest record, as of the save."""
    drafts = {}
    for output in outputs:
        draft = _draft_of(output)
        if draft is not None and isinstance(draft.get("for"), str):
            drafts[draft["for"]] = draft
    kept = []
    for output in outputs:
        if _draft_of(output) is not None:
            continue  # a draft is never saved: it is merged below, or stale
        data, meta = (output.get("data"), output.get("metadata")) if isinstance(output, dict) else (None, None)
        mark = meta.get(RECORD_META) if isinstance(meta, dict) else None
        key = mark.get("display") if isinstance(mark, dict) else None
        draft = drafts.get(key) if isinstance(key, str) else None
        if isinstance(data, dict) and isinstance(meta, dict) and draft is not None:
            record, new_mark = draft.get("data"), draft.get("mark")
            html, plain = (record.get("text/html"), record.get("text/plain")) if isinstance(record, dict) else (0, 0)
            fits = isinstance(html, str) and isinstance(plain, str) and max(len(html), len(plain)) <= MAX_RECORD_HTML
            if fits and isinstance(new_mark, dict):
                data["text/html"], data["text/plain"] = html, plain
                meta[RECORD_META] = {**new_mark, "display": key}  # checked with the rest below
        kept.append(output)
    return kept


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "remote_exec.jupyter.saving"}]


def load_jupyter_server_extension(serverapp: Any) -> None:
    """Register :func:`keep_records` with the server's contents manager."""
    serverapp.contents_manager.register_pre_save_hook(keep_records)
    serverapp.log.info("remote_exec: saved notebooks keep job records in place of widgets")


_load_jupyter_server_extension = load_jupyter_server_extension
