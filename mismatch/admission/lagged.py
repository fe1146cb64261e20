"""The pipeline's window statistic measured on the user's checkpoint: staleness, reuse, a format, or both.

A stale rollout copy equals the student until the student moves, so no statistic of the checkpoint alone
can see it; and the statistic that predicts tolerance across sources is the one measured a few updates in
(the window statistic, `reports/admission_transfer.md`), for a format too. Given a teacher, `measure_lag` runs
the pipeline's first `K + WINDOW` OPD steps from the checkpoint on the calibration prompts — the study's own
step (`mismatch.opd.trainer.opd_step`: the rollout copy under its perturbation spec, the ring of past weights
for `stale:K`, the kept batch for `reuse:R`), under the user's learning rate, AdamW β1 and
loss at a constant rate (a warm-up would hide the lag the pipeline lives with after it) — and averages each
sampled-token statistic over the window the study's window statistics use (`transfer.window_steps`), with a
t-interval over those steps. The check judges it against the window limit fitted on every source
(`Thresholds.window_limits`). The checkpoint's weights are restored bit for bit afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mismatch.admission.limits import STATISTICS
from mismatch.admission.transfer import WINDOW, window_steps
from mismatch.errors import InputError
from mismatch.model.device import model_device
from mismatch.model.loader import LM
from mismatch.opd.config import OPDConfig
from mismatch.opd.losses import get_loss
from mismatch.opd.precision import trainer_precision
from mismatch.analysis.tolerance import t_interval
from mismatch.pairs.load import Pair


@dataclass(frozen=True)
class TrainerSettings:
    """The user's trainer, as far as a lag depends on it: learning rate, AdamW β1, loss (names as `opd`'s
    and the study files'), TIS cap. Defaults: `OPDConfig`'s."""

    lr: float = OPDConfig.lr
    adam_beta1: float = OPDConfig.adam_beta1
    loss: str = OPDConfig.loss
    tis_cap: float | None = None

    def __post_init__(self) -> None:
        get_loss(self.loss)  # an unknown loss: the registry's one-line InputError, naming the registered ones
        if not self.lr > 0 or not 0 <= self.adam_beta1 < 1 or (self.tis_cap is not None and self.tis_cap <= 0):
            raise InputError(f"trainer settings need lr > 0, 0 ≤ adam_beta1 < 1 and tis_cap > 0, got lr {self.lr:g}, "
                             f"adam_beta1 {self.adam_beta1:g}, tis_cap {self.tis_cap}")

    def describe(self) -> str:
        tis = "off" if self.tis_cap is None else f"{self.tis_cap:g}"
        return f"lr {self.lr:g}, adam_beta1 {self.adam_beta1:g}, loss {self.loss}, tis_cap {tis}"


@dataclass
class LagMeasurement:
    """Each statistic's mean over the window steps and its 95% t-interval over them (`statistics`:
    name → (mean, low, high)), the steps run and the window, and every step's values (`per_step`)."""

    staleness: int
    reuse: int
    settings: TrainerSettings
    steps: int
    window: tuple[int, int]  # first and last step averaged
    statistics: dict[str, tuple[float, float, float]]
    per_step: list[dict[str, float]] = field(default_factory=list)
    rollout: str = "none"  # the rollout copy's perturbation spec (`none`: the student itself)
    layers: str = "linear"  # its scope


@dataclass(frozen=True)
class _Prompts:
    """The calibration prompts as a pair's prompt source: all of them train, none held out."""

    items: tuple[str, ...]

    def count(self, split: str) -> int:
        return len(self.items) if split == "train" else 0

    def prompts(self, split: str, n: int, seed: int = 0) -> list[str]:
        return list(self.items[:n]) if split == "train" else []


def pipeline_rollout(rollout: str, staleness: int, reuse: int) -> str:
    """The OPD rollout string of a pipeline measured by `measure_lag` (its perturbation spec, else `reuse:R`,
    else `none`; the lag is OPD's `staleness`), refusing what cannot be measured: nothing (no perturbation,
    K = 0 and R = 1), or a perturbation with reuse (OPD reuses the student's own batches)."""
    static = rollout not in ("", "none")
    if staleness == 0 and reuse == 1 and not static:
        raise InputError("nothing to measure: staleness 0 and reuse 1 is the clean pipeline")
    if static and reuse > 1:
        raise InputError(f"{rollout} with reuse:{reuse}: OPD reuses the student's own batches; check the "
                         "perturbation and the reuse separately")
    return rollout if static else f"reuse:{reuse}" if reuse > 1 else "none"


