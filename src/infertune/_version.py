"""The package version, where every module reads it (not the package face)."""

__version__ = "0.2.0"
