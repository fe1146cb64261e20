"""The check's judgement on sampled tokens: its statistics, their bootstrap intervals, gate decisions.

`judge(logp_train_N, logp_rollout_N, seq_N)` is the in-loop API: a training loop passes the log-probs it
already has for its first rollout batch (the trainer's and the rollout engine's, per sampled token) and
gets every statistic and one `Decision` per gate. Each gated statistic carries a 95% interval from a
bootstrap over the sequences; a gate decides by the one interval rule (`mismatch.verdict`): admit when
the whole interval lies at or below its limit, reject when wholly above, uncertain otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from mismatch.admission.gates import Gate
from mismatch.admission.thresholds import Thresholds, load_thresholds
from mismatch.errors import InputError
from mismatch.defaults import DEFAULT_CLIP
from mismatch.metrics import checked_inputs, rollout_stats, sampled_token_metrics
from mismatch.verdict import ADMISSION_WORDS, Verdict, combine, interval_verdict

BOOTSTRAP = 400  # resamples of the calibration sequences for each gated statistic's interval


@dataclass
class Decision:
    """One gate applied: the statistic's value and 95% interval, the limit, where it comes from, and its
    `verdict` (`mismatch.verdict`), which `status` says in the check's words (admit, uncertain, reject).
    `decides`: whether it enters the check's status (`overall`); False for a gate a better-transferring
    measurement superseded (the first-step gate where `check --teacher` measured the window statistic), kept
    so that its numbers are still shown."""

    metric: str
    value: float
    low: float
    high: float
    limit: float
    source: str
    verdict: Verdict  # PASS (interval ≤ limit), FAIL (interval > limit), UNCERTAIN
    decides: bool = True

    @property
    def status(self) -> str:
        """`verdict` in the check's words: admit, uncertain or reject."""
        return self.verdict.word(ADMISSION_WORDS)

    def to_dict(self) -> dict:
        """The decision as JSON-ready fields, its verdict as `status` (the check's word)."""
        out = {k: v for k, v in asdict(self).items() if k != "verdict"}
        return {**out, "status": self.status}


def overall(decisions: Iterable[Decision]) -> str:
    """The check's status: any reject → reject; else any uncertain → uncertain; else admit (nothing judged:
    uncertain) — `mismatch.verdict.combine` of the deciding decisions' verdicts, in the check's words."""
    return combine(d.verdict for d in decisions if d.decides).word(ADMISSION_WORDS)


def decide(value: float, low: float, high: float, limit: float) -> Verdict:
    """PASS (admit) when the interval lies at or below the limit, FAIL (reject) when wholly above, else (or with
    no value) UNCERTAIN: `mismatch.verdict.interval_verdict`."""
    return Verdict.UNCERTAIN if math.isnan(value) else interval_verdict(low, high, limit)


