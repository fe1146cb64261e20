"""Threshold fitting: the split against brute force, and a whole fit on a hand-made study."""

import dataclasses
import json
import math
import random

import numpy as np
import pandas as pd
import pytest

from mismatch.admission.limits import bracket, fit_limit, held_out_predictions
from mismatch.admission.thresholds import Thresholds, thresholds_from_rows, validate
from mismatch.analysis.length import length_tables
from mismatch.analysis.tolerance import analyse
from mismatch.opd.config import OPDConfig
from tests.conftest import opd_rows



def _balanced(x, y, t):
    admit = [xi <= t for xi in x]
    tol = [a for a, yi in zip(admit, y) if yi]
    bad = [not a for a, yi in zip(admit, y) if not yi]
    return 0.5 * (sum(tol) / len(tol) + sum(bad) / len(bad))


@pytest.mark.parametrize("seed", range(6))
def test_fit_limit_reaches_the_best_balanced_accuracy_with_the_widest_gap(seed):
    rng = random.Random(seed)
    x = [math.exp(rng.uniform(-8, 1)) for _ in range(12)]
    y = [xi < 0.05 or rng.random() < 0.2 for xi in x]
    y[0], y[1] = True, False
    limit = fit_limit(np.array(x), np.array(y))
    values = sorted(set(x))
    splits = list(zip(values[:-1], values[1:]))
    best = max(_balanced(x, y, lo) for lo, _ in splits)
    assert _balanced(x, y, limit) == pytest.approx(best)
    gaps = [math.log(hi / lo) for lo, hi in splits if _balanced(x, y, lo) == pytest.approx(best)]
    lo, hi = next((lo, hi) for lo, hi in splits if lo < limit < hi)
    assert math.log(hi / lo) == pytest.approx(max(gaps)) and limit == pytest.approx(math.sqrt(lo * hi))


def test_fit_limit_without_a_failure_is_the_largest_tolerated_value():
    assert fit_limit(np.array([0.1, 0.3, np.nan]), np.array([True, True, False])) == 0.3


def test_fit_limit_at_its_edges():
    T, F = True, False
    # nothing tolerated: the limit admits nothing, also when values are ≤ 0 (the k1 estimate can be < 0)
    for x in ([0.2, 0.5], [-0.01, 0.5], [0.0, 0.5]):
        assert fit_limit(np.array(x), np.array([F, F])) < min(x)
    # no split beats admitting everything (the data run the other way): the largest tolerated value
    assert fit_limit(np.array([0.01, 0.1]), np.array([F, T])) == 0.1
    # a split through 0 has no log gap: it loses a tie to a split between positive values
    assert fit_limit(np.array([-1e-5, 0.01, 0.2, 1.0]), np.array([T, F, T, F])) == pytest.approx(math.sqrt(0.2))
    # only a split through 0 separates: the arithmetic midpoint
    assert fit_limit(np.array([-0.003, -0.001, 0.5]), np.array([T, F, F])) == pytest.approx(-0.002)
    assert bracket(np.array([0.1, 0.3, 2.0]), np.array([True, True, False]), 0.5) == [0.3, 2.0]


# first-step mismatch_kl of each level, and whether its runs keep up with clean (Δ accuracy in points)
STUDY = {"sort-gpt2": {"fp8-e4m3": (0.001, 0.0), "int4:group128": (0.03, -0.5), "noise:1.0": (1.3, -12.0)},
         "reverse-qwen3": {"fp8-e4m3": (0.004, 0.3), "int4:group128": (0.15, -0.5), "noise:3.0": (2.0, -20.0)},
         # int8 here: mean −1.8 points is within −2, but its interval (3 seeds, ±1.0) straddles −2: undecided
         "copy-x": {"int4:group128": (0.8, -9.0), "fp8-e4m3": (0.01, 0.0), "int8:channel": (0.5, -1.9)}}


def _run(config, acc, first_kl):
    return opd_rows(config, {"heldout_rkl": {0: 2.0, 2: 1.0}, "heldout_expected_accuracy": {2: acc},
                             "mismatch_kl": {1: first_kl, 2: 5 * first_kl}})


