"""The toolkit version, stamped on every result row."""

__version__ = "0.1.0"