def bootstrap_intervals(values: dict[str, float], stat, seq_N: torch.Tensor, seed: int) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of each statistic in `values` over `BOOTSTRAP` resamples of the sequences;
    NaN (so every decision is uncertain) with fewer than 2 sequences, where resampling shows no spread."""
    n_seq = int(seq_N.max()) + 1
    if n_seq < 2:
        return {k: (math.nan, math.nan) for k in values}
    rows_of = [torch.nonzero(seq_N == s).squeeze(1) for s in range(n_seq)]
    gen = torch.Generator().manual_seed(seed)
    draws: dict[str, list[float]] = {k: [] for k in values}
    for _ in range(BOOTSTRAP):
        pick = torch.randint(0, n_seq, (n_seq,), generator=gen)
        idx = torch.cat([rows_of[s] for s in pick.tolist()])
        new_seq = torch.cat([torch.full((len(rows_of[s]),), i) for i, s in enumerate(pick.tolist())])
        got = stat(idx, new_seq)
        for k in values:
            draws[k].append(got[k])
    return {k: (float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975))) for k, v in draws.items()}


def judge(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, seq_N: torch.Tensor,
          gates: list[Gate] | None = None, *, clip: float = DEFAULT_CLIP, seed: int = 0
          ) -> tuple[dict[str, float], list[Decision]]:
    """The check's statistics and gate decisions on log-probs a training loop already has.

    In OPD or RL the first batch's rollouts (sampled by the rollout engine) and the trainer's
    log-probs of them before its first update are exactly what `check` samples and scores for itself;
    judging them costs only the statistics and the bootstrap.

    Args:
        logp_train_N, logp_rollout_N: `[N]` log-probs of the sampled tokens under the trained policy
            and under the rollout policy that sampled them (nats).
        seq_N: `[N]` each token's sequence (any integer labels).
        gates: default: the shipped fitted gate.

    Returns:
        `(metrics, decisions)` as in `Admission`.
    """
    gates = gates if gates is not None else resolve_gates(None, load_thresholds())
    relabelled = torch.unique(seq_N.long(), return_inverse=True)[1]  # 0..S-1, the shape of seq_N
    logp_train, logp_rollout, seq = checked_inputs(logp_train_N, logp_rollout_N, relabelled)

    def stats(idx: torch.Tensor, seq_idx: torch.Tensor) -> dict[str, float]:
        return statistics(logp_train[idx], logp_rollout[idx], seq_idx, clip=clip)

    metrics = stats(torch.arange(len(seq)), seq)
    require_statistics({g.metric for g in gates}, set(metrics))
    intervals = bootstrap_intervals({g.metric: metrics[g.metric] for g in gates}, stats, seq, seed)
    return metrics, [Decision(g.metric, metrics[g.metric], *intervals[g.metric], g.limit, g.source,
                              decide(metrics[g.metric], *intervals[g.metric], g.limit)) for g in gates]


def statistics(logp_train_N: torch.Tensor, logp_rollout_N: torch.Tensor, seq_N: torch.Tensor, *,
               clip: float = DEFAULT_CLIP) -> dict[str, float]:
    """Every statistic a gate can judge, of `N` sampled tokens (`[N]` log-probs under the trained and the
    rollout policy, nats; `[N]` sequence indices 0..S-1, each present): the check's own under
    `mismatch_*` (`mismatch.metrics.sampled_token_metrics`: `mismatch_kl`, the fitted gate's) and verl's,
    slime's and NeMo RL's under their names (`mismatch.metrics.rollout_stats`)."""
    own = sampled_token_metrics(logp_train_N, logp_rollout_N, clip)
    return {**{f"mismatch_{k}": v for k, v in own.items()}, **rollout_stats(logp_train_N, logp_rollout_N, seq_N)}


def require_statistics(names: set[str], known: set[str]) -> None:
    unknown = sorted(names - known)
    if unknown:
        raise InputError(f"no statistic {', '.join(map(repr, unknown))} to gate; one of {', '.join(sorted(known))}")


def gate_statistics() -> set[str]:
    """The names a gate can judge: the check's `mismatch_*` statistics and the frameworks' names."""
    one = torch.zeros(2, dtype=torch.float64)
    return set(statistics(one, one, torch.tensor([0, 1])))


def resolve_gates(thresholds: Thresholds | str | Path | dict[str, float] | None, table: Thresholds,
                  loss: str | None = None) -> list[Gate]:
    """The given `{metric: limit}` gates, else the fitted gate of `table` (the resolved thresholds) for a trainer's
    `loss` (`Thresholds.for_loss`: the loss's own limit where the study fitted one and `Thresholds.own_limit`
    keeps it — its leave-one-pair-out record at least the pooled limit's — else the pooled one)."""
    if isinstance(thresholds, dict):
        if not thresholds:
            raise InputError("no gate: give at least one {statistic: limit}")
        require_statistics(set(thresholds), gate_statistics())  # before any sampling
        return [Gate(k, float(v), "given limit") for k, v in thresholds.items()]
    limit, (lo, hi), _, levels = table.for_loss(loss)
    split = (f"tolerated configurations measured ≤ {lo:.3g}, not tolerated ≥ {hi:.3g}; limit at their geometric mean"
             if not math.isnan(hi) else "no configuration was not tolerated: limit at the largest tolerated value")
    return [Gate(table.primary, limit, f"{table.fitted_on}, {levels}: {split}")]


def window_gates(table: Thresholds, loss: str | None = None) -> list[Gate]:
    """The window gate of `table` for a trainer's `loss`: its primary statistic's window limit, fitted on every
    source's decided levels — the loss's own where the check uses one (`Thresholds.for_loss(loss,
    window=True)`), else the one pooled over losses — what a pipeline's window statistic, the mean over
    `table.window_steps` OPD steps, is judged against; empty when the table holds no window limit (a file
    written before they were fitted)."""
    if table.primary not in table.window_limits:
        return []
    limit, _, _, levels = table.for_loss(loss, window=True)
    return [Gate(table.primary, float(limit), f"window limit ({table.fitted_on}, {levels})")]