def study_rows() -> pd.DataFrame:
    """The rows of a small study: three pairs' levels with their clean twins, three seeds (`STUDY`)."""
    frames = []
    for pair, levels in STUDY.items():
        base = OPDConfig(pair=pair, steps=2, batch_size=4)
        for seed in range(3):  # the design's first look; the offsets average to +0.1 points and ×1.05
            frames.append(_run(dataclasses.replace(base, seed=seed), 0.5, 0.0))
            for rollout, (kl, delta) in levels.items():
                frames.append(_run(dataclasses.replace(base, rollout=rollout, seed=seed),
                                   0.5 + (delta + 0.2 * seed - 0.1) / 100, kl * (1 + 0.1 * seed - 0.05)))
            frames.append(_run(dataclasses.replace(base, rollout="stale:2", seed=seed), 0.40, 0.0))
    return pd.concat(frames, ignore_index=True)


@pytest.fixture
def study():
    return study_rows()


def test_a_fit_on_a_study_separates_its_levels_and_validates_leaving_each_pair_out(study, tmp_path):
    t = thresholds_from_rows(study, sources=["hand-made"])
    points = pd.DataFrame(t.points).set_index(["pair", "level"])
    assert points.loc[("sort-gpt2", "int4:group128"), "mismatch_kl"] == pytest.approx(0.03 * 1.05)  # mean of 3 seeds
    assert points.loc[("sort-gpt2", "int4:group128"), "run_mismatch_kl"] == pytest.approx(0.03 * 1.05 * 3)
    # the first step's value once: the level table's first_mismatch_kl (twins.first_value) is the same number
    assert "first_mismatch_kl" not in points
    levels = analyse(study).levels.set_index(["pair", "level"])
    for key, level in points[points["source"] == "format"].iterrows():
        assert levels.loc[key, "first_mismatch_kl"] == pytest.approx(level["mismatch_kl"], rel=1e-12)
    assert not points.loc[("copy-x", "int4:group128"), "tolerated"] and points.loc[("copy-x", "fp8-e4m3:channel"),
                                                                                   "tolerated"]
    # the undecided level (0.5·1.05, tolerated by its mean) is listed but places no limit: with it the
    # bracket would be [0.525, 0.84]; decided tolerated ≤ 0.15·1.05, not tolerated ≥ 0.8·1.05
    assert not points.loc[("copy-x", "int8:channel"), "decided"]
    assert points.loc[("copy-x", "int8:channel"), "verdict"] == "uncertain"
    assert t.brackets["mismatch_kl"] == pytest.approx([0.1575, 0.84])
    assert t.limits["mismatch_kl"] == pytest.approx(math.sqrt(0.1575 * 0.84))
    v = {r["held_out"]: r for r in t.validation}
    # without copy-x the split lies between 0.1575 and 1.365 (sort-gpt2's noise): copy-x's int4 (0.84) is rejected
    assert v["copy-x"]["limit"] == pytest.approx(math.sqrt(0.1575 * 1.365))
    assert (v["copy-x"]["admit_not"], v["copy-x"]["reject_not"], v["copy-x"]["accuracy"]) == (0, 1, 1.0)
    assert v["copy-x"]["always_admit_accuracy"] == 0.5
    assert v["sort-gpt2"]["accuracy"] == 1.0 and v["sort-gpt2"]["always_admit_accuracy"] == pytest.approx(2 / 3)
    assert [(r["source"], r["level"], r["verdict"]) for r in t.lagged] == [("stale", 2, "not tolerated")] * 3
    # drift: every level's step 2 is 5× its step 1, so window and end (steps 1–2) are 3× the first step;
    # the format levels at ≥ 0.01 nats (all but reverse-qwen3's fp8 at 0.0042) drift alike: margin 1
    assert t.drift["format"] == pytest.approx({"levels": 5, "median": 3.0, "largest": 3.0, "margin": 1.0})
    assert t.drift["noise"]["levels"] == 2 and "stale" not in t.drift
    back = Thresholds.from_json(t.to_json(tmp_path / "t.json"))
    assert back.limits == t.limits and back.brackets == t.brackets and len(back.points) == len(t.points)
    assert back.drift == t.drift


