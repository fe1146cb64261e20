"""The sequential design that judges a level over seeds: pre-registered looks, α spent across them.

A level (pair × source × settings × level) is judged at *looks*: after 3, 6, 10 and 16 seeds
(`Design.looks`). At look k the 95% interval of the old rule is replaced by a repeated confidence
interval `mean ± c_k · sd / √n` whose critical value `c_k` comes from a Lan–DeMets α-spending function
(Pocock-type by default, `α(t) = α · ln(1 + (e − 1)·t)` at information fraction t = n_k / n_K): the
chance that a level sitting exactly on its threshold is ever declared decided, over every look it
gets, is at most `α` (two-sided, 5%) whatever the level's spread against its A/A level's: the
boundaries spend less (`Design.spent_alpha`, 2.2%), since the sd a level is judged with borrows the
A/A level's (below). A level is judged on the seeds of the last look it reached (`Design.judged_seeds`):
seeds run towards the next look wait for it. The rounds of more seeds (`mismatch.sweep.decide`) go from one
look to the next; they never choose a seed count from the data. A level can reach a look past the one its
interval first cleared a threshold at (runs another study file shares, or a round planned before its A/A
level gained seeds); judging it there keeps the error bound: a level on its threshold is declared decided at
whatever look only if its interval clears the threshold at some look, and that chance — over every look up
to the cap, with the first crossing the stopping time — is what `simulate` measures and the tests bound.

* Boundaries: computed on the z scale by numerical integration of the sequential test statistic's
  density over the continuation region (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000,
  ch. 19), one look at a time, so that the probability of crossing at look k under the null is the
  spending function's increment.
* Unknown variance: each z boundary is carried to Student's t with the sd's degrees of freedom at the
  same nominal tail probability (Jennison & Turnbull's approximation, §11.4); its realised error is
  measured by simulation (`simulate`) and tested.
* The sd a level is judged with (`pooled_sd`): the pair's A/A level (the noise floor, measured with
  many seeds) is a floor — a level no more variable than it is judged with the sd pooled with it (a
  3-seed verdict then rests on ~11 degrees of freedom, not 2), a more variable one with its own.

Torch-free: numpy and scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

SPENDING = ("pocock", "obrien-fleming")
GRID = 801  # points of the integration grid per look (Simpson's rule): boundaries to ~1e-6


def spent(t: float, alpha: float, spending: str) -> float:
    """α spent by information fraction `t` ∈ [0, 1] under the Lan–DeMets spending function `spending`:
    Pocock-type `α·ln(1 + (e − 1)t)` or O'Brien–Fleming-type `2 − 2Φ(z_{1−α/2} / √t)`."""
    if t <= 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * min(t, 1.0))
    if spending == "obrien-fleming":
        return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(min(t, 1.0))))
    raise ValueError(f"unknown spending function {spending!r}; valid: {', '.join(SPENDING)}")


