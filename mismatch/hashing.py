"""Content hashes of configurations and data: one canonical hashing for run ids, task ids and data digests."""

from __future__ import annotations

import hashlib
import json
import math


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