def test_each_limit_keeps_the_response_lengths_of_the_levels_it_rests_on(monkeypatch, tmp_path):
    """The first-step limits rest on the static levels (10 tokens a response here), the window limit on every
    decided level with a window value, the lag's too (2 tokens): `response_tokens` [10, 10],
    `window_response_tokens` [2, 10]; both survive the JSON round trip."""
    import tests.admission.test_thresholds as here

    def run(config, acc, first_kl):
        stale = config.rollout.startswith("stale")  # its window (steps 3–12 after a lag of 2) holds step 3
        kl = {1: 0.0, 2: 0.0, 3: 0.5} if stale else {1: first_kl, 2: 5 * first_kl}
        tokens = (2.0 if stale else 10.0) * config.batch_size  # the "tokens" metric: a batch's response tokens
        return opd_rows(config, {"heldout_rkl": {0: 2.0, 2: 1.0}, "heldout_expected_accuracy": {2: acc},
                                 "mismatch_kl": kl, "tokens": {s: tokens for s in kl}})

    monkeypatch.setattr(here, "_run", run)
    t = thresholds_from_rows(study_rows(), sources=["hand-made"])
    assert t.response_tokens == [10.0, 10.0] and t.window_response_tokens == [2.0, 10.0]
    back = Thresholds.from_json(t.to_json(tmp_path / "t.json"))
    assert back.response_tokens == t.response_tokens and back.window_response_tokens == t.window_response_tokens


def test_validate_on_points_counts_by_hand():
    points = pd.DataFrame({"pair": ["a", "a", "b", "b"], "s": [0.1, 1.0, 0.2, 0.5],
                           "tolerated": [True, False, True, False]})
    rows = {r["held_out"]: r for r in validate(points, "s")}
    assert rows["a"]["limit"] == pytest.approx(math.sqrt(0.2 * 0.5))  # fitted on b alone
    assert (rows["a"]["admit_tolerated"], rows["a"]["reject_not"]) == (1, 1)
    assert rows["b"]["limit"] == pytest.approx(math.sqrt(0.1 * 1.0))
    assert (rows["b"]["admit_tolerated"], rows["b"]["reject_not"], rows["b"]["admit_not"]) == (1, 1, 0)


def test_held_out_predictions_say_which_levels_their_limit_gets_right():
    """`right` is admitted == tolerated with the limit fitted on the other pair: b's 0.3 is not tolerated but
    sits under a's limit √(0.1·1.0) ≈ 0.316 (admitted: wrong); a's levels straddle b's limit √(0.2·0.3)."""
    points = pd.DataFrame({"pair": ["a", "a", "b", "b", "b"], "s": [0.1, 1.0, 0.2, 0.5, 0.3],
                           "tolerated": [True, False, True, False, False]})
    held = held_out_predictions(points, "s").set_index(["pair", "s"])
    assert held.loc[("b", 0.3), "limit"] == pytest.approx(math.sqrt(0.1 * 1.0))
    assert held.loc[("a", 0.1), "limit"] == pytest.approx(math.sqrt(0.2 * 0.3))
    assert held["right"].to_dict() == {("a", 0.1): True, ("a", 1.0): True, ("b", 0.2): True, ("b", 0.5): True,
                                       ("b", 0.3): False}
    assert list(held_out_predictions(points.iloc[:0], "s").columns)[-1] == "right"


# the sampled-token loss on two of the pairs, breaking where full-rkl keeps up: first-step mismatch_kl and Δ points
PG_STUDY = {"sort-gpt2": {"fp8-e4m3": (0.001, 0.0), "int4:group128": (0.03, -12.0)},
            "reverse-qwen3": {"fp8-e4m3": (0.004, 0.3), "int4:group128": (0.15, -12.0)}}