def measure_lag(student: LM, teacher: LM, prompts: list[str], *, staleness: int, reuse: int,
                settings: TrainerSettings = TrainerSettings(), chat: bool, context: tuple[tuple[str, str], ...] = (),
                teacher_context: tuple[tuple[str, str], ...] = (), max_new_tokens: int, seed: int = 0,
                window: int = WINDOW, rollout: str = "none", layers: str = "linear") -> LagMeasurement:
    """Run the pipeline's first OPD steps from `student` against `teacher` on `prompts` (every step samples
    all of them, seeded by step), its rollouts from the copy under `rollout` (a perturbation spec, on `layers`)
    lagging by `staleness` / `reuse`, and measure its window statistics (module docstring). `student`'s weights
    are restored bit for bit, also when a step fails.

    Raises:
        InputError: nothing to measure (no perturbation, K = 0 and R = 1), a perturbation with reuse (OPD
            runs reuse on the student itself), or no prompt.
    """
    opd_rollout = pipeline_rollout(rollout, staleness, reuse)
    if not prompts:
        raise InputError("no calibration prompts to train on")
    first, last = window_steps(staleness, window)
    precision = trainer_precision(next(student.model.parameters()).dtype)  # the checkpoint's, as loaded
    config = OPDConfig(pair="check", ref_dtype=precision,
                       device=str(model_device(student.model)), staleness=staleness, layers=layers,
                       rollout=opd_rollout,
                       loss=settings.loss, lr=settings.lr, adam_beta1=settings.adam_beta1, tis_cap=settings.tis_cap,
                       warmup_steps=0, decay="constant", steps=last, batch_size=len(prompts), seed=seed,
                       max_new_tokens=max_new_tokens, train_prompts=len(prompts), eval_probe=0)
    pair = Pair(name="check", student=student, teacher=teacher, task=None, prompt_source=_Prompts(tuple(prompts)),
                chat=chat, teacher_context=teacher_context, student_context=context, max_new_tokens=max_new_tokens)
    from mismatch.opd.trainer import opd_step, setup  # the trainer (torch, the losses) only when a lag is measured

    # What the run changes, given back exactly: the run trains the student's tensors in place (values saved), and
    # it replaces the tensors of any parameter or buffer it casts to the trainer's precision or moves to the
    # student's device (a teacher in fp32 beside a bf16 checkpoint, a model keeping some modules in fp32): the
    # original tensors, with their dtype and device, are put back
    saved = {k: v.detach().clone() for k, v in student.model.state_dict().items()}
    tensors = {role: ({n: p.data for n, p in lm.model.named_parameters()}, dict(lm.model.named_buffers()))
               for role, lm in (("student", student), ("teacher", teacher))}
    grad = {n: p.requires_grad for n, p in student.model.named_parameters()}
    teacher_grad = {n: p.requires_grad for n, p in teacher.model.named_parameters()}
    try:
        run = setup(config, pair)
        per_step = [opd_step(run, step) for step in range(1, last + 1)]
    finally:
        for role, lm in (("student", student), ("teacher", teacher)):
            params, buffers = tensors[role]
            for n, p in lm.model.named_parameters():
                p.data = params[n]
            for n, b in buffers.items():
                owner, _, leaf = n.rpartition(".")
                lm.model.get_submodule(owner)._buffers[leaf] = b
        with torch.no_grad():
            student.model.load_state_dict(saved)  # the values, into the original tensors
        for n, p in student.model.named_parameters():
            p.requires_grad_(grad[n])
            p.grad = None
        for n, p in teacher.model.named_parameters():
            p.requires_grad_(teacher_grad[n])
    kept = per_step[first - 1: last]
    stats = {}
    for s in STATISTICS:
        mean, half = t_interval([m[s] for m in kept]) if all(s in m for m in kept) else (math.nan, math.nan)
        stats[s] = (mean, mean - half, mean + half)
    return LagMeasurement(staleness=staleness, reuse=reuse, settings=settings, steps=last, window=(first, last),
                          statistics=stats, per_step=per_step, rollout=rollout or "none", layers=layers)
