"""The copy magics: ``%exec_remote_upload`` and ``%exec_remote_download``.

They parse and delegate to the blocking sandbox's tree and streaming file methods; paths in the
sandbox are relative to the ``%exec_remote_config --cwd``, and the sandbox is the configured one
unless ``--sandbox`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import posixpath
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import magics_class

from ..client.transfer import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, TransferResult
from ..errors import RemoteExecError
from ..protocol import FileInfo
from .display import RemoteCommandError, widgets_enabled
from .magic_base import StateMagics, _argument, _line_magic, _magic_arguments, _options, _parse, _plain_help, _variable

__all__ = ["RemoteFileMagics"]

_TRANSFER = _options(
    (("--sandbox",), {"metavar": "URL", "help": "the sandbox (default: %%exec_remote_config's)"}),
    (
        ("--ignore",),
        {"metavar": "PATTERN", "nargs": "+", "action": "extend", "help": "gitignore patterns to leave out"},
    ),
    (("--no-default-ignores",), {"action": "store_true", "help": "also copy .git, node_modules, .env*, keys..."}),
    (("--no-gitignore",), {"action": "store_true", "help": "do not honour .gitignore files"}),
    (("--max-files",), {"metavar": "N", "type": int, "default": DEFAULT_MAX_FILES, "help": "refuse bigger trees"}),
    (("--max-bytes",), {"metavar": "B", "type": int, "default": DEFAULT_MAX_BYTES, "help": "refuse bigger trees"}),
    (("--no-progress",), {"action": "store_true", "help": "no progress bar"}),
    (("--name",), {"metavar": "VAR", "help": "store the TransferResult (a single file: its FileInfo) in VAR"}),
)


@magics_class
class RemoteFileMagics(StateMagics):
    """The copy magics of ``%load_ext remote_exec``, on the kernel's shared :class:`KernelState`."""

    # -- %exec_remote_upload / %exec_remote_download ---------------------------------------------

    def _remote_path(self, path: str) -> str:
        cwd = self.state.defaults.cwd
        return posixpath.join(cwd, path) if cwd and not path.startswith("/") else path

    def _transfer(self, args: argparse.Namespace, upload: bool) -> None:
        local, remote = (args.local, self._remote_path(args.remote))
        sb = self._sandbox(args.sandbox or self.state.defaults.sandbox)
        progress = not args.no_progress and widgets_enabled()  # plain mode (nbval): no bar
        tree: dict[str, Any] = {
            "ignore": args.ignore or (),
            "default_ignores": not args.no_default_ignores,
            "gitignore": not args.no_gitignore,
            "max_files": args.max_files or None,
            "max_bytes": args.max_bytes or None,
            "progress": progress,
        }
        try:
            if upload:
                if not os.path.exists(local):
                    raise UsageError(f"no such local file or directory: {local}")
                if os.path.isdir(local):
                    result: object = sb.upload(local, remote, **tree)
                else:
                    result = sb.write_file_from(local, remote, progress=progress)
            elif sb.stat(remote).type == "dir":
                result = sb.download(remote, local, **tree)
            else:
                result = sb.read_file_to(remote, local, progress=progress)
        except RemoteExecError as exc:
            raise RemoteCommandError(f"{type(exc).__name__}: {exc}") from exc
        self._store(_variable(args.name, "--name"), result)
        verb = "uploaded" if upload else "downloaded"
        if isinstance(result, TransferResult):
            print(result.describe(verb))
        elif isinstance(result, FileInfo):
            print(f"{verb} {local if upload else remote} ({result.size} bytes)")

    @_magic_arguments()
    @_TRANSFER
    @_argument("local", metavar="LOCAL", help="a local file or directory")
    @_argument("remote", metavar="REMOTE", help="where it goes in the sandbox (relative: to the configured --cwd)")
    @_line_magic
    def exec_remote_upload(self, line: str) -> None:
        """Copy a local file or directory into the sandbox: ``%exec_remote_upload LOCAL REMOTE``.

        A directory sends only new or changed files and leaves out ``.git``, ``node_modules``,
        ``.env*``, keys... and what ``.gitignore`` files ignore; a tree over the caps is refused.
        Works with every sandbox (through the agent, not a copy command).
        """
        self._transfer(_parse(self.exec_remote_upload, line), upload=True)

    @_magic_arguments()
    @_TRANSFER
    @_argument("remote", metavar="REMOTE", help="a file or directory in the sandbox (relative: to --cwd)")
    @_argument("local", metavar="LOCAL", help="where it goes on this machine")
    @_line_magic
    def exec_remote_download(self, line: str) -> None:
        """Copy a file or directory out of the sandbox: ``%exec_remote_download REMOTE LOCAL``.

        A directory fetches only new or changed files, with the same ignores and caps as
        ``%exec_remote_upload``.
        """
        self._transfer(_parse(self.exec_remote_download, line), upload=False)


_plain_help(RemoteFileMagics)
