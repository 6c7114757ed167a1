"""mkdocs hooks for the documentation site (``mkdocs.yml`` loads this file; see ``make docs``).

- The notebooks live in ``notebooks/`` at the repository root (where Binder and the tests open
  them), outside ``docs/``: :func:`on_files` adds every ``notebooks/*.ipynb`` to the site before
  mkdocs-jupyter (which renders them) and the nav (which lists them) look at the files.
- Rendered notebooks link to each other as ``02-x.ipynb`` (right in Jupyter and on GitHub);
  :func:`on_page_content` points those links at the rendered pages, and adds a download link.
- Generated sections cannot go stale: :func:`on_page_markdown` replaces each
  ``<!-- cli-help: PROG -->`` line with the ``--help`` of that program and of every subcommand,
  printed by the real argparse parsers at build time; ``<!-- magics-help -->`` with the help
  of every notebook magic (``%exec_remote?``); ``<!-- bench-results -->`` with the recorded
  benchmark runs read from ``bench/results/*.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = "notebooks"
CLI_MARKER = re.compile(r"^<!-- cli-help: (?P<prog>[\w-]+) -->$", re.MULTILINE)
BENCH_MARKER = "<!-- bench-results -->"
MAGICS_MARKER = "<!-- magics-help -->"
NOTEBOOK_LINK = re.compile(r'href="(?P<target>[^":/#?]+\.ipynb)(?P<anchor>#[^"]*)?"')
HELP_WIDTH = "80"  # argparse wraps help to $COLUMNS; fixed, so the page does not depend on the terminal


def _parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from remote_exec.agent.cli import _parser as agent_parser
    from remote_exec.cli.app import _parser as cli_parser

    return {"remote-exec": cli_parser, "remote-exec-agent": agent_parser}


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases map several names to one parser
                    seen.add(id(sub))
                    yield name, sub


@contextlib.contextmanager
def _columns() -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def cli_reference(prog: str) -> str:
    """Markdown for ``prog``: its ``--help``, then a section per subcommand with that ``--help``."""
    with _columns():
        parser = _parsers()[prog]()
        parts = [f"```text\n$ {prog} --help\n{parser.format_help().rstrip()}\n```\n"]
        for name, sub in _subcommands(parser):
            parts.append(f"### `{prog} {name}`\n\n```text\n$ {prog} {name} --help\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def magics_reference() -> str:
    """Markdown for every magic of ``%load_ext remote_exec``: the help IPython shows for ``%name?``."""
    with _columns():  # IPython formats the magics' help when their module is imported
        from remote_exec.jupyter.magics import RemoteExecMagics

    parts = []
    for kind, prefix in (("cell", "%%"), ("line", "%")):
        for name, method in RemoteExecMagics.magics[kind].items():
            doc = (getattr(RemoteExecMagics, method).__doc__ or "").strip()
            doc = doc.removeprefix("::").strip().replace(f"%{name}", f"{prefix}{name}", 1)
            parts.append(f"### `{prefix}{name}`\n\n```text\n{doc}\n```\n")
    return "\n".join(parts)


def bench_results() -> str:
    """Markdown for the recorded runs: one row per ``bench/results/*.json``, then the core table."""
    rows = ["| file | recorded | machine | Python | code |", "|---|---|---|---|---|"]
    latest: dict[str, Any] = {}
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        if path.name == "latest.json":
            latest = data
        m = data.get("machine", {})
        cpu = m.get("cpu_model") or "CPU model not recorded"
        machine = f"{m.get('cpu_count', '?')} cores, {cpu}, Linux {m.get('kernel', '?')}"
        commit = (data.get("code") or {}).get("commit")
        code = f"`{commit[:10]}`" if commit else "—"
        when, python = m.get("date") or "—", m.get("python", "?")
        rows.append(f"| `bench/results/{path.name}` | {when} | {machine} | {python} | {code} |")
    parts = ["\n".join(rows)]
    if latest.get("table"):
        notes = "".join(f"\n- {note}" for note in latest.get("notes", []))
        parts.append(
            f"The core engine's last run (`bench/run.py`, {latest.get('duration_s', '?')} s), as it printed it:\n\n"
            f"```text\n{latest['table'].rstrip()}\n```\n\nIts notes:\n{notes}"
        )
    return "\n\n".join(parts) + "\n"


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files: Files, config: Any) -> Files:
    for path in sorted((ROOT / NOTEBOOKS).glob("*.ipynb")):
        files.append(
            File(
                f"{NOTEBOOKS}/{path.name}",
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if BENCH_MARKER in markdown:
        markdown = markdown.replace(BENCH_MARKER, bench_results())
    if MAGICS_MARKER in markdown:
        markdown = markdown.replace(MAGICS_MARKER, magics_reference())
    return CLI_MARKER.sub(lambda m: cli_reference(m["prog"]), markdown)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    if not page.file.src_uri.startswith(f"{NOTEBOOKS}/"):
        return html

    def fix(m: re.Match[str]) -> str:
        target = files.get_file_from_path(posixpath.join(NOTEBOOKS, m["target"]))
        if target is None:
            return m[0]  # not a notebook of the site: leave it alone
        return f'href="{target.url_relative_to(page.file)}{m["anchor"] or ""}"'

    name = posixpath.basename(page.file.src_uri)  # mkdocs-jupyter's include_source copies it beside the page
    download = f'<p><a href="{name}" download>Download this notebook ({name})</a></p>'
    return NOTEBOOK_LINK.sub(fix, html) + download
