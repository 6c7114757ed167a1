"""Trees: upload and download of project directories, with ignores, caps and incremental re-sends.

- **Ignores** (gitignore syntax, via ``pathspec``): :data:`DEFAULT_IGNORES` (VCS data,
  dependency and build caches, secrets), every ``.gitignore`` in the tree (nested ones apply
  below their directory, as in git), and the caller's ``ignore`` patterns. The caller's patterns
  win (``"!.env"`` sends a ``.env``), then the defaults, then the ``.gitignore`` files. An
  ignored directory is not descended into.
- **Caps**: more than ``max_files`` files or ``max_bytes`` bytes in the selected tree is refused
  *before anything moves*, with a :class:`~remote_exec.errors.TransferLimitError` naming the
  biggest files and the directories with the most files.
- **Incremental**: a file whose size, permission bits and mtime match the other side's is not
  sent again; a sent file gets its source's mtime, so the next comparison is exact.
- **Progress**: a ``tqdm`` bar (``tqdm.auto``: the widget variant in Jupyter) over the bytes to move.

Symlinks and special files are not transferred: they are listed in ``TransferResult.skipped``.
"""

from .ignore import DEFAULT_IGNORES as DEFAULT_IGNORES
from .ignore import IgnoreRules as IgnoreRules
from .progress import ProgressBar as ProgressBar
from .progress import progress_bar as progress_bar
from .result import TransferResult as TransferResult
from .tree_copy import DEFAULT_MAX_BYTES as DEFAULT_MAX_BYTES
from .tree_copy import DEFAULT_MAX_FILES as DEFAULT_MAX_FILES
from .tree_copy import download_tree as download_tree
from .tree_copy import upload_tree as upload_tree

__all__ = [
    "DEFAULT_IGNORES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "IgnoreRules",
    "ProgressBar",
    "progress_bar",
    "TransferResult",
    "download_tree",
    "upload_tree",
]