def test_each_loss_gets_its_own_limit_where_its_levels_lie_on_both_sides(study, tmp_path):
    """`loss_limits`: full-rkl's limit from its levels alone, pg-rkl-is's from its own (int4 breaks it at 0.0315,
    where full-rkl keeps up), each with its bracket and leave-one-pair-out record; `for_loss` falls back to the
    pooled limit for a loss without one; the report prints both beside the pooled limit's record."""
    from mismatch.report.admission import admission_markdown

    frames = [study]
    for pair, levels in PG_STUDY.items():
        base = OPDConfig(pair=pair, steps=2, batch_size=4, loss="pg-rkl-is")
        for seed in range(3):
            frames.append(_run(dataclasses.replace(base, seed=seed), 0.5, 0.0))
            for rollout, (kl, delta) in levels.items():
                frames.append(_run(dataclasses.replace(base, rollout=rollout, seed=seed),
                                   0.5 + (delta + 0.2 * seed - 0.1) / 100, kl * (1 + 0.1 * seed - 0.05)))
    t = thresholds_from_rows(pd.concat(frames, ignore_index=True), sources=["hand-made"])
    full, pg = t.loss_limits["full-rkl"], t.loss_limits["pg-rkl-is"]
    # full-rkl: the study's levels as in the pooled fit without pg-rkl-is (test above)
    assert full["bracket"] == pytest.approx([0.1575, 0.84]) and full["limit"] == pytest.approx(math.sqrt(0.1575 * 0.84))
    assert (full["levels"], full["not_tolerated"]) == (8, 3)
    # pg-rkl-is: tolerated at 0.00105 and 0.0042, not at 0.0315 and 0.1575 (means of 3 seeds, ×1.05)
    assert pg["bracket"] == pytest.approx([0.0042, 0.0315]) and pg["limit"] == pytest.approx(math.sqrt(0.0042 * 0.0315))
    # held out: sort-gpt2 by reverse's limit √(0.0042·0.1575), reverse by sort's √(0.00105·0.0315): all 4 right
    assert (pg["levels"], pg["not_tolerated"], pg["held_out_levels"], pg["held_out_right"], pg["always_admit_right"]
            ) == (4, 2, 4, 4, 2)
    # the pooled limit on the same levels: without sort-gpt2 √(0.0105·0.1575) ≈ 0.041 admits its int4 at 0.0315
    # (wrong), without reverse-qwen3 √(0.0105·0.0315) ≈ 0.018 gets both of its levels right: 3 of 4
    assert (pg["pooled_held_out_levels"], pg["pooled_held_out_right"]) == (4, 3)
    pooled = t.limits["mismatch_kl"]
    assert t.for_loss("pg-rkl-is")[:2] == (pg["limit"], pg["bracket"]) and t.for_loss("full-rkl")[0] == full["limit"]
    assert t.for_loss("pg-rkl")[0] == t.for_loss(None)[0] == pooled and "no limit of pg-rkl's own" in t.for_loss("pg-rkl")[3]
    # the window limits per loss: the window here is the mean of steps 1–2, 3 × the first step: the same splits
    wfull, wpg = t.loss_window_limits["full-rkl"], t.loss_window_limits["pg-rkl-is"]
    assert wfull["bracket"] == pytest.approx([3 * 0.1575, 3 * 0.84]) and wpg["bracket"] == pytest.approx([3 * 0.0042,
                                                                                                          3 * 0.0315])
    assert t.for_loss("pg-rkl-is", window=True)[0] == pytest.approx(math.sqrt(9 * 0.0042 * 0.0315))
    assert t.for_loss("pg-rkl", window=True)[0] == t.window_limits["mismatch_kl"]
    back = Thresholds.from_json(t.to_json(tmp_path / "t.json"))
    assert back.loss_limits == t.loss_limits and back.loss_window_limits == t.loss_window_limits
    text = admission_markdown(t)
    assert f"| pg-rkl-is | 4 | 2 | {pg['limit']:.3g} | [0.0042, 0.0315] | — | 4 of 4 | 3 of 4 | 2 | own |" in text
    assert f"| pg-rkl-is | 4 | 2 | {wpg['limit']:.3g} | [0.0126, 0.0945] |" in text
    # a loss's own limit that predicts its held-out levels worse than the pooled one is not used
    worse = dataclasses.replace(t, loss_limits={**t.loss_limits, "pg-rkl-is": {**pg, "held_out_right": 2}})
    assert worse.own_limit("pg-rkl-is") is None and worse.for_loss("pg-rkl-is")[0] == pooled
    assert "predicts 2 of its 4 held-out levels right, the pooled one 3" in worse.for_loss("pg-rkl-is")[3]
    assert f"| pg-rkl-is | 4 | 2 | {pg['limit']:.3g} | [0.0042, 0.0315] | — | 2 of 4 | 3 of 4 | 2 | pooled |" in (
        admission_markdown(worse))


