"""The sequential design: its boundaries against Monte Carlo and closed forms, its looks, the pooling rule."""

import math
import statistics

import numpy as np
import pytest

from mismatch.analysis.sequential import DEFAULT_DESIGN, Design, pooled_sd, spent, z_boundaries


@pytest.mark.parametrize("spending", ["pocock", "obrien-fleming"])
def test_the_boundaries_spend_alpha_look_by_look(spending):
    """400,000 sequences of unit-variance increments (known variance: the boundaries' own model): the share
    first crossing |Z_k| ≥ c_k at look k is the spending function's increment there, each within 4 Monte-
    Carlo standard errors, and the share ever crossing is α."""
    looks = (3, 6, 10, 16)
    c = np.array(z_boundaries(looks, 0.05, spending))
    rng = np.random.default_rng(0)
    sums = np.cumsum(rng.standard_normal((400_000, looks[-1])), axis=1)
    z = np.stack([sums[:, n - 1] / math.sqrt(n) for n in looks], axis=1)
    crossed = np.abs(z) >= c
    first = np.where(crossed.any(1), crossed.argmax(1), -1)
    for k, n in enumerate(looks):
        want = spent(n / 16, 0.05, spending) - (spent(looks[k - 1] / 16, 0.05, spending) if k else 0.0)
        got = float((first == k).mean())
        assert abs(got - want) < 4 * math.sqrt(want / 400_000), (k, got, want)
    assert float((first >= 0).mean()) == pytest.approx(0.05, abs=4 * math.sqrt(0.05 / 400_000))


def test_the_first_boundary_has_a_closed_form_and_the_spending_functions_theirs():
    assert z_boundaries((3, 6, 10, 16), 0.05, "pocock")[0] == pytest.approx(
        statistics.NormalDist().inv_cdf(1 - 0.05 * math.log(1 + (math.e - 1) * 3 / 16) / 2), abs=1e-9)
    assert spent(1.0, 0.05, "pocock") == pytest.approx(0.05) and spent(1.0, 0.05, "obrien-fleming") == pytest.approx(0.05)
    assert spent(0.0, 0.05, "pocock") == 0.0
    # one look: the fixed design, z_{0.975}
    assert z_boundaries((5,), 0.05, "pocock")[0] == pytest.approx(statistics.NormalDist().inv_cdf(0.975), abs=1e-9)
    # O'Brien–Fleming spends little early: a far higher first boundary than Pocock's, a lower last one
    pocock, obf = z_boundaries((1, 2, 3, 4), 0.05, "pocock"), z_boundaries((1, 2, 3, 4), 0.05, "obrien-fleming")
    assert obf[0] > pocock[0] + 1 and obf[-1] < pocock[-1]


def test_looks_and_critical_values():
    d = DEFAULT_DESIGN
    assert d.looks == (3, 6, 10, 16) and d.alpha == 0.05 and d.spending == "pocock"
    assert [d.look(n) for n in (1, 2, 3, 5, 6, 10, 16, 30)] == [0, 0, 1, 1, 2, 3, 4, 4]
    assert [d.next_look(n) for n in (0, 3, 9, 16)] == [3, 6, 10, None]
    assert math.isnan(d.critical(0, 5)) and math.isnan(d.half_width(1.0, 2, 1))
    z = z_boundaries(d.looks, d.spent_alpha, d.spending)  # the boundaries spend less than the α it allows
    assert d.spent_alpha < d.alpha and d.critical(1, 10_000) > z_boundaries(d.looks, d.alpha, d.spending)[0]
    assert d.critical(2, 10_000) == pytest.approx(z[1], rel=1e-3)  # t → z as df grows
    assert d.critical(1, 2) > d.critical(1, 11) > z[0]  # fewer degrees of freedom, a wider interval
    assert d.half_width(2.0, 4, 3) == pytest.approx(d.critical(1, 3) * 2.0 / 2)
    assert "3, 6, 10, 16" in d.describe() and "pocock" in d.describe()
    # a level is judged on the seeds of the last look it reached: a look partly run waits for its seeds
    assert [d.judged_seeds(n) for n in (1, 2, 3, 5, 6, 8, 10, 15, 16, 20)] == [1, 2, 3, 3, 6, 6, 10, 10, 16, 16]


@pytest.mark.parametrize("bad", [dict(looks=()), dict(looks=(3, 3)), dict(looks=(6, 3)), dict(alpha=0.0),
                                 dict(spent_alpha=0.06), dict(spent_alpha=0.0), dict(spending="linear")])
def test_a_bad_design_fails_in_one_line(bad):
    with pytest.raises(ValueError) as info:
        Design(**bad)
    assert "\n" not in str(info.value)


def test_the_aa_level_is_a_floor_under_a_levels_sd():
    ref = [0.5, -1.0, 1.2, -0.3, 0.0, 0.8, -1.5, 0.4, 1.0, -0.6]
    tight = [0.1, 0.0, -0.1]  # seeds that happen to agree: judged with the pooled, larger sd
    pooled = math.sqrt((2 * statistics.variance(tight) + 9 * statistics.variance(ref)) / 11)
    got = pooled_sd(tight, ref)
    assert (got.sd, got.df, got.basis) == (pytest.approx(pooled), 11, "pooled with A/A")
    wide = [3.0, -3.0, 0.5]  # a more variable level: its own sd and degrees of freedom
    got = pooled_sd(wide, ref)
    assert (got.sd, got.df, got.basis) == (pytest.approx(statistics.stdev(wide)), 2, "own (above A/A's)")
    assert pooled_sd(tight, None).basis == "own" and pooled_sd(tight, [1.0]).df == 2
    assert math.isnan(pooled_sd([1.0], ref).sd)
    assert pooled_sd([0.1, float("nan"), -0.1], None).df == 1  # NaN seeds are not observations
