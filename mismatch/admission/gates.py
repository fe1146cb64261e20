"""Mismatch statistics of sampled rollout tokens under the names RL frameworks log, and the gates
practitioners apply to them.

Input everywhere: the log-probabilities of each sampled response token under the training policy
(`logp_train`, the model being trained, full precision) and under the rollout policy that sampled
it (`logp_rollout`), nats, with the sequence each token belongs to. `log r = logp_train −
logp_rollout` (verl's `log_ratio`), `r` the importance ratio π_train / π_rollout.

Definitions follow the frameworks' own code, so a number here lines up with their dashboards:

* verl rollout correction (`rollout_corr/…`): `kl` = mean over tokens of −log r (k1 estimate of
  KL(π_rollout ‖ π_train)); `k3_kl` = mean of r − 1 − log r; `training_ppl` / `rollout_ppl` = mean
  over sequences of exp(−mean log p) (and their `_log_ppl`); `log_ppl_diff` = mean over sequences of
  (mean log p_rollout − mean log p_train), with `_abs_diff`, `_max`, `_min`; `ppl_ratio` = mean
  over sequences of exp(log_ppl_diff); `chi2_token` = mean r² − 1 and `chi2_seq` = mean over
  sequences of (∏ r)² − 1, log r clamped to ±20 as verl does; token truncated IS at 2
  (`rollout_is_ratio_fraction_high` / `_low`: share of tokens with r > 2 / r < ½,
  `rollout_is_eff_sample_size` on weights clamped to [½, 2]); geometric sequence rejection
  (`rollout_rs_seq_masked_fraction`: share of sequences whose exp(mean log r) lies outside
  [0.999, 1.001], verl's `decoupled_geo_rs` default) and its per-token veto
  (`rollout_is_veto_fraction`: sequences holding a token with r < 1e-4).
* slime: `train/train_rollout_logprob_abs_diff` = mean over sequences of the mean |log r|; slime's
  CI asserts ≤ 0.1.
* NeMo RL: `train/token_mult_prob_error` = mean over tokens of exp|log r| (≥ 1); its tests assert
  < 1.05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mismatch.errors import InputError

SAFETY_BOUND = 20.0  # verl clamps log ratios to ±20 before exponentiating
IS_THRESHOLD = 2.0  # verl's default truncated-IS threshold
GEO_BOUNDS = (0.999, 1.001)  # verl's decoupled_geo_rs default bounds on exp(mean log r)
VETO = 1e-4  # verl's default per-token veto threshold


@dataclass(frozen=True)
class Gate:
    """One limit on one statistic: `metric` must stay ≤ `limit`; `source` says where it comes from."""

    metric: str
    limit: float
    source: str

    def passes(self, value: float) -> bool:
        return bool(value <= self.limit)


PRESETS: dict[str, tuple[Gate, ...]] = {
    "slime": (Gate("train/train_rollout_logprob_abs_diff", 0.1,
                   "slime CI: asserts train/train_rollout_logprob_abs_diff ≤ 0.1"),),
    "nemo-rl": (Gate("train/token_mult_prob_error", 1.05,
                     "NeMo RL functional tests: train/token_mult_prob_error < 1.05"),),
    # verl truncates and rejects per token / sequence; it refuses no configuration. The limits on the
    # shares it would truncate or reject are mismatch's, on verl's own default bounds.
    "verl": (Gate("rollout_corr/rollout_is_ratio_fraction_high", 0.01,
                  "mismatch: ≤ 1% of tokens truncated by verl's token TIS at 2"),
             Gate("rollout_corr/rollout_rs_seq_masked_fraction", 0.5,
                  "mismatch: ≤ half the sequences rejected by verl's geometric RS [0.999, 1.001]")),
}


def _per_sequence_mean(values_N: torch.Tensor, seq_N: torch.Tensor, n_seq: int) -> torch.Tensor:
    sums = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, seq_N, values_N)
    counts = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, seq_N, torch.ones_like(values_N))
    return sums / counts


def _checked(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, seq_N: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs as float64 / int64 after the checks `rollout_stats` documents."""
    if not (logp_train_N.shape == logp_rollout_N.shape == seq_N.shape) or logp_train_N.dim() != 1:
        raise InputError(f"need three [N] tensors, got {tuple(logp_train_N.shape)}, "
                         f"{tuple(logp_rollout_N.shape)}, {tuple(seq_N.shape)}")
    if logp_train_N.numel() == 0:
        raise InputError("no sampled token to score")
    lt, lr_ = logp_train_N.double(), logp_rollout_N.double()
    for name, lp in (("training", lt), ("rollout", lr_)):
        if not bool(torch.isfinite(lp).all()) or bool((lp > 0).any()):
            raise InputError(f"{name} log-probabilities must be finite and ≤ 0")
    seq = seq_N.long()
    if int(seq.min()) < 0 or bool((torch.bincount(seq, minlength=int(seq.max()) + 1) == 0).any()):
        raise InputError("sequence indices must cover 0..S-1, each with at least one token")
    return lt, lr_, seq


