"""How the tolerated mismatch scales with response length: brackets per length, and the power laws they allow.

Reads the level table only (`mismatch.analysis.tolerance.level_table`), no torch. A *ladder* is one continuous
mismatch knob (the noise σ) at one response length: its levels, ordered by their measured per-token
`mismatch_kl` at the first step (`first_mismatch_kl`, before any update: the statistic `mismatch check` measures
and scales by the law; a level's mean over its steps drifts down more at longer responses), are read as the
tolerance table reads them — the limit lies at or above the largest level
tolerated with every smaller one tolerated too (`low`), and below the smallest level not tolerated
(`high`); undecided levels lie inside the bracket and do not narrow it. A bracket open on one side is
censored (`high` = ∞ or `low` = 0).

`length_law` asks which power laws `limit(T) = c · T^b` pass through every bracket: the exponents `b` for
which some `c` does are an interval, found by linear programming on `log limit = log c + b log T`. That
interval is not a confidence interval of a fit; it is the set of exponents the decided verdicts allow,
each bracket end being a verdict made at the design's error (`mismatch.analysis.sequential`). The hypotheses worth
naming are `b = 0` (the tolerated mismatch is per token: constant in T), `b = −½` and `b = −1` (per
sequence: the tolerated total mismatch T·limit is constant); each is reported as allowed or excluded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from mismatch.analysis.tolerance import settings_parts, settings_text
from mismatch.pairs.catalog import PAIRS

HYPOTHESES = {"per token (b = 0)": 0.0, "b = −½": -0.5, "per sequence (b = −1)": -1.0}
STATISTIC = "first_mismatch_kl"  # a level's first-step mismatch_kl, mean over its seeds (`level_table`)


def brackets(levels: pd.DataFrame, *, by: list[str], verdict: str = "verdict",
             statistic: str = "mismatch_kl") -> pd.DataFrame:
    """Per group of `by` (e.g. the pair and settings of one length): the ladder's bracket on the
    tolerated per-token `statistic`.

    Args:
        levels: level rows with `statistic`, `verdict`, `response_tokens` and the `by` columns; pass
            one knob's levels only (e.g. the noise ladder).
        verdict: the column read as each level's verdict (`kl_verdict`: the KL ratio's alone, the same
            criterion at every length, where an exact-match accuracy would fall towards 0 with length).
        statistic: the mismatch the ladder is ordered and bracketed by (`STATISTIC` for the length law).

    Returns:
        One row per group: the `by` columns, `response_tokens` (mean over the ladder's levels), `low`
        (`statistic` of the largest level tolerated with every smaller one tolerated; 0 when the
        smallest is not), `high` (of the smallest level not tolerated; ∞ when none is), `levels`,
        `undecided` (levels inside the bracket, uncertain).
    """
    out = []
    for key, group in levels.groupby(by, sort=True):
        ladder = group.sort_values(statistic, kind="stable")
        low = 0.0
        for kl, word in zip(ladder[statistic], ladder[verdict]):
            if word != "tolerated":
                break
            low = float(kl)
        refused = ladder[ladder[verdict] == "not tolerated"][statistic]
        high = float(refused.min()) if len(refused) else math.inf
        inside = ladder[(ladder[statistic] > low) & (ladder[statistic] < high)]
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(response_tokens=float(ladder["response_tokens"].mean()), low=low, high=high, levels=len(ladder),
                   undecided=int((inside[verdict] == "uncertain").sum()))
        out.append(row)
    return pd.DataFrame(out)


def exponent_text(b: float | None, side: int) -> str:
    """An exponent as the reports and the check's notes write it (`+0.25`); an open end — ±∞, or NaN / None as
    a thresholds file holds one — as +∞ on the upper `side` (> 0), −∞ on the lower."""
    return f"{b:+.2f}" if b is not None and math.isfinite(b) else ("+∞" if side > 0 else "−∞")


@dataclass(frozen=True)
class LengthLaw:
    """The power laws `limit(T) = c·T^b` that pass through every bracket.

    Attributes:
        lengths: the mean response lengths (tokens) of the brackets.
        b_low, b_high: the interval of allowed exponents (NaN both when no power law passes through every
            bracket: `consistent` False); ±∞ where the brackets leave it open.
        b_mid: the least-squares exponent through the brackets' geometric midpoints (closed brackets
            only; NaN with fewer than two).
        hypotheses: name → whether that exponent is allowed.
    """

    lengths: tuple[float, ...]
    b_low: float
    b_high: float
    b_mid: float
    hypotheses: dict[str, bool]

    @property
    def consistent(self) -> bool:
        return not math.isnan(self.b_low)

    def describe(self) -> str:
        """One line: the interval, the midpoint fit, the hypotheses allowed and excluded."""
        if not self.consistent:
            return "no power law passes through every bracket"
        allowed = [n for n, ok in self.hypotheses.items() if ok]
        excluded = [n for n, ok in self.hypotheses.items() if not ok]
        mid = (f"midpoints: {exponent_text(self.b_mid, 1)}" if not math.isnan(self.b_mid)
               else "no midpoint fit: fewer than two closed brackets")
        return (f"exponent b in [{exponent_text(self.b_low, -1)}, {exponent_text(self.b_high, 1)}] ({mid}); "
                f"allowed: {', '.join(allowed) or 'none'}; excluded: {', '.join(excluded) or 'none'}")

    @property
    def informative(self) -> bool:
        """Whether the brackets bound the exponent on at least one side (a ladder whose brackets are all open
        on the same side allows every exponent: it measured no law)."""
        return self.consistent and (math.isfinite(self.b_low) or math.isfinite(self.b_high))


def length_law(table: pd.DataFrame) -> LengthLaw:
    """The exponents allowed by the brackets of `table` (`brackets`' rows, one per length ≥ 2 lengths)."""
    t = np.log(table["response_tokens"].to_numpy(float))
    low = table["low"].to_numpy(float)
    lo = np.full(len(low), -np.inf)  # a bracket open below (low 0) bounds nothing
    lo[low > 0] = np.log(low[low > 0])
    hi = np.log(table["high"].to_numpy(float))
    # variables (log c, b): lo_i ≤ log c + b·t_i ≤ hi_i, written as A x ≤ u
    rows, bounds = [], []
    for ti, l, h in zip(t, lo, hi):
        if math.isfinite(h):
            rows.append([1.0, ti]), bounds.append(h)
        if math.isfinite(l):
            rows.append([-1.0, -ti]), bounds.append(-l)

    def extreme(sign: float) -> float:
        if not rows:
            return -sign * math.inf
        res = linprog([0.0, sign], A_ub=np.array(rows), b_ub=np.array(bounds), bounds=[(None, None), (None, None)],
                      method="highs")
        if res.status == 2:  # infeasible
            return math.nan
        if res.status == 3:  # unbounded in that direction
            return -sign * math.inf
        return float(res.x[1])

    b_low, b_high = extreme(1.0), extreme(-1.0)
    closed = np.isfinite(lo) & np.isfinite(hi)
    b_mid = float(np.polyfit(t[closed], (lo[closed] + hi[closed]) / 2, 1)[0]) if closed.sum() >= 2 else math.nan
    if math.isnan(b_low) or math.isnan(b_high):
        b_low = b_high = math.nan
    hypotheses = {name: bool(not math.isnan(b_low) and b_low - 1e-9 <= b <= b_high + 1e-9) for name, b in HYPOTHESES.items()}
    return LengthLaw(tuple(float(x) for x in table["response_tokens"]), b_low, b_high, b_mid, hypotheses)


def family(pair: str) -> str:
    """The models a pair's runs train: the build a registered pair shares (`PairSpec.build`), else the
    pair itself."""
    spec = PAIRS.get(pair)
    return (spec.build or pair) if spec is not None else pair


LENGTH_SETTING = "max_new_tokens"  # the settings item that caps the response: a rung's, not the ladder's


def setting_value(settings: str, name: str) -> str | None:
    """The value of the item `name` in a level's settings text (`mismatch.analysis.tolerance.run_table`):
    `("lr 0.0003, tis_cap off", "tis_cap")` → `"off"`; None where the text has no such item (a setting the
    dataset never varied)."""
    values = [item.removeprefix(name + " ") for item in settings_parts(settings) if item.startswith(name + " ")]
    return values[0] if values else None


def split_length(settings: str) -> tuple[str, str]:
    """A level's settings text (`mismatch.analysis.tolerance.run_table`) as (the ladder's settings, the response cap):
    `"lr 0.0003, max_new_tokens 16"` → `("lr 0.0003", "16")`; without a cap item, `(settings, "")`; `off` is the
    pair's own cap."""
    rest = [item for item in settings_parts(settings) if not item.startswith(LENGTH_SETTING + " ")]
    return settings_text(rest), setting_value(settings, LENGTH_SETTING) or ""


def is_rung(settings: pd.Series) -> pd.Series:
    """Which levels ran at a response cap of their own (`max_new_tokens` set: a length ladder's rung), not at
    their pair's."""
    return settings.map(lambda s: split_length(s)[1] not in ("", "off"))


def rungs(levels: pd.DataFrame, families) -> pd.DataFrame:
    """`levels` with `family`, the ladder's `base_settings` and each level's response cap `max_new_tokens`."""
    split = [split_length(s) for s in levels["settings"]]
    return levels.assign(family=levels["pair"].map(families), base_settings=[b for b, _ in split],
                         max_new_tokens=[c for _, c in split])


def firm_verdicts(levels: pd.DataFrame) -> pd.DataFrame:
    """`levels` with each marginal level's KL verdict (`marginal`: its interval clears its threshold by less than
    the evaluation's Monte-Carlo error, `mismatch.analysis.tolerance.level_table`) taken as undecided: the verdicts
    a length law may rest on where it carries a limit to lengths no ladder ran (`mismatch.admission.thresholds`)."""
    if "marginal" not in levels:
        return levels
    marginal = levels["marginal"].fillna(False).astype(bool)
    return levels.assign(kl_verdict=levels["kl_verdict"].where(~marginal, "uncertain"))


def length_tables(levels: pd.DataFrame, families=family) -> tuple[pd.DataFrame, list[tuple[tuple, object]]]:
    """The brackets of every length ladder in `levels` and each ladder's `LengthLaw`: `(table, [(key, law)])`,
    the key being (family, loss, settings without the response cap); `families(pair)` names the models each
    pair trains. A rung is a (pair, `max_new_tokens`)."""
    if levels.empty or "response_tokens" not in levels:
        return pd.DataFrame(), []
    noise = levels[(levels["source"] == "noise") & np.isfinite(levels["response_tokens"].astype(float))]
    noise = rungs(noise, families)  # a level without a measured response length is on no length ladder
    tables, laws = [], []
    for key, group in noise.groupby(["family", "loss", "base_settings"], sort=True):
        if len(group[["pair", "max_new_tokens"]].drop_duplicates()) < 2:
            continue
        table = brackets(group, by=["pair", "max_new_tokens"], verdict="kl_verdict",
                         statistic=STATISTIC).sort_values("response_tokens")
        law = length_law(table)
        laws.append((key, law))
        tables.append(table.assign(family=key[0], loss=key[1], settings=key[2], b_low=law.b_low, b_high=law.b_high,
                                   b_mid=law.b_mid, law=law.describe()))
    return (pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), laws
