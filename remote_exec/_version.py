"""The package version (one place; pyproject reads it)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
