"""Files: reading what a user hands the toolkit (prompt lists, study and pair files, thresholds), each
problem one line naming the file (missing, a directory, unreadable, not UTF-8, not valid TOML/JSON);
checking an output path before any work; and the one atomic write (temporary file, then rename)."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

from mismatch.errors import InputError, WriteError


def trailing_number(name: str) -> int:
    """The number a file or folder name ends in (`checkpoint-120` → 120, `rank_3` → 3), −1 if none: how
    numbered outputs (checkpoints, ranks) sort."""
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match else -1


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file `path`, described as `what` ("prompts file", "study file") in errors.

    Raises:
        InputError: the file is missing, is a directory, cannot be read, or is not UTF-8 text.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise InputError(f"{what} not found: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_toml(path: str | Path, what: str) -> dict:
    """The parsed TOML file `path` (`read_text`'s errors, and the parser's message when it is not TOML)."""
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path} is not valid TOML: {exc}") from None


def read_json(path: str | Path, what: str) -> object:
    """The parsed JSON file `path` (`read_text`'s errors, and where the JSON breaks)."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def json_text(value: object, *, indent: int | None = 1) -> str:
    """`value` as strict JSON, the one JSON writer of the package's outputs: a NaN or an infinity (an undefined
    interval, a statistic that blew up) becomes the string `"nan"`, `"inf"` or `"-inf"` — `float()` reads it
    back, and which one it was is kept — where `json.dumps` would write the bare `NaN` / `Infinity` that RFC 8259,
    `jq` and JavaScript refuse; anything else not JSON-native is written as its `str`."""
    def finite(v: object) -> object:
        if isinstance(v, float):
            return v if math.isfinite(v) else str(v)
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v

    return json.dumps(finite(value), indent=indent, default=str, allow_nan=False)


def check_writable(path: str | Path, what: str, *, folder: bool) -> None:
    """Fail now, before any work, when `path` (a `folder`, or a file) could not be written later: a
    part of it is a file, or its nearest existing folder does not take a new file (read-only, /proc).
    Creates nothing.

    Raises:
        InputError: one line naming `what` and the reason.
    """
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{what} {path} is a file, not a folder")
    if not folder and path.is_dir():
        raise InputError(f"{what} {path} is a folder, not a file")
    existing = path if folder and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"cannot write {what} {path}: {existing} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise InputError(f"cannot write {what} {path}: {existing} does not take new files "
                         f"({exc.strerror or exc})") from None
    if not folder and path.is_file() and not os.access(path, os.W_OK):
        raise InputError(f"cannot write {what} {path}: the file is read-only")


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write `path` complete or not at all: `write(tmp)` fills a temporary file beside it (same folder,
    so the rename is atomic), which then replaces `path`; the temporary file never stays behind, also
    when `write` raises. The one temp-then-rename of the package. Returns `path`.

    Raises:
        WriteError: the system refused the write (a full disk, a quota, a read-only folder): one line
            naming `path`, whatever file the writer was at; what `path` held before is untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except WriteError:
        raise
    except OSError as exc:  # pyarrow's and matplotlib's write errors are OSErrors too, with the errno
        raise WriteError(path, exc) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`atomic_write` of UTF-8 text."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def cache_dir() -> Path:
    """Root of the project's local cache (`$MISMATCH_CACHE`, default `~/.cache/mismatch`)."""
    return Path(os.environ.get("MISMATCH_CACHE", Path.home() / ".cache" / "mismatch"))
