"""The package version, importable from every layer (the I/O layer writes it into model files)."""

__version__ = "0.1.0"
