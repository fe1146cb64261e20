"""The length law: ladder brackets read as the tolerance table reads a ladder, and the exponents the
brackets allow checked against a brute-force scan of exponents (an independent computation)."""

import math

import numpy as np
import pandas as pd
import pytest

from mismatch.analysis.length import brackets, length_law


def _scan(table: pd.DataFrame, grid: np.ndarray) -> np.ndarray:
    """Exponents b on `grid` for which some c puts c·T^b inside every bracket: the intervals
    [log low − b log T, log high − b log T] of log c must intersect."""
    t = np.log(table["response_tokens"].to_numpy(float))
    lo, hi = np.log(table["low"].to_numpy(float)), np.log(table["high"].to_numpy(float))
    ok = [(lo - b * t).max() <= (hi - b * t).min() for b in grid]
    return grid[np.array(ok)]


def test_brackets_read_the_ladder():
    levels = pd.DataFrame({"pair": ["p"] * 5, "mismatch_kl": [0.01, 0.05, 0.1, 0.2, 0.4],
                           "verdict": ["tolerated", "tolerated", "uncertain", "tolerated", "not tolerated"],
                           "response_tokens": [10.0] * 5})
    row = brackets(levels, by=["pair"]).iloc[0]
    # the ladder stops at the first level not tolerated: 0.2 (tolerated above an undecided 0.1) does not raise it
    assert row["low"] == 0.05 and row["high"] == 0.4 and row["undecided"] == 2 - 1 and row["levels"] == 5
    none_bad = brackets(levels.assign(verdict="tolerated"), by=["pair"]).iloc[0]
    assert none_bad["low"] == 0.4 and math.isinf(none_bad["high"])
    first_bad = brackets(levels.assign(verdict="not tolerated"), by=["pair"]).iloc[0]
    assert first_bad["low"] == 0.0 and first_bad["high"] == 0.01


@pytest.mark.parametrize("true_b", [0.0, -0.5, -1.0])
def test_the_allowed_exponents_match_a_scan(true_b):
    lengths = np.array([12.0, 50.0, 200.0])
    limit = 0.2 * lengths ** true_b
    rng = np.random.default_rng(int(-10 * true_b))
    table = pd.DataFrame({"response_tokens": lengths, "low": limit / rng.uniform(1.1, 1.6, 3),
                          "high": limit * rng.uniform(1.1, 1.6, 3)})
    law = length_law(table)
    grid = np.linspace(-3, 2, 50001)
    allowed = _scan(table, grid)
    step = grid[1] - grid[0]
    assert law.consistent and law.b_low <= true_b <= law.b_high
    assert law.b_low == pytest.approx(allowed.min(), abs=2 * step) and law.b_high == pytest.approx(allowed.max(), abs=2 * step)
    assert law.b_low <= law.b_mid <= law.b_high
    named = {0.0: "per token (b = 0)", -0.5: "b = −½", -1.0: "per sequence (b = −1)"}
    assert law.hypotheses[named[true_b]]
    for b, name in named.items():  # each hypothesis is allowed exactly when the scan allows it
        assert law.hypotheses[name] == bool(((allowed > b - 2 * step) & (allowed < b + 2 * step)).any())


def test_brackets_no_power_law_fits_and_open_brackets():
    crossing = pd.DataFrame({"response_tokens": [10.0, 100.0, 1000.0], "low": [0.1, 0.001, 0.1], "high": [0.2, 0.002, 0.2]})
    law = length_law(crossing)
    assert not law.consistent and "no power law" in law.describe() and not any(law.hypotheses.values())
    open_top = pd.DataFrame({"response_tokens": [10.0, 100.0], "low": [0.1, 0.05], "high": [math.inf, math.inf]})
    law = length_law(open_top)  # only lower bounds: c can grow without end, so every exponent is allowed
    assert law.consistent and law.b_low == -math.inf and law.b_high == math.inf and all(law.hypotheses.values())
    assert not law.informative and "+∞" not in law.describe().split("(")[1]  # no closed bracket: no midpoint, not +∞
    one_closed = open_top.assign(high=[0.2, math.inf])  # a ceiling at T = 10 and a floor at 100: b ≥ log(0.05/0.2)/log 10
    law = length_law(one_closed)
    assert law.b_low == pytest.approx(math.log(0.05 / 0.2) / math.log(10)) and law.b_high == math.inf
    assert law.informative
