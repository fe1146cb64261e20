"""Per-token divergence metrics of one chunk of tokens, and their summary statistics.

Definitions are fixed in DESIGN.md (natural log, nats, fp32 full vocabulary). Beside them,
the summary carries what RL frameworks log for rollout/training mismatch: `chi2_token` = E[r²] − 1
and `is_ess` = 1/E[(w/E w)²] (verl's rollout-correction metrics), `dp_rms` = RMS of q(y) − p(y)
(the probability difference slime logs), `k3` = r − 1 − log r (Schulman's KL estimator) and KL
percentiles as llama.cpp's `--kl-divergence` prints.
"""

from __future__ import annotations

import torch


def token_metrics_(logp_ref_CV: torch.Tensor, logp_cand_CV: torch.Tensor, token_C: torch.Tensor, *,
                   ref_shared: bool = False, argmax_ref_C: torch.Tensor | None = None
                   ) -> dict[str, torch.Tensor]:
    """Per-token divergences of one chunk of tokens (DESIGN.md definitions), each `[C]`.

    Takes fp32 log-probabilities `log p`, `log q` (`[C, V]`, from `log_softmax` of the reference
    and candidate logits) and the scored tokens `y` (`[C]`):
    kl_fwd = Σ p (log p − log q); kl_rev = Σ q (log q − log p); tv = ½ Σ |p − q|;
    r = p(y)/q(y); k3 = r − 1 − log r. Consumes its inputs (both are exponentiated in place),
    so only three `[C, V]` buffers ever exist; with `ref_shared` the reference log-probs are
    left intact (a cache), and `argmax_ref_C` may supply their precomputed argmax.
    """
    lp, lq = logp_ref_CV, logp_cand_CV
    top1 = (lp.argmax(-1) if argmax_ref_C is None else argmax_ref_C) == lq.argmax(-1)
    idx = token_C.unsqueeze(-1)
    logp_ref, logp_cand = lp.gather(-1, idx).squeeze(-1), lq.gather(-1, idx).squeeze(-1)
    d = lp - lq
    p = lp.exp() if ref_shared else lp.exp_()
    kl_fwd = torch.linalg.vecdot(p, d)  # fused multiply-sum: no [C, V] temporary
    q = lq.exp_()
    kl_rev = torch.linalg.vecdot(q, d).neg() + 0.0  # + 0.0 turns -0.0 into 0.0 for identical inputs
    del d
    tv = p.sub_(q).abs_().sum(-1) * 0.5
    log_r = logp_ref.double() - logp_cand.double()  # [C]: cheap to keep in float64
    # k3 = r − 1 − log r ≈ (log r)²/2 near r = 1: expm1 avoids the cancellation of r − 1.
    return {"logp_ref": logp_ref, "logp_cand": logp_cand, "kl_fwd": kl_fwd, "kl_rev": kl_rev,
            "tv": tv, "top1_agree": top1, "is_ratio": log_r.exp(), "k3": torch.expm1(log_r) - log_r}


def summarize(tok: dict[str, torch.Tensor], seq_N: torch.Tensor, clip: float) -> dict[str, float]:
    """Summary statistics of per-token metrics (`[N]` tensors), in float64. Keys: DESIGN.md."""
    t = {k: v.double() for k, v in tok.items()}
    kl, r = t["kl_fwd"], t["is_ratio"]
    log_r = t["logp_ref"] - t["logp_cand"]
    abs_diff = log_r.abs()
    q_levels = torch.tensor([0.01, 0.10, 0.50, 0.90, 0.99, 0.999], dtype=torch.float64)
    p1, p10, p50, p90, p99, p999 = torch.quantile(kl, q_levels).tolist()
    w = r / r.mean()
    seq_sums = torch.zeros(int(seq_N.max()) + 1, dtype=torch.float64).index_add_(0, seq_N, log_r)
    present = torch.bincount(seq_N) > 0
    out = {
        "tokens": float(kl.numel()),
        "sequences": float(present.sum()),
        "kl_fwd_mean": kl.mean(), "kl_fwd_p1": p1, "kl_fwd_p10": p10, "kl_fwd_p50": p50,
        "kl_fwd_p90": p90, "kl_fwd_p99": p99, "kl_fwd_p999": p999, "kl_fwd_max": kl.max(),
        "kl_rev_mean": t["kl_rev"].mean(), "k3_mean": t["k3"].mean(), "tv_mean": t["tv"].mean(),
        "top1_agree": t["top1_agree"].mean(),
        "logp_abs_diff_mean": abs_diff.mean(), "logp_abs_diff_max": abs_diff.max(),
        "is_ratio_outside_frac": ((r < 1.0 / clip) | (r > clip)).double().mean(),
        "seq_log_ratio_abs_mean": seq_sums[present].abs().mean(),
        "ppl_ratio": torch.exp((-t["logp_cand"]).mean() - (-t["logp_ref"]).mean()),
        "chi2_token": (r * r).mean() - 1.0,
        "is_ess": 1.0 / (w * w).mean(),
        "dp_rms": ((t["logp_cand"].exp() - t["logp_ref"].exp()) ** 2).mean().sqrt(),
    }
    return {k: float(v) for k, v in out.items()}


def sampled_token_metrics(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, clip: float = 2.0
                          ) -> dict[str, float]:
    """Training/rollout mismatch on the rollout's own sampled tokens (`y ~ π_R`), as RL
    frameworks log it (verl's rollout-correction metrics).

    With `log r = log π_train(y) − log π_rollout(y)` per token (`[N]` each, nats):
    `kl` = mean(−log r) (the k1 estimate of KL(π_R ‖ π_train)), `k3` = mean(r − 1 − log r) (the
    k3 estimate of the same KL), `logp_abs_diff_mean` / `_max` = |log r|,
    `is_ratio_outside_frac` = share of r outside [1/clip, clip], `chi2_token` = E[r²] − 1.
    All exactly 0 when the two policies give identical log-probs.
    """
    log_r = logp_train_N.double() - logp_rollout_N.double()
    r = log_r.exp()
    return {
        "kl": float((-log_r).mean()) + 0.0,
        "k3": float((torch.expm1(log_r) - log_r).mean()),
        "logp_abs_diff_mean": float(log_r.abs().mean()),
        "logp_abs_diff_max": float(log_r.abs().max()),
        "is_ratio_outside_frac": float(((r < 1.0 / clip) | (r > clip)).double().mean()),
        "chi2_token": float((r * r).mean() - 1.0),
    }
