"""The one verdict rule: intervals against limits, combined; the tolerance and the check speak it in their words."""

import math

import pytest

from mismatch.admission.decision import Decision, decide, overall
from mismatch.admission.gates import Gate
from mismatch.verdict import (ADMISSION_WORDS, TOLERANCE_WORDS, Tolerance, Verdict, combine, from_word,
                              interval_verdict, mean_interval_verdict)

P, U, F = Verdict.PASS, Verdict.UNCERTAIN, Verdict.FAIL


@pytest.mark.parametrize("low, high, limit, upper, want", [
    (0.9, 1.1, 1.1, True, P),  # top exactly at an upper limit: kept
    (1.1 + 1e-12, 1.3, 1.1, True, F),  # bottom just above it
    (1.1, 1.3, 1.1, True, U),  # bottom exactly at it: straddles
    (-0.02, 0.0, -0.02, False, P),  # bottom exactly at a lower limit: kept
    (-0.04, -0.02 - 1e-12, -0.02, False, F),
    (-0.04, -0.02, -0.02, False, U),
    (math.nan, 1.0, 1.1, True, U), (0.0, 1.0, math.nan, True, U),  # nothing to judge: never a verdict
])
def test_interval_verdict_edges(low, high, limit, upper, want):
    assert interval_verdict(low, high, limit, upper=upper) is want


def test_a_mean_without_a_half_width_is_uncertain():
    assert mean_interval_verdict(0.0, math.nan, 1.0) is U and mean_interval_verdict(0.0, 0.5, 1.0) is P


def test_combine_and_the_two_vocabularies():
    assert combine([P, P]) is P and combine([P, U]) is U and combine([U, F, P]) is F and combine([]) is U
    for words in (TOLERANCE_WORDS, ADMISSION_WORDS):
        assert [from_word(v.word(words)) for v in Verdict] == list(Verdict)
    with pytest.raises(ValueError):
        from_word("maybe")


@pytest.mark.parametrize("kl, kl_hw, acc, acc_hw, want", [
    (1.05, 0.04, -0.01, 0.005, P), (1.05, 0.06, -0.01, 0.005, U), (1.2, 0.05, 0.0, 0.01, F),
    (1.0, 0.01, -0.05, 0.01, F), (1.0, 0.01, math.nan, math.nan, P),  # no accuracy: the KL ratio alone
    (1.0, math.nan, 0.0, 0.01, U),  # one seed: no interval
])
def test_tolerance_judges_a_level_by_both_intervals(kl, kl_hw, acc, acc_hw, want):
    tol = Tolerance(acc_tol=0.02, kl_tol=0.10)
    assert tol.judge(kl, kl_hw, acc, acc_hw) is want
    # the same as judging each interval by hand and combining (an independent spelling of the rule)
    by_hand = [P if kl + kl_hw <= 1.1 else F if kl - kl_hw > 1.1 else U]
    if not math.isnan(acc):
        by_hand.append(P if acc - acc_hw >= -0.02 else F if acc + acc_hw < -0.02 else U)
    if any(math.isnan(x) for x in (kl, kl_hw)):
        by_hand = [U]
    assert combine(by_hand) is want
    assert tol.kept_up(kl, acc) == ((math.isnan(acc) or acc >= -0.02) and kl <= 1.1)


def test_the_check_and_the_gates_use_the_same_rule():
    for low, high, limit in [(0.1, 0.2, 0.2), (0.21, 0.3, 0.2), (0.1, 0.3, 0.2), (math.nan, math.nan, 0.2)]:
        assert decide((low + high) / 2, low, high, limit) is interval_verdict(low, high, limit)
    assert decide(math.nan, 0.0, 0.1, 0.2) is Verdict.UNCERTAIN

    def decisions(*verdicts):
        return [Decision("m", 0.0, 0.0, 0.0, 1.0, "test", v) for v in verdicts]

    assert overall(decisions(Verdict.PASS, Verdict.UNCERTAIN)) == "uncertain" and overall([]) == "uncertain"
    assert overall(decisions(Verdict.PASS, Verdict.FAIL, Verdict.UNCERTAIN)) == "reject"
    assert overall(decisions(Verdict.PASS)) == "admit"
    assert [d.status for d in decisions(*Verdict)] == [ADMISSION_WORDS[v] for v in Verdict]  # the check's words
    assert decisions(Verdict.FAIL)[0].to_dict()["status"] == "reject"
    gate = Gate("m", 0.1, "test")
    assert gate.passes(0.1) and not gate.passes(0.1 + 1e-12) and not gate.passes(math.nan)


def test_tolerances_are_not_negative():
    with pytest.raises(ValueError, match="≥ 0"):
        Tolerance(acc_tol=-0.01)
