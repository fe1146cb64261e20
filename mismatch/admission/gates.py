"""Mismatch statistics of sampled rollout tokens under the names RL frameworks log, and the gates
practitioners apply to them.

Input everywhere: the log-probabilities of each sampled response token under the training policy
(`logp_train`, the model being trained, full precision) and under the rollout policy that sampled
it (`logp_rollout`), nats, with the sequence each token belongs to. `log r = logp_train −
logp_rollout` (verl's `log_ratio`), `r` the importance ratio π_train / π_rollout.

Definitions follow the frameworks' own code, so a number here lines up with their dashboards:

* verl 0.9.1 rollout correction (`rollout_corr/…`, `verl/trainer/ppo/rollout_corr_helper.py`,
  `compute_rollout_correction_and_rejection_mask` with token TIS at 2 and `seq_mean_k1` rejection at
  "0.999_1.001"; pinned against that function in the tests): `kl` = mean over tokens of −log r (k1
  estimate of KL(π_rollout ‖ π_train)); `k3_kl` = mean of r − 1 − log r, log r not clamped;
  `training_ppl` / `rollout_ppl` = mean over sequences of exp(−mean log p) (and their `_log_ppl`);
  `log_ppl_diff` = mean over sequences of (mean log p_rollout − mean log p_train), with `_abs_diff`,
  `_max`, `_min`; `ppl_ratio` = mean over sequences of exp(log_ppl_diff) (training over rollout
  perplexity); `chi2_token` = mean r² − 1 and `chi2_seq` = mean over sequences of (∏ r)² − 1, log r
  clamped to ±20 as verl does; `rollout_is_ratio_fraction_high` / `_low`: share of tokens with r > 2 /
  r < ½; `rollout_is_eff_sample_size` = 1 / mean((w / (mean w + 1e-8))²) of the TIS weights
  w = min(r, 2), truncated from above only; `rollout_rs_seq_masked_fraction`: share of sequences whose
  mean of log(π_rollout/π_train) (per-token log r clamped to ±20) lies outside [log 0.999, log 1.001].
  verl 0.9.1 has no veto (mismatch ≤ 0.2.0 logged a `rollout_is_veto_fraction` it does not have).
  verl's masked means divide by (count + 1e-8); these divide by the count (≤ 1e-8 relative).
* slime: `train/train_rollout_logprob_abs_diff` = mean over sequences of the mean |log r|; slime's
  CI asserts ≤ 0.1.
* NeMo RL: `train/token_mult_prob_error` = mean over tokens of exp|log r| (≥ 1); its tests assert
  < 1.05.
"""

from __future__ import annotations

from dataclasses import dataclass

from mismatch.errors import InputError
from mismatch.verdict import Verdict, interval_verdict

@dataclass(frozen=True)
class Gate:
    """One limit on one statistic: `metric` must stay ≤ `limit`; `source` says where it comes from."""

    metric: str
    limit: float
    source: str

    def passes(self, value: float) -> bool:
        """A point value against the limit (`mismatch.verdict.interval_verdict` of `[value, value]`)."""
        return interval_verdict(value, value, self.limit) is Verdict.PASS


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


def preset_gates(names: tuple[str, ...] | list[str]) -> tuple[Gate, ...]:
    """The gates of the named presets (`PRESETS`), in order; an unknown name is an `InputError`."""
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise InputError(f"unknown gate preset {unknown[0]!r}; known: {', '.join(PRESETS)}")
    return tuple(g for n in names for g in PRESETS[n])
