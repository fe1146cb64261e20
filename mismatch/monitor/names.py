"""The frameworks' names for rollout/training mismatch statistics, each mapped onto the definition it follows.

The calibrated limits (`mismatch thresholds`, the shipped file) are of the check's own statistics
(`mismatch.metrics.sampled_token_metrics` under `mismatch_*`), with `log r = log π_train(y) − log
π_rollout(y)` per sampled token. A logged name is *comparable* when it is the same number by definition
(`COMPARABLE`: the same formula, or an exact conversion of logged values of the same step); any other
known name is listed with why it is not (`NOT_COMPARABLE`), and is drawn but never judged against a limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """How a statistic is read from a log: the logged names it needs, the conversion, who logs it."""

    statistic: str  # the calibrated statistic it is (`mismatch_kl`, …)
    needs: tuple[str, ...]  # logged names, all of the same step
    convert: Callable[..., float]  # the logged values (in `needs` order) → the statistic
    framework: str
    how: str  # the definition, and why it is the same number

    @property
    def logged_as(self) -> str:
        return " + ".join(self.needs)


def _same(x: float) -> float:
    return x


def _sum(a: float, b: float) -> float:
    return a + b


_OWN = "mean over tokens"
COMPARABLE: tuple[Reading, ...] = (
    # the toolkit's own names: `mismatch opd` rows, `MismatchDistillationTrainer` logs, any loop using `judge`
    *(Reading(name, (name,), _same, "mismatch", "the check's own definition") for name in (
        "mismatch_kl", "mismatch_k3", "mismatch_logp_abs_diff_mean", "mismatch_chi2_token",
        "mismatch_is_ratio_outside_frac")),
    Reading("mismatch_kl", ("rollout_corr/kl",), _same, "verl",
             f"{_OWN} of −log r (k1 estimate of KL(π_rollout‖π_train)), as mismatch_kl"),
    Reading("mismatch_k3", ("rollout_corr/k3_kl",), _same, "verl",
             f"{_OWN} of r − 1 − log r, log r not clamped, as mismatch_k3"),
    Reading("mismatch_chi2_token", ("rollout_corr/chi2_token",), _same, "verl",
             f"{_OWN} of r² − 1; verl clamps log r to ±20 first (the same number unless a token's |log r| > 20)"),
    Reading("mismatch_k3", ("mismatch_kl/all/mean",), _same, "prime-rl",
            f"{_OWN} of r − log r − 1 over the loss-masked tokens of the step's batch: prime-rl's `mismatch_kl` is "
            "the k3 estimator, mismatch_k3 (not mismatch_kl, the k1 one)"),
    Reading("mismatch_is_ratio_outside_frac",
             ("rollout_corr/rollout_is_ratio_fraction_high", "rollout_corr/rollout_is_ratio_fraction_low"), _sum,
             "verl", "share of tokens with r > 2 plus share with r < ½ (verl's default rollout_is_threshold 2: "
                     "the check's clip 2)"),
)

NOT_COMPARABLE: Mapping[str, tuple[str, str]] = {  # logged name → (framework, why no calibrated limit applies)
    "train/train_rollout_logprob_abs_diff": ("slime", "mean over sequences of each one's mean |log r|: sequence-"
                                             "weighted, not mismatch_logp_abs_diff_mean's token mean"),
    "train/token_mult_prob_error": ("NeMo RL", "mean over tokens of exp|log r|: no exact map to a mean of |log r|"),
    "rollout_corr/log_ppl_diff": ("verl", "mean over sequences of per-sequence mean log-prob differences: "
                                  "sequence-weighted, not mismatch_kl's token mean"),
    "rollout_corr/log_ppl_abs_diff": ("verl", "mean over sequences of |per-sequence mean log-prob difference|"),
    "rollout_corr/ppl_ratio": ("verl", "mean over sequences of a perplexity ratio"),
    "rollout_corr/chi2_seq": ("verl", "sequence-level χ² of ∏ r: no token-level limit"),
    "rollout_corr/rollout_is_eff_sample_size": ("verl", "ESS of TIS-truncated weights"),
    "rollout_corr/rollout_rs_seq_masked_fraction": ("verl", "share of sequences rejected by verl's geometric-mean "
                                                    "bounds"),
    "train/mis_kl": ("slime", "slime's per-token log q − log p, reduced as the mean over samples of each one's "
                     "token mean (its default loss reduction): sequence-weighted"),
    "train/mis_k3_kl": ("slime", "k3 per token, reduced as the mean over samples of each one's token mean"),
    "masked_mismatch_kl/mean": ("prime-rl", "mean over samples of the k3 mean over each one's masked tokens"),
    "unmasked_mismatch_kl/mean": ("prime-rl", "mean over samples of the k3 mean over each one's kept tokens"),
    "training/rollout_probs_diff_mean": ("verl", "mean |p_train − p_rollout| of probabilities, not log-probs"),
    "training/rollout_probs_diff_max": ("verl", "max |p_train − p_rollout| of probabilities"),
}


def comparable_names() -> set[str]:
    """Every logged name a comparable statistic is read from."""
    return {name for m in COMPARABLE for name in m.needs}
