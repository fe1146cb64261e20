"""Content hashes of configurations and data: one canonical hashing for run ids, task ids and data digests, and
the hashes of files and checkpoint directories they take in."""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path


def _canonical(value: object) -> object:
    """A config value as hashed: numpy scalars as Python ones, integral numbers as ints, NaN as None."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        return None if math.isnan(value) else int(value) if value.is_integer() else value
    return value


def content_hash(payload: dict[str, object]) -> str:
    """16 hex digits of SHA-256 of `payload`'s canonical JSON (sorted keys, `_canonical` values)."""
    text = json.dumps({k: _canonical(v) for k, v in payload.items()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (remembered per process for an unchanged file: same path,
    size and modification time)."""
    stat = Path(path).stat()
    return _sha256_of(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_digest(directory: Path) -> str:
    """16 hex digits of SHA-256 over the names and contents of a checkpoint directory's files
    (top level, hidden files excluded): what `load(directory)` reads."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and not p.name.startswith("."))
    return content_hash({p.name: sha256_file(p) for p in files})
