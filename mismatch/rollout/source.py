"""The rollout source: the copy of a model that generates rollouts and is probed as the candidate,
whatever runs it.

`open_source(lm, spec, layers)` is a context manager yielding a `RolloutSource`: `lm`'s model perturbed
in place under a perturbation spec (restored when the block ends), or `lm` exported to an engine under
an `engine:…` spec (closed when the block ends). Probes take its `candidate`; the admission check and
anything that samples call its `generate` / `sample`. Callers never branch on which: the one place that
knows is `open_source`. OPD's `mismatch.rollout.copy.RolloutCopy` offers the same `sample` for a copy that
also lags behind the trained weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from mismatch.errors import InputError
from mismatch.rollout.llamacpp import LlamaCpp, engine_rollout, open_engine
from mismatch.model.generate import Batch, Samples, generate, sample
from mismatch.model.loader import LM
from mismatch.perturb import perturbed
from mismatch.rollout.spec import EngineConfig, parse_candidate


@dataclass
class RolloutSource:
    """A model copy that samples and is scored: `candidate` is what `mismatch.probe` takes (an `LM` whose
    model is perturbed in place, or an engine), `engine` the engine (None in PyTorch)."""

    candidate: LM | LlamaCpp
    tokenizer: object
    engine: LlamaCpp | None = None

    @property
    def whole_model(self) -> bool:
        """An engine runs the whole model: no layer scope, no per-layer metrics."""
        return self.engine is not None

    def generate(self, prompts: list[str], *, max_new_tokens: int, seed: int, chat: bool = False,
                 context: tuple[tuple[str, str], ...] = ()) -> Batch:
        """One response per prompt sampled at temperature 1 (`[B, T]` tensors, `Batch`'s layout)."""
        if self.engine is not None:
            return engine_rollout(self.engine, self.tokenizer, prompts, max_new_tokens=max_new_tokens, seed=seed,
                                  chat=chat, context=context).batch
        return generate(self.candidate, prompts, max_new_tokens=max_new_tokens, chat=chat, context=context,
                        temperature=1.0, seed=seed)

    def sample(self, prompts: list[str], *, max_new_tokens: int, seed: int, temperature: float = 1.0,
               top_p: float | None = None, chat: bool = False, context: tuple[tuple[str, str], ...] = ()) -> Samples:
        """One response per prompt with the sampler's own log-prob of each response token (`Samples`, nats),
        from the distribution warped by `temperature` / `top_p` (an engine samples at temperature 1 only)."""
        if self.engine is not None:
            if temperature != 1.0 or top_p is not None:
                raise InputError(f"{self.engine.name} samples at temperature 1 without top_p")
            return engine_rollout(self.engine, self.tokenizer, prompts, max_new_tokens=max_new_tokens, seed=seed,
                                  chat=chat, context=context)
        return sample(self.candidate, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                      seed=seed, chat=chat, context=context)


@contextmanager
def open_source(lm: LM, spec: str, layers: str = "linear", *, seed: int = 0,
                calibration_ids: torch.Tensor | None = None, n_ctx: int | None = None, offload: bool = False
                ) -> Iterator[RolloutSource]:
    """The rollout source of `lm` under `spec` (a perturbation on `layers`, or `engine:…`), for the block.

    Args:
        lm: the model (perturbed in place and restored exactly, or exported as it is).
        spec: a perturbation spec or an engine spec (`mismatch.rollout.spec.parse_candidate`).
        layers: the perturbation's scope (ignored by an engine: it runs the whole model).
        seed: the perturbation's seed (noise); calibration_ids: `[B, T]` for static activation scales.
        n_ctx: the engine's context in tokens (default: the model's, at most 2048).
        offload: the perturbation's originals leave memory while it is on (`mismatch.perturb.perturb_`).
    """
    config = parse_candidate(spec)
    if isinstance(config, EngineConfig):
        runner = open_engine(lm, config.weights, config.kv, n_ctx=n_ctx)
        try:
            yield RolloutSource(runner, lm.tokenizer, engine=runner)
        finally:
            runner.close()
        return
    with perturbed(lm.model, str(config), layers=layers, seed=seed, calibration_ids=calibration_ids,
                   offload=offload) as cand:
        yield RolloutSource(LM(cand, lm.tokenizer, lm.name), lm.tokenizer)