def test_a_study_without_a_broken_level_fits_no_limit(study, tmp_path):
    """Every judged level tolerated: no limit can be placed (before: a 'limit' at the largest value and
    NaN brackets in a file that was not strict JSON); the report says so instead of fitted tables."""
    import json

    from mismatch.admission.thresholds import NotEnoughDataError
    from mismatch.report.admission import write_admission_report

    kept = study[~study["rollout"].isin(["noise:1.0", "noise:3.0", "int4:group128"]) | (study["pair"] != study["pair"])]
    kept = kept[~((kept["pair"] == "copy-x") & (kept["rollout"] == "int4:group128"))]
    with pytest.raises(NotEnoughDataError, match="not enough data to fit a limit: all 3 decided levels are tolerated "
                       r"\(1 undecided levels not fitted\)"):
        thresholds_from_rows(kept, sources=["hand-made"])
    written = [p.name for p in write_admission_report(kept, tmp_path, sources=["hand-made"])]
    assert written[0] == "admission.md" and "admission_points.csv" not in written  # no fitted tables
    assert "No limit fitted: not enough data" in (tmp_path / "admission.md").read_text()
    t = thresholds_from_rows(study, sources=["hand-made"])  # a full fit writes strict JSON (null, never NaN)
    json.loads(t.to_json(tmp_path / "t.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))


def _ladder_rows(ratios: dict[int, dict[float, tuple[float, float]]], loss: str = "full-rkl",
                 rkl_se: dict[tuple[int, float], float] | None = None, **config) -> list[pd.DataFrame]:
    """A length ladder on sort-gpt2 under `loss` (and `config`'s other `OPDConfig` fields): at each response cap, a
    clean twin and noise levels of (KL ratio, first-step mismatch_kl), three seeds, every response at its cap
    (`tokens` = cap × batch); `rkl_se` gives a (cap, σ) level's runs that standard error on their held-out KL."""
    frames = []
    for cap, levels in ratios.items():
        for seed in range(3):
            cfg = OPDConfig(pair="sort-gpt2", steps=2, batch_size=4, max_new_tokens=cap, seed=seed, loss=loss, **config)
            for rollout, (ratio, kl) in {"none": (1.0, 0.0), **{f"noise:{s}": v for s, v in levels.items()}}.items():
                frames.append(opd_rows(dataclasses.replace(cfg, rollout=rollout), {
                    "heldout_rkl": {0: 2.0, 2: ratio * (1 + 0.01 * seed) if rollout != "none" else 1.0},
                    "heldout_expected_accuracy": {2: 0.5}, "mismatch_kl": {1: kl, 2: kl},
                    "tokens": {1: 4.0 * cap, 2: 4.0 * cap},
                    **_rkl_se(rkl_se or {}, cap, rollout)}))
    return frames


def _rkl_se(rkl_se: dict[tuple[int, float], float], cap: int, rollout: str) -> dict:
    """The held-out KL standard error rows of a run of `_ladder_rows` (the clean twins of a cap with any: 0)."""
    if rollout == "none":
        return {"heldout_rkl_se": {2: 0.0}} if any(c == cap for c, _ in rkl_se) else {}
    se = rkl_se.get((cap, float(rollout.removeprefix("noise:"))))
    return {} if se is None else {"heldout_rkl_se": {2: se}}


def test_a_length_ladder_gives_the_law_not_the_limits_and_an_open_one_no_law(study):
    """A ladder's rungs (a pair at response caps of its own) stay out of the limits' fit; their noise brackets give
    `length_law` only where they bound the exponent on a side: a ladder tolerated to its top measured no law."""
    alone = thresholds_from_rows(study, sources=["hand-made"])
    open_top = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (1.0, 2.0)}, 32: {0.1: (1.0, 0.4), 0.3: (1.0, 1.5)}})
    t = thresholds_from_rows(pd.concat([study, *open_top], ignore_index=True), sources=["hand-made"])
    assert t.limits == alone.limits and t.brackets == alone.brackets and len(t.points) == len(alone.points)
    assert t.length_law == {}  # every bracket open above: every exponent allowed, so the check keeps its assumption
    closed = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (2.0, 2.0)}, 32: {0.1: (1.0, 0.4), 0.3: (2.0, 1.5)}})
    t = thresholds_from_rows(pd.concat([study, *closed], ignore_index=True), sources=["hand-made"])
    assert t.limits == alone.limits
    # brackets [0.5, 2.0] at 8 tokens and [0.4, 1.5] at 32: b in [log(0.4/2)/log 4, log(1.5/0.5)/log 4]
    assert t.length_law["b_low"] == pytest.approx(math.log(0.4 / 2.0) / math.log(4))
    assert t.length_law["b_high"] == pytest.approx(math.log(1.5 / 0.5) / math.log(4))
    assert t.length_law["lengths"] == [8.0, 32.0]


