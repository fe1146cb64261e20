"""Error types of `mismatch`.

Every error a user can cause (a missing model, bad input tensors, mismatched vocabularies)
is a `MismatchError` whose message is one line saying what is wrong and what to do. The CLI
prints exactly that line and exits non-zero; library callers can catch the class.
"""

from __future__ import annotations


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
