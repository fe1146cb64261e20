"""On-policy distillation losses, per token, on one chunk of response tokens.

Notation: the student `π_S` is the policy being trained, the teacher `π_T` is fixed, the rollout
policy `π_R` generated the tokens `y_t` (the student itself, or a quantized / noisy / stale copy).
Every function takes fp32 log-probabilities and returns one value per token (`[C]`); the
training loop sums them over chunks and divides by the number of response tokens, so the loss
and its gradient do not depend on the chunk size (up to fp32 rounding).

* `pg-rkl` (sampled-token reverse KL as a per-token policy-gradient signal): the advantage
  `A_t = log π_T(y_t) − log π_S(y_t)`, held constant (stop-gradient), and the surrogate
  `ℓ_t = −A_t · log π_S(y_t)`, whose gradient `−A_t ∇ log π_S(y_t)` is, for `y ~ π_S`, an
  unbiased per-token estimate of `∇ KL(π_S ‖ π_T)` (the score-function term `E[∇ log π_S] = 0`
  drops the `+1`). Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning
  from Self-Generated Mistakes" (GKD, λ = 1, reverse KL); Thinking Machines 2025, "On-Policy
  Distillation" (per-token reverse KL as the advantage, discount 0).
* `pg-rkl-is` (the same signal as the frameworks run it: Thinking Machines' blog and the Tinker
  cookbook's `importance_sampling` loss, rLLM's `adv_estimator=distill`): the advantage is computed
  from the *sampler's* log-probs, `A_t = log π_T(y_t) − log π_R(y_t)`, and the update is weighted by
  the importance ratio to the sampler, `w_t = π_S(y_t) / π_R(y_t)` (`min(w_t, C)` under TIS):
  `ℓ_t = −sg(w_t · A_t) · exp(log π_S(y_t) − sg(log π_S(y_t)))`, whose value is `−w_t · A_t` and whose
  gradient is `−w_t · A_t · ∇ log π_S(y_t)` — Tinker's `−exp(log π_S − log π_R) · A` exactly
  without TIS. Here the rollout copy's mismatch enters the gradient itself (through `A_t` and
  `w_t`), not only the choice of prefixes. With `π_R = π_S` it is `pg-rkl`, bit for bit.
* `full-rkl`: `Σ_v π_S(v) (log π_S(v) − log π_T(v))` at each rollout position (exact reverse KL
  over the whole vocabulary; gradient through `π_S` everywhere).
* `full-fkl`: `Σ_v π_T(v) (log π_T(v) − log π_S(v))` (forward KL, supervised-KD style).
* truncated importance sampling (`tis_weights`): `w_t = min(π_S(y_t) / π_R(y_t), C)`, held
  constant, multiplies each token's term so that updates computed on `π_R`'s samples target
  `π_S` (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training", TIS with C = 2). Off by default.

Each loss is registered once (`register_loss`): its name, per-token function, whether it needs
the full vocabulary or only the sampled tokens' log-probs, and a one-line description; `LOSSES`
and `token_loss` read the registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mismatch.errors import InputError
from mismatch.registry import Registry


def pg_rkl(logp_student_C: torch.Tensor, logp_teacher_C: torch.Tensor) -> torch.Tensor:
    """Per-token policy-gradient surrogate `−sg(log π_T(y) − log π_S(y)) · log π_S(y)`, `[C]`.

    Args:
        logp_student_C: `log π_S(y_t)` of the sampled tokens (carries the gradient), nats.
        logp_teacher_C: `log π_T(y_t)` of the same tokens, nats.
    """
    advantage = (logp_teacher_C - logp_student_C).detach()
    return -advantage * logp_student_C


def pg_rkl_is(logp_student_C: torch.Tensor, logp_teacher_C: torch.Tensor, logp_rollout_C: torch.Tensor,
              cap: float | None = None) -> torch.Tensor:
    """Per-token importance-weighted surrogate of the sampled-token reverse KL, `[C]`: value
    `−w·A`, gradient `−w·A·∇ log π_S(y)`, with `A = log π_T(y) − log π_R(y)` and `w = π_S(y)/π_R(y)`
    (`min(w, cap)` with a TIS cap), both held constant.

    Args:
        logp_student_C: `log π_S(y_t)` (carries the gradient); logp_teacher_C: `log π_T(y_t)`;
        logp_rollout_C: `log π_R(y_t)`, the sampler's own log-probs of the tokens it sampled (nats).
        cap: truncated importance sampling cap, or None for the plain ratio.
    """
    weight = tis_weights(logp_student_C, logp_rollout_C, cap if cap is not None else math.inf)
    advantage = logp_teacher_C - logp_rollout_C
    return -(weight * advantage).detach() * torch.exp(logp_student_C - logp_student_C.detach())


def full_rkl(logp_student_CV: torch.Tensor, logp_teacher_CV: torch.Tensor) -> torch.Tensor:
    """Per-token reverse KL `Σ_v π_S (log π_S − log π_T)` over the vocabulary, `[C]` nats.

    Both inputs are `[C, V]` fp32 log-probabilities; the gradient flows through the student's.
    """
    return (logp_student_CV.exp() * (logp_student_CV - logp_teacher_CV)).sum(-1)


def full_fkl(logp_student_CV: torch.Tensor, logp_teacher_CV: torch.Tensor) -> torch.Tensor:
    """Per-token forward KL `Σ_v π_T (log π_T − log π_S)` over the vocabulary, `[C]` nats."""
    return (logp_teacher_CV.exp() * (logp_teacher_CV - logp_student_CV)).sum(-1)


def tis_weights(logp_student_C: torch.Tensor, logp_rollout_C: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights `min(π_S(y) / π_R(y), cap)`, `[C]`, no gradient."""
    return torch.exp(logp_student_C.detach() - logp_rollout_C).clamp(max=cap)


