"""One-sided limits on a mismatch statistic: the split that best separates tolerated levels from the
rest, the interval the data pin it to, and its confusion counts (`thresholds` fits the check's limits with
them, `transfer` compares statistics across sources with them), and the leave-one-pair-out predictions both
validate with."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

STATISTICS = ("mismatch_kl", "mismatch_k3", "mismatch_logp_abs_diff_mean", "mismatch_chi2_token",
              "mismatch_is_ratio_outside_frac")
STATIC_SOURCES = ("format", "engine", "noise")  # measurable before any update
LAGGED_SOURCES = ("stale", "reuse")


def fit_limit(x: np.ndarray, tolerated: np.ndarray) -> float:
    """The one-sided limit (admit when x ≤ limit) that best separates `tolerated` (bool) from not:
    the midpoint of the best split by balanced accuracy (geometric between positive values, else
    arithmetic), widest log gap among ties (a split at or below 0 has no scale and loses ties).
    The largest tolerated value when no point is not tolerated, or when no split beats "always
    admit" (balanced accuracy 0.5); just below the smallest value when no point is tolerated; NaN
    when there is no point."""
    x, tolerated = np.asarray(x, dtype=float), np.asarray(tolerated, dtype=bool)
    keep = np.isfinite(x)
    x, tolerated = x[keep], tolerated[keep]
    if len(x) == 0:
        return math.nan
    if tolerated.all():
        return float(x.max())
    if not tolerated.any():
        low = float(x.min())
        return low / 2.0 if low > 0 else float(np.nextafter(low, -np.inf))
    values = np.unique(x)
    best, best_key = math.nan, (-1.0, -math.inf)
    for lo, hi in zip(values[:-1], values[1:]):
        admit = x <= lo
        bal = 0.5 * (admit[tolerated].mean() + (~admit[~tolerated]).mean())
        key = (round(bal, 12), math.log(hi) - math.log(lo) if lo > 0 else -math.inf)
        if key > best_key:
            best, best_key = (math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2.0), key
    if best_key[0] <= 0.5:  # anti-predictive or no better than admitting everything
        return float(x[tolerated].max())
    return best


def bracket(x: np.ndarray, tolerated: np.ndarray, limit: float) -> list[float]:
    """`[largest tolerated value ≤ limit, smallest not-tolerated value > limit]` (NaN where none):
    any limit inside separates the points as well; the data say no more."""
    x, tolerated = np.asarray(x, dtype=float), np.asarray(tolerated, dtype=bool)
    below, above = x[tolerated & (x <= limit)], x[~tolerated & (x > limit)]
    return [float(below.max()) if len(below) else math.nan, float(above.min()) if len(above) else math.nan]


def confusion(x: np.ndarray, tolerated: np.ndarray, limit: float) -> dict[str, int]:
    """Counts of admitted / rejected (x ≤ limit or not) among tolerated and not-tolerated points."""
    admit = x <= limit
    return {"admit_tolerated": int((admit & tolerated).sum()), "admit_not": int((admit & ~tolerated).sum()),
            "reject_tolerated": int((~admit & tolerated).sum()), "reject_not": int((~admit & ~tolerated).sum())}


def held_out_predictions(points: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """Leave one pair out, each pair in turn: every level of `points` (a DataFrame with `pair`, `tolerated`
    and the `statistic` column) of the held-out pair with the limit fitted on the other pairs (`limit`),
    whether it admits the level (`admitted`; False where the statistic is missing) and whether that agrees
    with the level's label (`right`: admitted == tolerated)."""
    out = []
    for pair in sorted(points["pair"].unique()):
        train, test = points[points["pair"] != pair], points[points["pair"] == pair]
        limit = fit_limit(train[statistic].to_numpy(), train["tolerated"].to_numpy())
        admitted = test[statistic].to_numpy(dtype=float) <= limit
        out.append(test.assign(held_out=pair, limit=limit, admitted=admitted,
                               right=admitted == test["tolerated"].to_numpy(dtype=bool)))
    return (pd.concat(out, ignore_index=True) if out
            else points.assign(held_out=[], limit=[], admitted=[], right=[]))
