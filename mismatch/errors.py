"""Error types of `mismatch`.

Every error a user can cause (a missing model, bad input tensors, mismatched vocabularies)
is a `MismatchError` whose message is one line saying what is wrong and what to do. The CLI
prints exactly that line and exits non-zero; library callers can catch the class.
"""

from __future__ import annotations

import errno
import os


class MismatchError(Exception):
    """Base class: a user-facing problem with a one-line explanation."""


class ModelNotAvailableError(MismatchError):
    """A model spec that cannot be resolved from local files (we never use the network)."""


class InputError(MismatchError, ValueError):
    """Bad tensors or arguments: empty input, masks that score nothing, too-long sequences."""


class VocabMismatchError(InputError):
    """Two models (or their tokenizers) do not share one vocabulary."""


class NumericsError(MismatchError):
    """A model produced NaN or Inf logits or hidden states."""


class WriteError(MismatchError, OSError):
    """An output could not be written: the disk is full (`ENOSPC`), a quota is exhausted, the folder
    went read-only. One line naming the output (not its temporary file) and the system's reason; an
    `OSError` with the cause's `errno`, so a caller can tell a full disk (`DISK_FULL`) from the rest."""

    def __init__(self, path: object, cause: OSError) -> None:
        # the system's words for the errno (pyarrow's strerror is "Error writing bytes to file. Detail: …")
        reason = os.strerror(cause.errno) if cause.errno else (cause.strerror or str(cause))
        super().__init__(cause.errno, reason, str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"

    @property
    def disk_full(self) -> bool:
        return self.errno in DISK_FULL


DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})  # space may be freed and the write retried


def of_type(value: object, types: type | tuple[type, ...], what: str) -> None:
    """Raise `InputError` when `value` is not one of `types`: the API's one-line answer to a wrong argument
    (`load(123)`) where Python would raise an AttributeError from deep inside."""
    kinds = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int, not a spec
        names = " or ".join("None" if t is type(None) else t.__name__ for t in kinds)
        raise InputError(f"{what} must be {names}, got {type(value).__name__} {str(value)[:40]!r}")
