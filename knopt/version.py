"""knopt's version, read from the installed package's metadata (pyproject.toml's)."""

from importlib import metadata

try:
    __version__ = metadata.version("knopt")
except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