def _simpson(a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(a, b, GRID)
    w = np.ones(GRID)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return x, w * (b - a) / (3 * (GRID - 1))


@lru_cache(maxsize=64)
def z_boundaries(looks: tuple[int, ...], alpha: float, spending: str) -> tuple[float, ...]:
    """Two-sided z boundaries `c_1 … c_K` at the looks (seed counts, increasing): under the null (a true
    mean on the threshold, known variance) the chance of first crossing `|Z_k| ≥ c_k` at look k is
    `spent(t_k) − spent(t_{k−1})`, t_k = looks[k] / looks[-1]."""
    if not looks or any(b <= a for a, b in zip(looks, looks[1:])) or looks[0] < 1:
        raise ValueError(f"looks must be increasing seed counts ≥ 1, got {looks}")
    n_K = looks[-1]
    out: list[float] = []
    z = w = density = None  # the sub-density of Z at the previous look on its continuation region
    for k, n in enumerate(looks):
        target = spent(n / n_K, alpha, spending) - spent(looks[k - 1] / n_K if k else 0.0, alpha, spending)
        if k == 0:
            c = float(stats.norm.ppf(1 - target / 2))
            z, w = _simpson(-c, c)
            density = stats.norm.pdf(z)
        else:
            n_prev, step = looks[k - 1], n - looks[k - 1]
            shift, scale = z * math.sqrt(n_prev), math.sqrt(step)

            def crossing(c: float) -> float:  # P(continue to k−1, then |Z_k| ≥ c)
                upper = stats.norm.sf((c * math.sqrt(n) - shift) / scale)
                lower = stats.norm.cdf((-c * math.sqrt(n) - shift) / scale)
                return float(np.sum(w * density * (upper + lower)))

            c = float(optimize.brentq(lambda c: crossing(c) - target, 0.5, 12.0, xtol=1e-10))
            z_new, w_new = _simpson(-c, c)
            kernel = stats.norm.pdf((z_new[:, None] * math.sqrt(n) - shift[None, :]) / scale) * math.sqrt(n) / scale
            density = kernel @ (w * density)
            z, w = z_new, w_new
        out.append(c)
    return tuple(out)


@dataclass(frozen=True)
class Design:
    """The pre-registered sequential design of the study's levels.

    Attributes:
        looks: seed counts at which a level is judged (a round of more seeds goes to the next one);
            a block's `max_seeds` stops it earlier (fewer looks than designed: less α spent, never more).
        alpha: the two-sided error at a threshold the design allows over all its looks, whatever a level's
            spread against its A/A level's (what the reports claim; tested by simulation).
        spent_alpha: the α its boundaries spend (`z_boundaries`), below `alpha`: a level's sd borrows
            its A/A level's (`pooled_sd`), and a level more variable than its A/A level is then judged with
            too small an sd whenever its few seeds happen to agree. Spending 5% erred up to 8.1% (the KL
            ratio judged alone, a level 2.5× as variable as an A/A level of 16 seeds; 3.2–3.6% at equal
            spreads); spending 2.2% keeps every case simulated — spread ratios 1–4, A/A levels of 3–16
            seeds, either threshold, the KL ratio judged alone — at ≤ 5% (experiments/design_error), and
            costs 1.2–1.8% at equal spreads: the price of borrowing the A/A level's degrees of freedom.
        spending: the Lan–DeMets spending function (`SPENDING`).
    """

    looks: tuple[int, ...] = (3, 6, 10, 16)
    alpha: float = 0.05
    spent_alpha: float = 0.022
    spending: str = "pocock"

    def __post_init__(self) -> None:
        if not 0 < self.spent_alpha <= self.alpha < 1:
            raise ValueError(f"need 0 < spent_alpha ≤ alpha < 1, got spent_alpha {self.spent_alpha}, alpha {self.alpha}")
        z_boundaries(self.looks, self.spent_alpha, self.spending)  # bad looks or spending: one line, now

    def look(self, seeds: int) -> int:
        """The look a level with `seeds` seeds is judged at: how many of `looks` it has reached (0: none)."""
        return sum(1 for n in self.looks if n <= seeds)

    def judged_seeds(self, seeds: int) -> int:
        """How many of a level's `seeds` (its lowest seed numbers) it is judged on: the last look reached —
        seeds run beyond it (a look partly run) wait for their look, which is the only place the design
        spends α — or all of them before the first look (then no interval: uncertain)."""
        k = self.look(seeds)
        return self.looks[k - 1] if k else seeds

    def next_look(self, seeds: int) -> int | None:
        """The seed count of the next look after `seeds` (None past the last)."""
        return next((n for n in self.looks if n > seeds), None)

    def critical(self, look: int, df: float) -> float:
        """The critical value at `look` (1-based) for an sd with `df` degrees of freedom: the z boundary
        carried to Student's t at the same tail probability (NaN before the first look or with df < 1)."""
        if look < 1 or not df >= 1:
            return math.nan
        return _t_critical(self.looks, self.spent_alpha, self.spending, min(look, len(self.looks)), float(df))

    def half_width(self, sd: float, seeds: int, df: float) -> float:
        """Half-width `c_k · sd / √n` of the repeated confidence interval of a mean over `seeds` seeds."""
        return self.critical(self.look(seeds), df) * sd / math.sqrt(seeds) if seeds >= 1 else math.nan

    def describe(self) -> str:
        """One line: looks, spending, α and the z boundaries."""
        z = ", ".join(f"{c:.3f}" for c in z_boundaries(self.looks, self.spent_alpha, self.spending))
        return (f"looks at {', '.join(map(str, self.looks))} seeds, {self.spending} α-spending (Lan–DeMets) of "
                f"{self.spent_alpha:g} for a two-sided error of at most {self.alpha:g} at a threshold; z boundaries {z}")


# A level this many times as variable as its A/A level: near where the design's error at a threshold peaks
# (the A/A floor under its sd then most often too small; experiments/design_error) — the reports simulate it.
WORST_SPREAD_RATIO = 2.5


@lru_cache(maxsize=4096)
def _t_critical(looks: tuple[int, ...], alpha: float, spending: str, look: int, df: float) -> float:
    c = z_boundaries(looks, alpha, spending)[look - 1]
    return float(stats.t.isf(stats.norm.sf(c), df))


DEFAULT_DESIGN = Design()


@dataclass(frozen=True)
class Spread:
    """The sd a level's interval uses: `sd` with `df` degrees of freedom, and how it was obtained."""

    sd: float
    df: float
    basis: str  # "own", "pooled with A/A", "own (above A/A's)"


def pooled_sd(values: np.ndarray | list[float], reference: np.ndarray | list[float] | None) -> Spread:
    """The sd to judge a level's mean with: the pair's A/A level (`reference`, its per-seed values of the
    same statistic) sets a floor. When the level's own sd is at most the sd pooled with A/A's, the
    pooled one is used, with both levels' degrees of freedom; when the level is more variable, its own
    sd with its own degrees of freedom.

    Why a floor and not a pretest: the A/A level (clean against clean, only the rollout samples
    changed) is the least variable comparison a level can be; a level whose few seeds happen to agree
    closely is not evidence of a smaller spread (the selection the old look-until-decided rule made:
    sort-gpt2 noise:0.3 at 0.57 points against A/A's 1.50). With a one-sided F pretest instead (pool
    unless the level is significantly more variable), the simulated error at a threshold was 10.5%
    for a level 1.5× as variable as A/A (the F-test cannot see that at 3 seeds). The floor errs too
    when the level is more variable than A/A (up to 8.1% with boundaries spending 5%): the design's
    boundaries spend `Design.spent_alpha` so that its error stays ≤ 5% at any spread ratio
    (`simulate`; tests/sweep/test_decide.py, experiments/design_error).
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return Spread(math.nan, math.nan, "own")
    own, df = float(np.std(x, ddof=1)), len(x) - 1
    ref = None if reference is None else np.asarray(reference, dtype=float)
    ref = None if ref is None else ref[np.isfinite(ref)]
    if ref is None or len(ref) < 2:
        return Spread(own, df, "own")
    ref_df = len(ref) - 1
    pooled = math.sqrt((df * own ** 2 + ref_df * float(np.var(ref, ddof=1))) / (df + ref_df))
    if own <= pooled:
        return Spread(pooled, df + ref_df, "pooled with A/A")
    return Spread(own, df, "own (above A/A's)")


def next_seeds(seeds: int, verdict: str, cap: int, design: Design = DEFAULT_DESIGN) -> int | None:
    """The planner: the seeds an `uncertain` level gets in the next round — the design's next look after
    `seeds`, if it is within `cap` — and None for a decided level or one at its last look. It reads
    nothing of the data but the verdict (`mismatch.sweep.decide.next_round` calls it; `simulate` tests it)."""
    if verdict != "uncertain":
        return None
    nxt = design.next_look(seeds)
    return nxt if nxt is not None and nxt <= cap else None


# ---------------------------------------------------------------- the design's error, by simulation


@dataclass(frozen=True)
class Simulated:
    """What `simulate` measured: levels simulated, the share declared tolerated / not tolerated, the
    realised two-sided error (decided at all, for a level on a threshold) with its Monte-Carlo
    standard error, and the mean seeds used."""

    levels: int
    tolerated: float
    not_tolerated: float
    decided: float
    decided_se: float
    mean_seeds: float


def simulate(judge, plan, *, true_acc: float, true_kl: float, acc_sd: float, kl_sd: float, corr: float,
             reference_seeds: int, cap: int, levels: int = 20_000, seed: int = 0,
             sd_scale: float = 1.0) -> Simulated:
    """Simulate `levels` levels with normal per-seed (Δ accuracy, KL ratio) of the given means, sds and
    correlation, each with its own A/A reference of `reference_seeds` seeds (sds `acc_sd`, `kl_sd`; a
    level's own sds are `sd_scale` × those), judged by `judge` and given seeds by `plan` — the study's
    own rule and planner (`mismatch.analysis.tolerance.judge_level`, `next_seeds`),
    called exactly as the analysis calls them.

    `judge(acc_values, kl_values, acc_reference, kl_reference) -> verdict word`;
    `plan(seeds, verdict, cap) -> seeds at the next look or None`.
    """
    rng = np.random.default_rng(seed)
    cov = np.array([[acc_sd ** 2, corr * acc_sd * kl_sd], [corr * acc_sd * kl_sd, kl_sd ** 2]])
    outcome = {"tolerated": 0, "not tolerated": 0}
    seeds_used = 0
    for _ in range(levels):
        reference = rng.multivariate_normal([0.0, 1.0], cov, size=reference_seeds)
        draws = rng.multivariate_normal([true_acc, true_kl], cov * sd_scale ** 2, size=cap)
        n, verdict = min(3, cap), "uncertain"
        while n is not None:
            verdict = judge(draws[:n, 0], draws[:n, 1], reference[:, 0], reference[:, 1])
            if verdict != "uncertain":
                break
            nxt = plan(n, verdict, cap)
            if nxt is None:
                break
            n = nxt
        seeds_used += n
        if verdict in outcome:
            outcome[verdict] += 1
    decided = (outcome["tolerated"] + outcome["not tolerated"]) / levels
    return Simulated(levels, outcome["tolerated"] / levels, outcome["not tolerated"] / levels, decided,
                     math.sqrt(decided * (1 - decided) / levels), seeds_used / levels)
