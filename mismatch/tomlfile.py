"""Reading the project's TOML files (pair files, study files) with one-line errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mismatch.errors import InputError


def read_toml(path: Path, what: str) -> dict:
    """The parsed TOML file `path`; `InputError` naming `what` (e.g. "pair file") when it is missing,
    and the parser's message when it is not valid TOML."""
    if not path.is_file():
        raise InputError(f"{what} not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}), so not a {what}") from None
