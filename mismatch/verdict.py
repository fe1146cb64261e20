"""The one verdict rule: a 95% interval against a limit gives pass, fail or uncertain.

Tolerance (is a mismatch level tolerated by OPD?), the admission check (is a rollout configuration
admitted?) and the reports all judge the same way, and only their words differ:

| `Verdict` | tolerance (`TOLERANCE_WORDS`) | admission check (`ADMISSION_WORDS`) |
|---|---|---|
| `PASS` | tolerated | admit |
| `UNCERTAIN` | uncertain | uncertain |
| `FAIL` | not tolerated | reject |

`interval_verdict(low, high, limit)`: PASS when the whole interval lies on the allowed side of the
limit (at or below it for an upper limit, at or above for a lower one), FAIL when it lies wholly on the
other side, UNCERTAIN when it straddles the limit or anything is NaN (no interval: nothing decided).
`combine(verdicts)`: any FAIL → FAIL; all PASS → PASS; else (or nothing judged) UNCERTAIN.

`Tolerance` is the pair of thresholds OPD's verdicts use (Δ held-out accuracy ≥ −acc_tol, final
held-out KL ratio ≤ 1 + kl_tol), passed around as one value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """Three-valued outcome of an interval against a limit."""

    PASS = "pass"
    UNCERTAIN = "uncertain"
    FAIL = "fail"

    def word(self, words: dict[Verdict, str]) -> str:
        """This verdict in a vocabulary (`TOLERANCE_WORDS`, `ADMISSION_WORDS`)."""
        return words[self]


TOLERANCE_WORDS = {Verdict.PASS: "tolerated", Verdict.UNCERTAIN: "uncertain", Verdict.FAIL: "not tolerated"}
ADMISSION_WORDS = {Verdict.PASS: "admit", Verdict.UNCERTAIN: "uncertain", Verdict.FAIL: "reject"}


def from_word(word: str) -> Verdict:
    """The verdict a word of either vocabulary names (`tolerated`, `reject`, …).

    Raises:
        ValueError: not a word of either vocabulary.
    """
    for words in (TOLERANCE_WORDS, ADMISSION_WORDS):
        for verdict, w in words.items():
            if w == word:
                return verdict
    raise ValueError(f"not a verdict word: {word!r}")


def interval_verdict(low: float, high: float, limit: float, *, upper: bool = True) -> Verdict:
    """The verdict of the interval `[low, high]` against `limit`.

    Args:
        low, high: the interval's ends (a point value: `low == high`).
        limit: the threshold, in the same units.
        upper: the value must stay at or below `limit` (else at or above it).
    """
    if any(math.isnan(x) for x in (low, high, limit)):
        return Verdict.UNCERTAIN
    inside, beyond = (high <= limit, low > limit) if upper else (low >= limit, high < limit)
    return Verdict.PASS if inside else Verdict.FAIL if beyond else Verdict.UNCERTAIN


def mean_interval_verdict(mean: float, half: float, limit: float, *, upper: bool = True) -> Verdict:
    """`interval_verdict` of `mean ± half` (a NaN half-width, e.g. one seed: no interval → UNCERTAIN)."""
    return interval_verdict(mean - half, mean + half, limit, upper=upper)


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """Any FAIL → FAIL; all PASS → PASS; otherwise, or with nothing judged, UNCERTAIN."""
    verdicts = list(verdicts)
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.PASS if verdicts and all(v is Verdict.PASS for v in verdicts) else Verdict.UNCERTAIN


@dataclass(frozen=True)
class Tolerance:
    """OPD's thresholds for "tolerated": Δ final held-out accuracy ≥ −`acc_tol` (a fraction: 0.02 is
    two points) and final held-out KL ratio to the clean twin ≤ 1 + `kl_tol`."""

    acc_tol: float = 0.02
    kl_tol: float = 0.10

    def __post_init__(self) -> None:
        if not (self.acc_tol >= 0 and self.kl_tol >= 0):
            raise ValueError(f"tolerances must be ≥ 0, got acc_tol {self.acc_tol}, kl_tol {self.kl_tol}")

    def judge(self, kl: float, kl_hw: float, acc: float = math.nan, acc_hw: float = math.nan) -> Verdict:
        """The verdict of a level: its KL ratio interval against 1 + kl_tol, combined with its Δ accuracy
        interval against −acc_tol when the level has an accuracy (NaN `acc`: the KL ratio alone)."""
        verdicts = [mean_interval_verdict(kl, kl_hw, 1 + self.kl_tol, upper=True)]
        if not math.isnan(acc):
            verdicts.append(mean_interval_verdict(acc, acc_hw, -self.acc_tol, upper=False))
        return combine(verdicts)

    def kept_up(self, kl: float, acc: float = math.nan) -> bool:
        """Whether the *means* lie within the thresholds (no accuracy counts as within)."""
        return bool((math.isnan(acc) or acc >= -self.acc_tol) and kl <= 1 + self.kl_tol)


DEFAULT_TOLERANCE = Tolerance()


# ---------------------------------------------------------------- a run's rows

DIVERGED_FACTOR = 1.5  # a run whose final held-out KL exceeds 1.5 × its step-0 value has diverged


def final_value(rows: list[dict], metric: str, *, at_most: float = math.inf) -> float:
    """The metric's value at the last step (≤ `at_most`) that recorded it (NaN if none did)."""
    values = [(r["step"], r["value"]) for r in rows if r["metric"] == metric and r["step"] <= at_most]
    return max(values)[1] if values else math.nan


def diverged(rows: list[dict]) -> bool:
    """Whether the run's last held-out reverse KL is above `DIVERGED_FACTOR` × its step-0 one (it got
    worse than where it started, by far: the student collapsed); False without both evaluations."""
    start = [r["value"] for r in rows if r["metric"] == "heldout_rkl" and r["step"] == 0]
    end = final_value(rows, "heldout_rkl")
    return bool(start) and end == end and end > DIVERGED_FACTOR * start[0]
