"""The rollout copy of the student: stale weights (a ring of past weights) and any perturbation.

An asynchronous OPD pipeline with staleness K generates step s's rollouts with the weights of
step s − K. `RolloutCopy` reproduces that on one machine: after every optimizer step it records
the student's weights in a ring of the last K + 1 versions and loads the oldest into a separate
copy of the model, then re-applies the rollout perturbation (re-quantizing / re-noising those
weights). Before K steps have passed the oldest version is the initial one (pipeline warm-up).
With no perturbation and K = 0 the rollout model is the student itself (no copy), unless asked
for a copy (`stale:0`, which must and does reproduce the clean run bit for bit). With an engine spec
(`engine:llama.cpp,…`) the served weights are exported to the engine after every refresh and the
engine samples the rollouts (`engine`).
"""

from __future__ import annotations

import copy
import hashlib
import tempfile
from collections import deque
from pathlib import Path

import torch
from torch import nn

from mismatch.rollout.llamacpp import open_engine
from mismatch.rollout.source import RolloutSource
from mismatch.errors import InputError
from mismatch.model.generate import Samples
from mismatch.model.loader import LM
from mismatch.perturb import perturb_, restore_
from mismatch.rollout.spec import RolloutSpec


class RolloutCopy:
    """The model that generates rollouts: the student's weights `staleness` steps old, perturbed.

    Args:
        student: the model being trained (read, never changed).
        spec: a perturbation spec (`mismatch.perturb`), an engine spec (`engine:llama.cpp,…`) or None.
        staleness: K ≥ 0.
        layers: the perturbation's layer scope; `seed`: its seed (noise is re-drawn with
            `seed + version` at each refresh).
        calibration_ids: for `quanto-…:a8` specs.
        share: with no perturbation and K = 0, serve the student itself instead of a copy that
            is reloaded with the current weights each step (the same numbers, less work).
        tokenizer: the student's tokenizer, needed to export to an engine.
    """

    def __init__(self, student: nn.Module, spec: str | None = None, staleness: int = 0, *,
                 layers: str = "linear", seed: int = 0, calibration_ids: torch.Tensor | None = None,
                 share: bool = True, tokenizer=None) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be ≥ 0, got {staleness}")
        parsed = RolloutSpec.parse(spec)
        if parsed.perturbation is None and parsed.engine is None and not parsed.is_clean:
            raise InputError(f"{spec}: the copy's lag and reuse are its `staleness` and the loop's; give the "
                             "copy a perturbation or engine spec")
        self.engine_config = parsed.engine
        spec = parsed.perturbation_spec
        if self.engine_config is not None:  # the served weights run in the engine, unperturbed here
            share = True
        self.student, self.spec, self.staleness = student, spec, staleness
        self.layers, self.seed, self.calibration_ids = layers, seed, calibration_ids
        self.version = 0  # optimizer steps of the student so far
        self.served_version = 0  # which version the rollout model holds
        self.ring: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=staleness + 1)
        self.is_student = share and spec is None and staleness == 0
        self.model = student if self.is_student else copy.deepcopy(student)
        if not self.is_student:
            self.model.requires_grad_(False)
            self.ring.append((0, self._weights()))
        self._snapshot = None
        self._perturb()
        self.engine, self.tokenizer = None, tokenizer
        self._engine_dir = tempfile.TemporaryDirectory(prefix="mismatch-engine-") if self.engine_config else None
        self._export()

    def _export(self) -> None:
        """With an engine spec: export the served weights and (re)open the engine on them."""
        if self.engine_config is None:
            return
        if self.engine is not None:
            self.engine.close()
        cfg = self.engine_config
        self.engine = open_engine(LM(self.model, self.tokenizer, "rollout"), cfg.weights, cfg.kv,
                                  path=Path(self._engine_dir.name) / "rollout.gguf")

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.student.state_dict().items()}

    def _perturb(self) -> None:
        if self.spec is not None:
            self._snapshot = perturb_(self.model, self.spec, layers=self.layers,
                                      seed=self.seed + self.served_version, calibration_ids=self.calibration_ids)

    def refresh(self) -> None:
        """Call after each optimizer step of the student: serve the weights `staleness` steps old."""
        self.version += 1
        if self.is_student:
            self.served_version = self.version
            self._export()
            return
        self.ring.append((self.version, self._weights()))
        if self._snapshot is not None:
            restore_(self.model, self._snapshot)
            self._snapshot = None
        self.served_version, weights = self.ring[0]
        with torch.no_grad():
            self.model.load_state_dict(weights)
        self._perturb()
        self._export()

    def sample(self, prompts: list[str], *, max_new_tokens: int, seed: int, temperature: float = 1.0,
               top_p: float | None = None, chat: bool = False, context: tuple[tuple[str, str], ...] = (),
               name: str = "rollout") -> Samples:
        """One response per prompt from whatever serves the rollouts now (the served weights in PyTorch, or
        the engine they were exported to), with that sampler's own log-probs: `RolloutSource.sample`."""
        source = RolloutSource(LM(self.model, self.tokenizer, name), self.tokenizer, engine=self.engine)
        return source.sample(prompts, max_new_tokens=max_new_tokens, seed=seed, temperature=temperature, top_p=top_p,
                             chat=chat, context=context)


def rollout_seed(seed: int, step: int, resample: int = 0) -> int:
    """The sampling seed of optimizer step `step` of a run with seed `seed`: `seed·1000003 + step`, or for
    the A/A control's stream S ≥ 1 (`resample:S`) 32 bits of SHA-256 of (seed, step, S) — torch's CPU
    generator keeps 32 bits of a seed, so an offset stream would wrap onto the clean ones."""
    if resample == 0:
        return seed * 1_000_003 + step
    return int.from_bytes(hashlib.sha256(f"resample/{resample}/{seed}/{step}".encode()).digest()[:4], "little")