def test_the_law_a_limit_is_carried_by_rests_on_the_firm_verdicts(study):
    """A marginal verdict (an interval clearing 1.1 by less than the evaluation's Monte-Carlo error) bounds no
    exponent of the law the check scales its limits by: the 32-token rung's low end, σ 0.1 tolerated, given a
    held-out KL standard error far above its clearance, leaves b open below; the report's law (the verdicts as
    decided) keeps it."""
    ratios = {8: {0.1: (1.0, 0.5), 0.3: (2.0, 2.0)}, 32: {0.1: (1.0, 0.4), 0.3: (2.0, 1.5)}}
    rows = pd.concat([study, *_ladder_rows(ratios, rkl_se={(32, 0.1): 0.5})], ignore_index=True)
    levels = analyse(rows[rows["kind"] == "opd"]).levels
    marked = levels[(levels["settings"] == "max_new_tokens 32") & (levels["source"] == "noise")]
    assert marked.set_index("level")["marginal"].to_dict() == {0.1: True, 0.3: False}
    assert marked.set_index("level")["kl_verdict"][0.1] == "tolerated"
    t = thresholds_from_rows(rows, sources=["hand-made"])
    assert math.isnan(t.length_law["b_low"])  # [0, 1.5] at 32 tokens: no power law is bounded below
    assert t.length_law["b_high"] == pytest.approx(math.log(1.5 / 0.5) / math.log(4))  # [0.5, 2.0] at 8 still
    as_decided = [law for key, law in length_tables(levels)[1] if key[1] == "full-rkl"]
    assert as_decided[0].b_low == pytest.approx(math.log(0.4 / 2.0) / math.log(4))


