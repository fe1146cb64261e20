"""The toolkit version, stamped on every result row."""

__version__ = "0.2.0"
