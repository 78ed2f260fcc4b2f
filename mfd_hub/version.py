"""The mfd-hub version, in a module of its own so that any module can read it without importing
the package's ``__init__`` (which imports the checkpoint code, which needs the version)."""

__version__ = "0.1.0"
