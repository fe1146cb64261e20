"""Per-token divergence metrics of one chunk of tokens, and their summary statistics.

Definitions are fixed in docs/design.md (natural log, nats, fp32 full vocabulary). Beside them,
the summary carries what RL frameworks log for rollout/training mismatch: `chi2_token` = E[r²] − 1
(verl's), `is_ess` = 1/E[(r/E r)²] (Kong's effective sample size of the untruncated ratios; verl's
`rollout_is_eff_sample_size` is of TIS-truncated weights, another number), `dp_rms` = RMS of
q(y) − p(y) (the probability difference slime logs), `k3` = r − 1 − log r (Schulman's KL estimator),
`ppl_cand_over_ref` = the candidate's perplexity over the reference's, pooled over tokens (the
inverse direction of verl's per-sequence `rollout_corr/ppl_ratio`, training over rollout) and KL
percentiles as llama.cpp's `--kl-divergence` prints. Every statistic of sampled tokens is computed
in float64 (k3 through `expm1`: r − 1 cancels in float32 for the tiny mismatches of FP8).
"""

from __future__ import annotations

import math

import torch

from mismatch.defaults import DEFAULT_CLIP
from mismatch.errors import InputError

VERL_VERSION = "0.9.1"  # the verl release whose `rollout_corr/…` definitions `rollout_stats` follows
SAFETY_BOUND = 20.0  # verl clamps log ratios to ±20 before exponentiating (rollout_corr_helper.SAFETY_BOUND)
IS_THRESHOLD = 2.0  # token TIS at 2: verl's default `rollout_is_threshold`
GEO_BOUNDS = (0.999, 1.001)  # verl's `seq_mean_k1` rejection at "0.999_1.001" (its geometric-mean RS)
ESS_EPS = 1e-8  # verl normalises the IS weights by (mean + 1e-8) for the ESS