def test_each_loss_scales_by_the_law_of_its_own_ladder(study, tmp_path):
    """Ladders under two losses: each loss's law (`loss_length_laws`) comes from its own brackets alone,
    `length_law` is their envelope (the lower b_low, the higher b_high), and `length_law_for` gives a loss its
    own law and any other loss the envelope — through the file too."""
    full = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (2.0, 2.0)}, 32: {0.1: (1.0, 0.4), 0.3: (2.0, 1.5)}})
    pg = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (2.0, 1.0)}, 32: {0.1: (1.0, 0.1), 0.3: (2.0, 0.3)}}, loss="pg-rkl-is")
    t = thresholds_from_rows(pd.concat([study, *full, *pg], ignore_index=True), sources=["hand-made"])
    expected = {"full-rkl": (math.log(0.4 / 2.0) / math.log(4), math.log(1.5 / 0.5) / math.log(4)),  # [0.5, 2] → [0.4, 1.5]
                "pg-rkl-is": (math.log(0.1 / 1.0) / math.log(4), math.log(0.3 / 0.5) / math.log(4))}  # [0.5, 1] → [0.1, 0.3]
    assert sorted(t.loss_length_laws) == sorted(expected)
    for loss, (b_low, b_high) in expected.items():
        law = t.loss_length_laws[loss]
        assert (law["b_low"], law["b_high"]) == pytest.approx((b_low, b_high)) and len(law["ladders"]) == 1
        assert f" · {loss} · " in law["ladders"][0] and law["lengths"] == [8.0, 32.0]
    assert t.length_law["b_low"] == pytest.approx(expected["pg-rkl-is"][0])
    assert t.length_law["b_high"] == pytest.approx(expected["full-rkl"][1]) and len(t.length_law["ladders"]) == 2
    back = Thresholds.from_json(t.to_json(tmp_path / "t.json"))
    assert back.loss_length_laws == t.loss_length_laws
    assert back.length_law_for("pg-rkl-is") == (t.loss_length_laws["pg-rkl-is"], "pg-rkl-is's ladder")
    assert back.length_law_for("pg-rkl") == (t.length_law, "the ladders of full-rkl, pg-rkl-is; none ran pg-rkl")
    assert back.length_law_for(None)[0] == t.length_law
    assert t.loss_open_ladders == {} and all("tis_caps" in law for law in t.loss_length_laws.values())


def test_a_loss_whose_ladder_bounds_nothing_is_named_and_each_law_keeps_its_tis_caps(study, tmp_path):
    """A ladder under pg-rkl tolerated to its top at both lengths bounds no exponent: pg-rkl has no law of its own,
    `loss_open_ladders` says why and `length_law_for` says so instead of "none ran"; a ladder whose brackets no
    power law passes through (three rungs that rise and fall) is named as such. Each law records the TIS caps its ladders ran with (the settings' text)."""
    full = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (2.0, 2.0)}, 32: {0.1: (1.0, 0.4), 0.3: (2.0, 1.5)}}, tis_cap=2.0)
    open_top = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (1.0, 2.0)}, 32: {0.1: (1.0, 0.4), 0.3: (1.0, 1.5)}}, loss="pg-rkl")
    t = thresholds_from_rows(pd.concat([study, *full, *open_top], ignore_index=True), sources=["hand-made"])
    assert sorted(t.loss_length_laws) == ["full-rkl"] and t.loss_length_laws["full-rkl"]["tis_caps"] == ["2"]
    assert t.loss_open_ladders == {"pg-rkl": "ladder bounds no exponent"}
    path = t.to_json(tmp_path / "t.json")
    back = Thresholds.from_json(path)
    assert back.loss_open_ladders == t.loss_open_ladders
    # degrees of freedom are floats in the file (2.0: not 2 or 2.0 by what the other rows hold)
    assert {type(p[k]) for p in json.loads(path.read_text())["points"] for k in p if k.endswith("_df")} == {float}
    assert back.length_law_for("pg-rkl") == (t.length_law, "the ladders of full-rkl; pg-rkl's ladder bounds no exponent")
    # two closed brackets always admit a power law; three need not: [0.5, 0.6] at 8 and 128 tokens and [2, 2.5] at 32
    # want b ≥ log(2/0.6)/log 4 > 0 from 8 to 32 and b ≤ log(0.6/2)/log 4 < 0 from 32 to 128
    crossed = _ladder_rows({8: {0.1: (1.0, 0.5), 0.3: (2.0, 0.6)}, 32: {0.1: (1.0, 2.0), 0.3: (2.0, 2.5)},
                            128: {0.1: (1.0, 0.5), 0.3: (2.0, 0.6)}}, loss="pg-rkl")
    t = thresholds_from_rows(pd.concat([study, *full, *crossed], ignore_index=True), sources=["hand-made"])
    assert t.loss_open_ladders == {"pg-rkl": "ladder fits no power law"} and "pg-rkl" not in t.loss_length_laws
