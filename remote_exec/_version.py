"""The package version and distribution name (one place; pyproject reads the version)."""

__all__ = ["DISTRIBUTION", "__version__"]

__version__ = "0.1.0"

DISTRIBUTION = "remote-exec-sandbox"
"""The name to ``pip install`` (``remote-exec`` on PyPI is an unrelated project); imported as ``remote_exec``."""