def token_metrics_(logp_ref_CV: torch.Tensor, logp_cand_CV: torch.Tensor, token_C: torch.Tensor, *,
                   ref_shared: bool = False, argmax_ref_C: torch.Tensor | None = None,
                   work_2RV: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-token divergences of one chunk of tokens (docs/design.md definitions), each `[C]`.

    Takes fp32 log-probabilities `log p`, `log q` (`[C, V]`, from `log_softmax` of the reference
    and candidate logits) and the scored tokens `y` (`[C]`):
    kl_fwd = Σ p (log p − log q); kl_rev = Σ q (log q − log p); tv = ½ Σ |p − q|;
    r = p(y)/q(y); k3 = r − 1 − log r. Consumes its inputs (both are exponentiated in place),
    so only three `[C, V]` buffers ever exist; with `ref_shared` the reference log-probs are
    left intact (a cache), and `argmax_ref_C` may supply their precomputed argmax. `work_2RV`
    (fp32, R ≥ C) holds the temporaries instead of fresh tensors (the same bits; no allocation
    per chunk).
    """
    lp, lq = logp_ref_CV, logp_cand_CV
    top1 = (lp.argmax(-1) if argmax_ref_C is None else argmax_ref_C) == lq.argmax(-1)
    idx = token_C.unsqueeze(-1)
    logp_ref, logp_cand = lp.gather(-1, idx).squeeze(-1), lq.gather(-1, idx).squeeze(-1)
    work = (None, None) if work_2RV is None else work_2RV[:, :lp.shape[0]]
    d = torch.sub(lp, lq, out=work[0])
    p = torch.exp(lp, out=work[1]) if ref_shared else lp.exp_()
    kl_fwd = torch.linalg.vecdot(p, d)  # fused multiply-sum: no [C, V] temporary
    q = lq.exp_()
    kl_rev = torch.linalg.vecdot(q, d).neg() + 0.0  # + 0.0 turns -0.0 into 0.0 for identical inputs
    del d
    tv = p.sub_(q).abs_().sum(-1) * 0.5
    is_ratio, k3 = ratio_columns(logp_ref, logp_cand)
    return {"logp_ref": logp_ref, "logp_cand": logp_cand, "kl_fwd": kl_fwd, "kl_rev": kl_rev,
            "tv": tv, "top1_agree": top1, "is_ratio": is_ratio, "k3": k3}


def ratio_columns(logp_ref_N: torch.Tensor, logp_cand_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sampled token (`[N]` log-probs, nats): `(is_ratio, k3)` in float64, r = p(y)/q(y) and
    r − 1 − log r, from log r = log p(y) − log q(y)."""
    log_r = logp_ref_N.double() - logp_cand_N.double()  # [N]: cheap to keep in float64
    # k3 = r − 1 − log r ≈ (log r)²/2 near r = 1: expm1 avoids the cancellation of r − 1.
    return log_r.exp(), torch.expm1(log_r) - log_r


def log_ratio_stats(log_r_N: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
    """The one computation of the sampled-token statistics, from `log r = log p(y) − log q(y)` per
    sampled token (`[N]` float64; p the trained / reference policy, q the rollout / candidate one that
    sampled y), as 0-d float64 tensors under mismatch's own names:
    `kl` = mean(−log r) (k1 estimate of KL(q ‖ p)), `k3` = mean(r − 1 − log r) (`ratio_columns`),
    `logp_abs_diff_mean` / `_max` = |log r|, `is_ratio_outside_frac` = share of r outside
    [1/clip, clip], `chi2_token` = E[r²] − 1. The frameworks' names are aliases of these
    (`PROBE_NAMES`, `VERL_NAMES`)."""
    r = log_r_N.exp()
    return {
        "kl": (-log_r_N).mean(),
        "k3": (torch.expm1(log_r_N) - log_r_N).mean(),
        "logp_abs_diff_mean": log_r_N.abs().mean(), "logp_abs_diff_max": log_r_N.abs().max(),
        "is_ratio_outside_frac": ((r < 1.0 / clip) | (r > clip)).double().mean(),
        "chi2_token": (r * r).mean() - 1.0,
    }


# the probe summary's names for `log_ratio_stats` keys (the ones it reports), and verl's for the ones it shares
PROBE_NAMES = {"k3": "k3_mean", "logp_abs_diff_mean": "logp_abs_diff_mean", "logp_abs_diff_max": "logp_abs_diff_max",
               "is_ratio_outside_frac": "is_ratio_outside_frac", "chi2_token": "chi2_token"}
VERL_NAMES = {"kl": "rollout_corr/kl", "k3": "rollout_corr/k3_kl"}  # verl's k3_kl: exp(x) − x − 1, unclamped


def sampled_summary(logp_ref_N: torch.Tensor, logp_cand_N: torch.Tensor, seq_N: torch.Tensor, clip: float
                    ) -> dict[str, float]:
    """The summary statistics that need only the sampled tokens' log-probs (`[N]` each, nats) and
    their sequences (`[N]`), in float64: what an engine's rollout dump supports
    (`mismatch.dumps.score_rollouts`) and part of every probe's summary. Keys: tokens, sequences,
    k3_mean, logp_abs_diff_mean/max, is_ratio_outside_frac, chi2_token (`log_ratio_stats` under
    `PROBE_NAMES`), seq_log_ratio_abs_mean, ppl_cand_over_ref, is_ess, dp_rms (docs/design.md, and this
    module's docstring)."""
    lp, lq = logp_ref_N.double(), logp_cand_N.double()
    log_r = lp - lq
    r = log_r.exp()
    w = r / r.mean()
    seq_sums = torch.zeros(int(seq_N.max()) + 1, dtype=torch.float64, device=log_r.device).index_add_(0, seq_N, log_r)
    present = torch.bincount(seq_N) > 0
    shared = log_ratio_stats(log_r, clip)
    out = {
        "tokens": float(lp.numel()),
        "sequences": float(present.sum()),
        **{name: shared[key] for key, name in PROBE_NAMES.items() if key != "chi2_token"},
        "seq_log_ratio_abs_mean": seq_sums[present].abs().mean(),
        "ppl_cand_over_ref": torch.exp((-lq).mean() - (-lp).mean()),  # pooled: rollout over training
        PROBE_NAMES["chi2_token"]: shared["chi2_token"],
        "is_ess": 1.0 / (w * w).mean(),
        "dp_rms": ((lq.exp() - lp.exp()) ** 2).mean().sqrt(),
    }
    return {k: float(v) for k, v in out.items()}


def summarize(tok: dict[str, torch.Tensor], seq_N: torch.Tensor, clip: float) -> dict[str, float]:
    """Summary statistics of per-token metrics (`[N]` tensors), in float64. Keys: docs/design.md."""
    t = {k: v.double() for k, v in tok.items()}
    kl = t["kl_fwd"]
    q_levels = torch.tensor([0.01, 0.10, 0.50, 0.90, 0.99, 0.999], dtype=torch.float64, device=kl.device)
    p1, p10, p50, p90, p99, p999 = torch.quantile(kl, q_levels).tolist()
    sampled = sampled_summary(t["logp_ref"], t["logp_cand"], seq_N, clip)
    out = {
        "tokens": sampled.pop("tokens"), "sequences": sampled.pop("sequences"),
        "kl_fwd_mean": kl.mean(), "kl_fwd_p1": p1, "kl_fwd_p10": p10, "kl_fwd_p50": p50,
        "kl_fwd_p90": p90, "kl_fwd_p99": p99, "kl_fwd_p999": p999, "kl_fwd_max": kl.max(),
        "kl_rev_mean": t["kl_rev"].mean(), "k3_mean": sampled.pop("k3_mean"), "tv_mean": t["tv"].mean(),
        "top1_agree": t["top1_agree"].mean(), **sampled,
    }
    return {k: float(v) for k, v in out.items()}


def sampled_token_metrics(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, clip: float = DEFAULT_CLIP
                          ) -> dict[str, float]:
    """Training/rollout mismatch on the rollout's own sampled tokens (`y ~ π_R`), as RL
    frameworks log it (verl's rollout-correction metrics).

    With `log r = log π_train(y) − log π_rollout(y)` per token (`[N]` each, nats):
    `kl` = mean(−log r) (the k1 estimate of KL(π_R ‖ π_train)), `k3` = mean(r − 1 − log r) (the
    k3 estimate of the same KL), `logp_abs_diff_mean` / `_max` = |log r|,
    `is_ratio_outside_frac` = share of r outside [1/clip, clip], `chi2_token` = E[r²] − 1.
    (`log_ratio_stats`, the one computation, under its own names.) All exactly 0 when the two policies
    give identical log-probs. No token, or two shapes: `InputError`.
    """
    if logp_train_N.shape != logp_rollout_N.shape or logp_train_N.numel() == 0:
        raise InputError(f"need two [N] log-prob tensors with N ≥ 1, got {tuple(logp_train_N.shape)} and "
                         f"{tuple(logp_rollout_N.shape)}")
    stats = log_ratio_stats(logp_train_N.double() - logp_rollout_N.double(), clip)
    return {k: float(v) + 0.0 for k, v in stats.items()}  # + 0.0: -0.0 (identical policies) as 0.0


def _per_sequence_mean(values_N: torch.Tensor, seq_N: torch.Tensor, n_seq: int) -> torch.Tensor:
    zeros = torch.zeros(n_seq, dtype=torch.float64, device=values_N.device)
    sums = zeros.clone().index_add_(0, seq_N, values_N)
    counts = zeros.index_add_(0, seq_N, torch.ones_like(values_N))
    return sums / counts


def checked_inputs(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, seq_N: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[N]` log-probs under training and rollout and `[N]` sequence indices, as float64 / float64 /
    int64, after the checks `rollout_stats` documents (shapes, no token, log-probs finite and ≤ 0,
    sequences 0..S-1 each with a token): a one-line `InputError` otherwise."""
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


# The settings `rollout_stats` computes each framework's names under, spelled as the frameworks' own configs
# spell them: verl's `algorithm.rollout_correction` section (token TIS at IS_THRESHOLD, seq_mean_k1 rejection at
# GEO_BOUNDS) and slime's `--calculate-per-token-loss` left off (each sequence its own rollout). A log holding
# the toolkit's own statistics is read in this mode (`mismatch.monitor.names`). Not to be mutated.
ROLLOUT_STATS_CONFIG = {
    "algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": IS_THRESHOLD,
                                         "rollout_rs": "seq_mean_k1",
                                         "rollout_rs_threshold": f"{GEO_BOUNDS[0]}_{GEO_BOUNDS[1]}"}},
    "calculate_per_token_loss": False,
}


def rollout_stats(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, seq_N: torch.Tensor
                  ) -> dict[str, float]:
    """The statistics verl, slime and NeMo RL log for rollout/training mismatch, of `N` sampled tokens
    (`y ~ π_rollout`), under their own names; definitions in `mismatch.admission.gates`.

    Each framework's name is computed as that framework computes it in one mode, `ROLLOUT_STATS_CONFIG`:
    verl 0.9.1's `rollout_corr/…` with `rollout_is="token"` (its shares `rollout_is_ratio_fraction_high/low`
    are of tokens; under verl's dataclass default `"sequence"` they would be of sequences), threshold 2, and
    `rollout_rs="seq_mean_k1"` at `"0.999_1.001"`; slime's `train_rollout_logprob_abs_diff` as its default
    reduction (no `--calculate-per-token-loss`: the mean over sequences of each one's mean |log r|, every
    sequence its own rollout); NeMo RL's `token_mult_prob_error`, the same in every mode.

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
    lt, lr_, seq = checked_inputs(logp_train_N, logp_rollout_N, seq_N)
    n_seq = int(seq.max()) + 1
    log_r = lt - lr_
    log_r_safe = log_r.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    r = log_r_safe.exp()  # verl's raw token IS weights
    mean_lt, mean_lr = _per_sequence_mean(lt, seq, n_seq), _per_sequence_mean(lr_, seq, n_seq)
    log_ppl_diff = mean_lr - mean_lt
    seq_log_r_sum = torch.zeros(n_seq, dtype=torch.float64, device=log_r.device).index_add_(0, seq, log_r)
    tis = r.clamp(max=IS_THRESHOLD)  # token TIS truncates from above only
    seq_k1 = _per_sequence_mean(-log_r_safe, seq, n_seq)  # mean of log(π_rollout/π_train) per sequence
    lo, hi = math.log(GEO_BOUNDS[0]), math.log(GEO_BOUNDS[1])
    v = "rollout_corr/"
    shared = log_ratio_stats(log_r, IS_THRESHOLD)  # the statistics verl's definitions share with ours, unclamped
    out = {
        **{name: shared[key] for key, name in VERL_NAMES.items()},
        v + "training_ppl": (-mean_lt).exp().mean(),
        v + "training_log_ppl": (-mean_lt).mean(),
        v + "rollout_ppl": (-mean_lr).exp().mean(),
        v + "rollout_log_ppl": (-mean_lr).mean(),
        v + "log_ppl_diff": log_ppl_diff.mean(),
        v + "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        v + "log_ppl_diff_max": log_ppl_diff.max(),
        v + "log_ppl_diff_min": log_ppl_diff.min(),
        v + "ppl_ratio": log_ppl_diff.exp().mean(),  # training over rollout perplexity, per sequence
        v + "chi2_token": (r * r).mean() - 1.0,
        v + "chi2_seq": (2.0 * seq_log_r_sum.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean() - 1.0,
        v + "rollout_is_ratio_fraction_high": (r > IS_THRESHOLD).double().mean(),
        v + "rollout_is_ratio_fraction_low": (r < 1.0 / IS_THRESHOLD).double().mean(),
        v + "rollout_is_eff_sample_size": 1.0 / ((tis / (tis.mean() + ESS_EPS)) ** 2).mean(),
        v + "rollout_rs_seq_masked_fraction": ((seq_k1 < lo) | (seq_k1 > hi)).double().mean(),
        "train/train_rollout_logprob_abs_diff": _per_sequence_mean(log_r.abs(), seq, n_seq).mean(),
        "train/token_mult_prob_error": log_r.abs().exp().mean(),
    }
    return {k: float(x) + 0.0 for k, x in out.items()}