def rollout_stats(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, seq_N: torch.Tensor
                  ) -> dict[str, float]:
    """The verl / slime / NeMo RL statistics (module docstring) of `N` sampled tokens.

    Args:
        logp_train_N: `[N]` log π_train(y) of each sampled token, nats.
        logp_rollout_N: `[N]` log π_rollout(y) of the same tokens (the policy that sampled them).
        seq_N: `[N]` the sequence index of each token; every index in [0, max] must occur.

    Returns:
        `{name: value}` under the frameworks' own names (verl's with its `rollout_corr/` prefix).

    Raises:
        InputError: shapes differ, no token, a sequence without tokens, or a NaN/Inf/positive
            log-probability.
    """
    lt, lr_, seq = _checked(logp_train_N, logp_rollout_N, seq_N)
    n_seq = int(seq.max()) + 1
    log_r = lt - lr_
    r = log_r.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    mean_lt, mean_lr = _per_sequence_mean(lt, seq, n_seq), _per_sequence_mean(lr_, seq, n_seq)
    log_ppl_diff = mean_lr - mean_lt
    seq_log_r_sum = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, seq, log_r)
    geo = _per_sequence_mean(log_r, seq, n_seq).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    w = r.clamp(1.0 / IS_THRESHOLD, IS_THRESHOLD)
    vetoed = torch.zeros(n_seq, dtype=torch.bool).index_fill_(0, seq[log_r < math.log(VETO)], True)
    v = "rollout_corr/"
    out = {
        v + "kl": (-log_r).mean(),
        v + "k3_kl": (r - 1.0 - log_r).mean(),
        v + "training_ppl": (-mean_lt).exp().mean(),
        v + "training_log_ppl": (-mean_lt).mean(),
        v + "rollout_ppl": (-mean_lr).exp().mean(),
        v + "rollout_log_ppl": (-mean_lr).mean(),
        v + "log_ppl_diff": log_ppl_diff.mean(),
        v + "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        v + "log_ppl_diff_max": log_ppl_diff.max(),
        v + "log_ppl_diff_min": log_ppl_diff.min(),
        v + "ppl_ratio": log_ppl_diff.exp().mean(),
        v + "chi2_token": (r * r).mean() - 1.0,
        v + "chi2_seq": (2.0 * seq_log_r_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean() - 1.0,
        v + "rollout_is_ratio_fraction_high": (r > IS_THRESHOLD).double().mean(),
        v + "rollout_is_ratio_fraction_low": (r < 1.0 / IS_THRESHOLD).double().mean(),
        v + "rollout_is_eff_sample_size": 1.0 / ((w / w.mean()) ** 2).mean(),
        v + "rollout_rs_seq_masked_fraction": ((geo < GEO_BOUNDS[0]) | (geo > GEO_BOUNDS[1])).double().mean(),
        v + "rollout_is_veto_fraction": vetoed.double().mean(),
        "train/train_rollout_logprob_abs_diff": _per_sequence_mean(log_r.abs(), seq, n_seq).mean(),
        "train/token_mult_prob_error": log_r.abs().exp().mean(),
    }
    return {k: float(x) + 0.0 for k, x in out.items()}


def preset_gates(names: tuple[str, ...] | list[str]) -> tuple[Gate, ...]:
    """The gates of the named presets (`PRESETS`), in order; an unknown name is an `InputError`."""
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise InputError(f"unknown gate preset {unknown[0]!r}; known: {', '.join(PRESETS)}")
    return tuple(g for n in names for g in PRESETS[n])