@dataclass(frozen=True, kw_only=True)
class Loss:
    """One registered OPD loss.

    Attributes:
        name: its name in configs and results (`pg-rkl`, …).
        per_token: `(logp_student, logp_teacher) -> [C]` terms; the inputs are `[C, V]` when
            `full_vocab`, else the `[C]` log-probs of the sampled tokens.
        full_vocab: whether it reads the whole vocabulary or only the sampled tokens.
        description: one line, with the formula's source.
        weighted: the loss weights itself by the importance ratio to the sampler (its `per_token`
            takes the sampler's log-probs and the TIS cap as two more arguments); the loop then
            does not multiply TIS weights onto it.
    """

    name: str
    per_token: Callable[..., torch.Tensor]
    full_vocab: bool
    description: str
    weighted: bool = False


LOSS_REGISTRY: Registry[Loss] = Registry("loss", InputError)  # read-only mapping, in registration order


def register_loss(loss: Loss) -> Loss:
    """Register `loss` under its name; returns it. Raises `ValueError` when the name is taken."""
    return LOSS_REGISTRY.register(loss.name, loss)


def get_loss(name: str) -> Loss:
    """The registered loss `name`; a one-line `InputError` listing the registered ones otherwise."""
    return LOSS_REGISTRY.get(name)


register_loss(Loss(name="pg-rkl", per_token=pg_rkl, full_vocab=False,
                   description="sampled-token reverse KL as a per-token policy gradient "
                               "(Agarwal et al. 2024, GKD; Thinking Machines 2025)"))
register_loss(Loss(name="pg-rkl-is", per_token=pg_rkl_is, full_vocab=False, weighted=True,
                   description="sampled-token reverse KL with the sampler's log-probs in the advantage and the "
                               "importance ratio (Thinking Machines 2025; Tinker's importance_sampling loss)"))
register_loss(Loss(name="full-rkl", per_token=full_rkl, full_vocab=True,
                   description="exact reverse KL(π_S ‖ π_T) over the vocabulary at each rollout position"))
register_loss(Loss(name="full-fkl", per_token=full_fkl, full_vocab=True,
                   description="forward KL(π_T ‖ π_S) over the vocabulary (supervised-KD style)"))

LOSSES: tuple[str, ...] = tuple(LOSS_REGISTRY)  # ("pg-rkl", "pg-rkl-is", "full-rkl", "full-fkl")


def token_loss(name: str, logp_student_CV: torch.Tensor, logp_teacher_CV: torch.Tensor,
               token_C: torch.Tensor, logp_rollout_C: torch.Tensor | None = None,
               tis_cap: float | None = None) -> torch.Tensor:
    """The per-token terms of a registered loss, from full log-probs.

    Args:
        name: one of `LOSSES`.
        logp_student_CV: `[C, V]` fp32 log π_S (carries the gradient), nats.
        logp_teacher_CV: `[C, V]` fp32 log π_T, nats.
        token_C: `[C]` the rollout tokens y_t (read by sampled-token losses only).
        logp_rollout_C: `[C]` the sampler's log π_R(y_t) (read by a `weighted` loss only; None: the
            student sampled them itself, π_R = π_S). tis_cap: its TIS cap (a `weighted` loss only).

    Returns:
        `[C]` per-token loss terms, nats.

    Raises:
        ValueError: unknown loss name.
    """
    loss = get_loss(name)
    if loss.full_vocab:
        return loss.per_token(logp_student_CV, logp_teacher_CV)
    idx = token_C.unsqueeze(-1)
    student_C, teacher_C = logp_student_CV.gather(-1, idx).squeeze(-1), logp_teacher_CV.gather(-1, idx).squeeze(-1)
    if not loss.weighted:
        return loss.per_token(student_C, teacher_C)
    rollout_C = logp_rollout_C if logp_rollout_C is not None else student_C.detach()
    return loss.per_token(student_C, teacher_C, rollout_C, tis_cap)
