"""A model run outside PyTorch, known by its logits only (an inference engine such as llama.cpp:
`mismatch.rollout.llamacpp`): what `mismatch.probe` takes as a candidate beside a PyTorch model."""

from __future__ import annotations

import torch


class ExternalLM:
    """A candidate run outside PyTorch (an inference engine: `mismatch.rollout.llamacpp`), known by
    its logits only. Subclasses set `name`, `vocab_size` and `context_length` (tokens, or None) and
    implement `sequence_logits(ids) -> [len(ids), V]` fp32 logits at every position of one unpadded
    sequence. `probe` scores them with the same metric code as any model (no per-layer metrics)."""

    name: str
    vocab_size: int
    context_length: int | None

    def sequence_logits(self, ids: list[int]) -> torch.Tensor:
        raise NotImplementedError
