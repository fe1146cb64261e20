"""Tolerance across seeds: intervals checked against a slow independent computation, verdicts at and
around the thresholds, the tolerance table's reading of a level ladder, and the written report."""

import dataclasses
import math
import random
import statistics

import pandas as pd
import pytest

from mismatch.opd.config import OPDConfig
from mismatch.report.tolerance import write_tolerance_report
from mismatch.analysis.tolerance import (judge_level, level_table, noise_floor, run_table, settings_parts,
                                       settings_text, source_level, t_interval, tolerance_table, weight_bits)
from mismatch.analysis.length import is_rung
from mismatch.analysis.sequential import DEFAULT_DESIGN
from mismatch.results import read_results, tidy, write_frame
from tests.conftest import STAMP, opd_rows

BASE = OPDConfig(pair="sort-gpt2", steps=2, batch_size=4)


def _t975_by_bisection(df: int, q: float = 0.975) -> float:
    """The `q` quantile (q > ½) of Student's t by bisection on its CDF, integrated numerically (Simpson)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    pdf = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731

    def cdf(t: float, n: int = 20000) -> float:
        h = t / n
        s = pdf(0) + pdf(t) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


def _first_look_half(values: list[float]) -> float:
    """The design's half-width at its first look (3 seeds of 16, Pocock-type α-spending of `spent_alpha`) with the
    level's own sd, independently: the first look's z boundary has a closed form, Φ⁻¹(1 − α(3/16)/2) with
    α(t) = 0.05·ln(1 + (e − 1)t), and its t value is the same tail of Student's t (bisection here)."""
    spent = DEFAULT_DESIGN.spent_alpha * math.log(1 + (math.e - 1) * 3 / 16)
    n = len(values)
    return _t975_by_bisection(n - 1, 1 - spent / 2) * statistics.stdev(values) / math.sqrt(n)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_t_interval_matches_an_independent_computation(n):
    rng = random.Random(n)
    x = [rng.gauss(0, 1) for _ in range(n)]
    mean, half = t_interval(x)
    assert mean == pytest.approx(statistics.fmean(x))
    assert half == pytest.approx(_t975_by_bisection(n - 1) * statistics.stdev(x) / math.sqrt(n), rel=2e-3)
    assert math.isnan(t_interval([0.3])[1])


def test_source_level_and_bits():
    assert source_level("none") == ("clean", 0)
    assert source_level("none", staleness=2) == ("stale", 2)
    assert source_level("stale:4") == ("stale", 4)
    assert source_level("reuse:8") == ("reuse", 8)
    assert source_level("noise:0.3") == ("noise", 0.3)
    assert source_level("fp8-e4m3") == ("format", "fp8-e4m3:channel")
    assert weight_bits("int4:group128") == 4 + 16 / 128 and weight_bits("fp8-e4m3:block128") == 8


def _run(config: OPDConfig, acc: float, kl: float, mismatch: float = 0.01) -> pd.DataFrame:
    return opd_rows(config, {"heldout_rkl": {0: 2.0, 2: kl}, "heldout_expected_accuracy": {0: 0.25, 2: acc},
                             "mismatch_kl": {1: mismatch, 2: 0.0}})


# Δ accuracy per seed (points) of each stale:K and format, and KL ratio; the clean runs end at 40% / KL 1.0
DELTAS = {"stale:1": ([-0.6, -0.5, -0.4], 1.02), "stale:2": ([-1.0, -3.0, -2.0], 1.03),
          "stale:4": ([-6.0, -5.0, -7.0], 1.20), "stale:8": ([-1.1, -1.0, -0.9], 1.01),
          "int4:group128": ([0.1, -0.1, 0.0], 1.0), "fp8-e4m3": ([-0.2, 0.1, 0.0], 1.0),
          "noise:0.5": ([-30.0], 2.0)}


@pytest.fixture
def rows():
    frames = [_run(dataclasses.replace(BASE, seed=s), 0.40, 1.0) for s in range(3)]
    for rollout, (deltas, ratio) in DELTAS.items():
        for seed, d in enumerate(deltas):
            frames.append(_run(dataclasses.replace(BASE, rollout=rollout, seed=seed), 0.40 + d / 100, ratio))
    frames.append(_run(dataclasses.replace(BASE, lr=3e-3), 0.30, 1.5))  # a second setting: its own clean twin
    frames.append(_run(dataclasses.replace(BASE, lr=3e-3, rollout="stale:1"), 0.20, 1.6))
    return pd.concat(frames, ignore_index=True)


def test_levels_pool_seeds_and_judge_with_intervals(rows):
    levels = level_table(run_table(rows)).set_index(["settings", "level"])
    cell = levels.loc[("lr 0.001", 2)]
    values = [d / 100 for d in DELTAS["stale:2"][0]]
    assert cell["seeds"] == 3 and cell["look"] == 1 and cell["acc_delta"] == pytest.approx(statistics.fmean(values))
    assert cell["acc_delta_hw"] == pytest.approx(_first_look_half(values), rel=1e-4)  # own sd: no A/A level here
    assert cell["acc_delta_basis"] == "own" and cell["acc_delta_df"] == 2
    assert cell["verdict"] == "uncertain"  # −2.0 ± 4.8 straddles −2
    assert levels.loc[("lr 0.001", 1), "verdict"] == "tolerated"  # −0.5 ± 0.6 lies above −2, KL 1.02
    assert levels.loc[("lr 0.001", 4), "verdict"] == "not tolerated"  # KL 1.20 on every seed: wholly above 1.1
    assert levels.loc[("lr 0.001", 0.5), "verdict"] == "uncertain"  # one seed: no interval, not called either way
    assert levels.loc[("lr 0.003", 1), "verdict"] == "uncertain"
    assert levels.loc[("lr 0.001", 1), "mismatch_kl"] == pytest.approx(0.005)
    assert cell["acc_margin"] == pytest.approx(statistics.fmean(values) + 0.02)
    assert cell["kl_margin"] == pytest.approx(1.10 - 1.03)


def test_a_sampled_accuracy_is_reported_beside_a_kl_verdict(rows):
    """A pair whose accuracy is sampled (no exact expectation) is judged by its KL ratio alone: the same Δ
    that leaves stale:2 uncertain (its interval straddles −2 points) does not decide here, the KL does;
    the Δ and its interval are still in the table. Each level carries its loss and response length."""
    sampled = rows.assign(metric=rows["metric"].replace({"heldout_expected_accuracy": "heldout_accuracy"}))
    levels = level_table(run_table(sampled)).set_index(["settings", "level"])
    exact = level_table(run_table(rows)).set_index(["settings", "level"])
    cell = levels.loc[("lr 0.001", 2)]
    assert cell["judged_on"] == "KL ratio" and exact.loc[("lr 0.001", 2), "judged_on"] == "Δ accuracy, KL ratio"
    assert cell["acc_delta"] == pytest.approx(exact.loc[("lr 0.001", 2), "acc_delta"])
    assert cell["acc_delta_hw"] == pytest.approx(exact.loc[("lr 0.001", 2), "acc_delta_hw"])
    assert cell["verdict"] == "tolerated" and exact.loc[("lr 0.001", 2), "verdict"] == "uncertain"  # KL 1.03 (sd 0)
    assert levels.loc[("lr 0.001", 4), "verdict"] == "not tolerated"  # KL 1.20 still decides against
    assert set(levels["loss"]) == {"full-rkl"}
    assert math.isnan(cell["response_tokens"])  # these hand-made runs logged no `tokens`


def test_tolerance_table_reads_the_ladder(rows):
    table = tolerance_table(level_table(run_table(rows))).set_index(["source", "settings"])
    stale = table.loc[("stale", "lr 0.001")]
    assert stale["levels"] == "1, 2, 4, 8" and stale["tolerated up to"] == "1"  # 2 is uncertain: the ladder stops
    assert stale["first not tolerated"] == "4" and stale["uncertain"] == "2 (undecided at 3 seeds)"
    fmt = table.loc[("format", "lr 0.001")]
    assert fmt["tolerated up to"] == "int4:group128 (4.125 bits)"  # the cheapest tolerated format


def test_the_report_writes_tables_and_figures(rows, tmp_path):
    written = write_tolerance_report(rows, tmp_path)
    names = [p.name for p in written]
    assert names == ["tolerance.md", "tolerance.csv", "tolerance_levels.csv", "noise_floor.csv", "headline.md",
                     "tolerance_levels.png", "tolerance_vs_mismatch.png", "seed_curves.png"]
    md = (tmp_path / "tolerance.md").read_text()
    assert "| sort-gpt2 | stale | full-rkl | lr 0.001 | 1, 2, 4, 8 | 1 | 4 | 2 (undecided at 3 seeds) |" in md
    assert "## The design and its error" in md and "looks at 3, 6, 10, 16 seeds" in md
    # the headline counts what the level table says, and names each level's deciding statistic
    levels = pd.read_csv(tmp_path / "tolerance_levels.csv")
    judged = levels[levels["source"] != "A/A"]
    decided = int((judged["verdict"] != "uncertain").sum())
    head = (tmp_path / "headline.md").read_text()
    assert f"**{decided} of the {len(judged)} levels are decided**" in head
    assert head.startswith("<!-- reports/headline.md: begin -->") and head.rstrip().endswith("end -->")
    stale4 = levels[(levels["source"] == "stale") & (levels["level"] == "4") & (levels["settings"] == "lr 0.001")].iloc[0]
    assert f"stale 4 (KL {stale4['kl_ratio']:.3f} ± {stale4['kl_ratio_hw']:.3f}" in head  # KL decided it, not Δ
    judged = int((level_table(run_table(rows))["source"] != "A/A").sum())
    assert f"{judged} levels judged" in md and f"≈ {0.05 * judged:.1f} wrong verdicts" in md
    assert pd.read_csv(tmp_path / "tolerance_levels.csv").shape[0] == 8


def test_a_dataset_without_accuracy_still_gets_its_figures(rows, tmp_path):
    """A real pair logs no accuracy (smollm2-pruned is judged on the held-out KL alone): the report still
    writes every figure, its Δ-accuracy panels saying they have no data, and judges on the KL ratio."""
    kl_only = rows[~rows["metric"].isin(["heldout_expected_accuracy"])]
    written = write_tolerance_report(kl_only, tmp_path)
    assert {"tolerance_levels.png", "tolerance_vs_mismatch.png"} <= {p.name for p in written}
    levels = pd.read_csv(tmp_path / "tolerance_levels.csv")
    assert levels["acc_delta"].isna().all() and set(levels["judged_on"]) == {"KL ratio"}
    stale4 = levels[(levels["source"] == "stale") & (levels["level"].astype(str) == "4")]
    assert list(stale4["verdict"]) == ["not tolerated"]  # KL 1.20 on every seed


def test_a_run_still_going_is_compared_at_its_last_step_and_not_pooled(rows):
    """A run whose last evaluation is step 0 (still going): its verdict compares step 0 with the clean
    run's step 0 (not the clean run's final step), and the tolerance pools only finished runs."""
    going = _run(dataclasses.replace(BASE, rollout="stale:16", seed=0), 0.10, 3.0)
    going = going[going["step"] == 0]
    runs = run_table(pd.concat([rows, going], ignore_index=True))
    mine = runs[runs["rollout"] == "stale:16"].iloc[0]
    assert not mine["complete"] and mine["acc_delta"] == 0.0 and mine["kl_ratio"] == 1.0  # step 0 vs step 0
    assert runs[runs["rollout"] != "stale:16"]["complete"].all()
    assert 16 not in set(level_table(runs)["level"])


def test_a_field_set_on_some_runs_and_unset_on_others_is_a_setting(rows):
    """tis_cap None (NaN once read back) vs 2: two settings, never pooled as one level."""
    extra = [_run(dataclasses.replace(BASE, tis_cap=2.0, seed=s), 0.40, 1.0) for s in range(3)]
    extra += [_run(dataclasses.replace(BASE, tis_cap=2.0, rollout="stale:1", seed=s), 0.30, 1.3) for s in range(3)]
    levels = level_table(run_table(pd.concat([rows, *extra], ignore_index=True)))
    stale1 = levels[(levels["source"] == "stale") & (levels["level"] == 1) & levels["settings"].str.startswith("lr 0.001")]
    assert sorted(stale1["settings"]) == ["lr 0.001, tis_cap 2", "lr 0.001, tis_cap off"]
    assert stale1["seeds"].tolist() == [3, 3]
    for settings in stale1["settings"]:  # the text's parts are the settings that vary, read back in its order
        assert settings_parts(settings) == ["lr 0.001", settings.split("lr 0.001, ")[1]]
        assert settings_text(settings_parts(settings)) == settings
    assert settings_text([]) == "default" and settings_parts("default") == ["default"]


def test_an_engine_is_a_source_of_its_own_ordered_by_bits():
    from mismatch.analysis.tolerance import source_level, weight_bits

    assert source_level("engine:llama.cpp,q8_0") == ("engine", "engine:llama.cpp,q8_0")
    assert source_level("engine:llama.cpp,f16", 2) == ("engine", "engine:llama.cpp,f16 + stale:2")
    assert [weight_bits(f"engine:llama.cpp,{w}") for w in ("f32", "f16", "q8_0", "q4_1", "q4_0")] == [32, 16, 8.5, 5, 4.5]


def test_one_seed_counts_once_and_other_scopes_are_other_levels():
    """Two runs of one seed (the same spec spelt two ways: two run ids, one level) are one
    observation: no interval, so not called tolerated. Runs on another layer scope are not pooled
    with the default scope's."""
    frames = [_run(BASE, 0.40, 1.0)]
    for rollout in ("fp8-e4m3", "fp8-e4m3:channel"):  # one level, one seed
        frames.append(_run(dataclasses.replace(BASE, rollout=rollout), 0.40, 1.05))
    for seed in (0, 1):
        frames.append(_run(dataclasses.replace(BASE, seed=seed, rollout="int8:channel"), 0.40, 1.0))
        frames.append(_run(dataclasses.replace(BASE, seed=seed, rollout="int8:channel", layers="attn"), 0.30, 3.0))
    frames.append(_run(dataclasses.replace(BASE, seed=1), 0.40, 1.0))
    levels = level_table(run_table(pd.concat(frames, ignore_index=True)))
    fp8 = levels[levels["level"] == "fp8-e4m3:channel"].iloc[0]
    assert fp8["seeds"] == 1 and math.isnan(fp8["kl_ratio_hw"]) and fp8["verdict"] == "uncertain"
    int8 = levels[levels["level"] == "int8:channel"].set_index("settings")
    assert sorted(int8.index) == ["default", "layers attn"] and (int8["seeds"] == 2).all()
    assert int8.loc["default", "kl_ratio"] == 1.0 and int8.loc["layers attn", "kl_ratio"] == 3.0


def test_a_clean_twin_at_zero_kl_gives_a_ratio_not_a_crash():
    from mismatch.analysis.twins import verdict

    clean = [{"step": 2, "metric": "heldout_rkl", "value": 0.0}]
    for run_kl, ratio in ((0.0, 1.0), (0.5, math.inf)):
        assert verdict(clean, [{"step": 2, "metric": "heldout_rkl", "value": run_kl}])["kl_ratio"] == ratio


def test_the_kl_ratio_alone_decides_when_accuracy_keeps_up():
    """Δ accuracy fine on every seed; the KL ratio's interval alone decides: wholly above 1 + kl_tol →
    not tolerated, straddling it → uncertain, wholly below → tolerated (default kl_tol 0.10)."""
    ratios = {"int8:channel": [1.30, 1.32, 1.28], "int4:group128": [1.05, 1.15, 1.10], "fp8-e4m3": [1.00, 1.02, 1.01]}
    frames = [_run(dataclasses.replace(BASE, seed=s), 0.40, 1.0) for s in range(3)]
    for rollout, per_seed in ratios.items():
        frames += [_run(dataclasses.replace(BASE, rollout=rollout, seed=s), 0.40 + (0.001 * s), r)
                   for s, r in enumerate(per_seed)]
    levels = level_table(run_table(pd.concat(frames, ignore_index=True))).set_index("level")
    assert levels.loc["int8:channel", "verdict"] == "not tolerated"
    assert levels.loc["int4:group128", "verdict"] == "uncertain"
    assert levels.loc["fp8-e4m3:channel", "verdict"] == "tolerated"
    got = levels.loc["int4:group128", ["kl_ratio", "kl_ratio_hw"]].tolist()
    assert got == pytest.approx([statistics.fmean(ratios["int4:group128"]), _first_look_half(ratios["int4:group128"])],
                                rel=1e-4)


def test_t_interval_switches_to_the_normal_beyond_30_degrees_of_freedom():
    assert t_interval(list(range(31)))[1] == pytest.approx(2.042 * statistics.stdev(range(31)) / math.sqrt(31))  # df 30
    assert t_interval(list(range(32)))[1] == pytest.approx(1.96 * statistics.stdev(range(32)) / math.sqrt(32))


def test_a_level_on_part_of_the_model_is_judged_against_the_same_aa_level():
    """A copy applied to some layers only (`layers attn`, its own level) trains under the same settings as the
    whole-model levels, so the pair's A/A level lends it its spread as it lends theirs: judged as `judge_level`
    judges its seeds against the A/A level's, not on its own 2 degrees of freedom."""
    aa = [0.004, -0.006, 0.002, 0.0, -0.003, 0.005]  # the A/A twins' Δ accuracy; their KL ratios 1 ± 0.01
    scoped = [(0.39, 1.01), (0.395, 0.99), (0.392, 1.0)]  # (accuracy, KL ratio) of int8 on attention only
    frames = []
    for seed in range(6):
        frames.append(_run(dataclasses.replace(BASE, seed=seed), 0.40, 1.0))
        frames.append(_run(dataclasses.replace(BASE, seed=seed, rollout="resample:1"), 0.40 + aa[seed],
                           1.0 + 0.01 * (seed % 3 - 1), 0.0))
    for seed, (acc, kl) in enumerate(scoped):
        frames.append(_run(dataclasses.replace(BASE, seed=seed, rollout="int8:channel", layers="attn"), acc, kl))
    levels = level_table(run_table(pd.concat(frames, ignore_index=True))).set_index("source")
    got = levels.loc["format"]
    assert got["settings"] == "layers attn"
    want = judge_level(pd.Series([a - 0.40 for a, _ in scoped]), pd.Series([k for _, k in scoped]),
                       pd.Series(aa), pd.Series([1.0 + 0.01 * (s % 3 - 1) for s in range(6)]))
    assert got["kl_ratio_basis"] == want["kl_ratio_basis"] != "own"
    assert (got["kl_ratio_hw"], got["acc_delta_hw"], got["verdict"]) == pytest.approx(
        (want["kl_ratio_hw"], want["acc_delta_hw"], want["verdict"]))


def test_the_noise_floor_is_the_clean_spread_and_the_aa_level():
    """Clean finals over four seeds, and `resample:1` twins: the floor's numbers against statistics.*"""
    clean_acc, aa_delta = [0.40, 0.43, 0.38, 0.41], [0.012, -0.021, 0.004, -0.010]
    frames = []
    for seed, (acc, d) in enumerate(zip(clean_acc, aa_delta)):
        frames.append(_run(dataclasses.replace(BASE, seed=seed), acc, 1.0 + 0.01 * seed))
        frames.append(_run(dataclasses.replace(BASE, seed=seed, rollout="resample:1"), acc + d, 1.0 + 0.01 * seed, 0.0))
    runs = run_table(pd.concat(frames, ignore_index=True))
    levels = level_table(runs)
    assert levels["source"].tolist() == ["A/A"] and levels["level"].tolist() == [0]
    floor = noise_floor(runs, levels).iloc[0]
    assert floor["clean_seeds"] == 4 and floor["aa_seeds"] == 4
    assert floor["clean_accuracy"] == pytest.approx(100 * statistics.fmean(clean_acc))
    assert floor["clean_accuracy_sd"] == pytest.approx(100 * statistics.stdev(clean_acc))
    assert floor["clean_heldout_rkl_sd"] == pytest.approx(statistics.stdev([1.0, 1.01, 1.02, 1.03]))
    assert floor["aa_acc_delta"] == pytest.approx(100 * statistics.fmean(aa_delta))
    assert floor["aa_acc_delta_sd"] == pytest.approx(100 * statistics.stdev(aa_delta))
    assert floor["aa_acc_delta_hw"] == pytest.approx(100 * _first_look_half(aa_delta), rel=1e-4)  # the design's, look 1
    # −0.4 ± 3.6 points straddles −2: at this spread four seeds cannot resolve a 2-point threshold even for A/A
    assert floor["aa_kl_ratio"] == pytest.approx(1.0) and floor["aa_verdict"] == "uncertain"


def test_the_aa_level_is_the_noise_floors_not_a_ladder_rung(rows):
    aa = [_run(dataclasses.replace(BASE, seed=s, rollout="resample:1"), 0.40, 1.0, 0.0) for s in range(3)]
    levels = level_table(run_table(pd.concat([rows, *aa], ignore_index=True)))
    assert (levels["source"] == "A/A").sum() == 1  # a level of its own (counted, decided or not)
    assert "A/A" not in set(tolerance_table(levels)["source"])


def test_a_level_keeps_its_own_value_beside_an_equal_one_of_another_source():
    """stale:1 beside noise:1.0: pandas would group 1 and 1.0 as one key; each level keeps its own."""
    frames = [_run(dataclasses.replace(BASE, seed=s), 0.40, 1.0) for s in range(2)]
    frames += [_run(dataclasses.replace(BASE, seed=s, rollout=r), 0.39, 1.0) for s in range(2) for r in ("noise:1.0", "stale:1")]
    levels = level_table(run_table(pd.concat(frames, ignore_index=True))).set_index("source")
    assert repr(levels.loc["stale", "level"]) == "1" and repr(levels.loc["noise", "level"]) == "1.0"


def test_identical_levels_are_reported_once_and_marginal_ones_are_marked():
    """Two format specs whose runs are the same bit for bit (the same rollout weights) are one level,
    listed under the first with `same_as`; a level whose KL interval clears 1.1 by less than the
    evaluation's Monte-Carlo error (its runs' heldout_rkl_se) is marked marginal, one far from it is not."""
    def run(config, acc, kl, kl_se):
        frame = _run(config, acc, kl)
        extra = pd.DataFrame([{"step": 2, "metric": "heldout_rkl_se", "value": kl_se}]).assign(level="step")
        return pd.concat([frame, tidy(extra, kind="opd", config=dataclasses.asdict(config), stamp=STAMP)])

    frames = []
    for s in range(3):
        frames.append(run(dataclasses.replace(BASE, seed=s), 0.40, 1.0, 0.001))
        for rollout in ("int4:channel", "int4:group128"):  # identical rows
            frames.append(run(dataclasses.replace(BASE, rollout=rollout, seed=s), 0.40, 1.0 + 0.001 * s, 0.001))
        # KL ratio 1.040–1.050: its interval ends ~0.03 below 1.1; a Monte-Carlo error of 0.2 nats per run dwarfs that
        frames.append(run(dataclasses.replace(BASE, rollout="int8:channel", seed=s), 0.40, 1.04 + 0.005 * s, 0.2))
    levels = level_table(run_table(pd.concat(frames, ignore_index=True))).set_index("level")
    assert list(levels.index) == ["int4:channel", "int8:channel"]  # int4:group128 folded into its twin
    assert levels.loc["int4:channel", "same_as"] == "int4:group128" and levels.loc["int8:channel", "same_as"] == ""
    int8 = levels.loc["int8:channel"]
    assert int8["verdict"] == "tolerated" and 0 < 1.1 - (int8["kl_ratio"] + int8["kl_ratio_hw"]) < int8["kl_ratio_mc_se"]
    assert int8["marginal"] and not levels.loc["int4:channel", "marginal"]


def test_a_level_whose_runs_repeat_another_settings_bit_for_bit_is_reported_once():
    """A TIS cap that never binds leaves every run as it was: int8 under tis_cap 2 is the runs of int8 without
    TIS bit for bit — one level, listed under the first with the settings that differ; a level whose runs do
    differ under the cap stays a level of its own."""
    pg = dataclasses.replace(BASE, loss="pg-rkl-is")
    frames = []
    for cap in (None, 2.0):
        for s in range(3):
            frames.append(_run(dataclasses.replace(pg, tis_cap=cap, seed=s), 0.40, 1.0))
            frames.append(_run(dataclasses.replace(pg, tis_cap=cap, seed=s, rollout="int8:channel"), 0.40, 1.0 + 0.01 * s))
            frames.append(_run(dataclasses.replace(pg, tis_cap=cap, seed=s, rollout="noise:0.3"), 0.40,
                               1.2 + 0.01 * s - (0.1 if cap else 0.0)))
    levels = level_table(run_table(pd.concat(frames, ignore_index=True)))
    int8 = levels[levels["level"] == "int8:channel"]
    assert len(int8) == 1 and int8["same_as"].iloc[0] == "int8:channel (tis_cap 2)"
    assert "tis_cap off" in int8["settings"].iloc[0]
    noise = levels[levels["level"] == 0.3].set_index("settings")
    assert len(noise) == 2 and (noise["same_as"] == "").all()


def test_a_look_partly_run_waits_for_its_seeds():
    """8 seeds on disk, the design's looks at 6 and 10: the level is judged at look 2 on its 6 lowest seeds
    (mean and interval of those alone), `seeds_run` says 8; its 2 extra seeds would only count at 10."""
    ratios = [1.02, 1.06, 0.98, 1.04, 1.00, 1.03, 1.60, 1.70]  # the extra seeds far off: they must not move it
    frames = [_run(dataclasses.replace(BASE, seed=s), 0.40, 1.0) for s in range(8)]
    frames += [_run(dataclasses.replace(BASE, seed=s, rollout="fp8-e4m3"), 0.40, r) for s, r in enumerate(ratios)]
    level = level_table(run_table(pd.concat(frames, ignore_index=True))).iloc[0]
    first = ratios[:6]
    assert (level["seeds"], level["seeds_run"], level["look"]) == (6, 8, 2)
    assert level["kl_ratio"] == pytest.approx(statistics.fmean(first), rel=1e-9)
    assert level["kl_ratio_hw"] == pytest.approx(
        DEFAULT_DESIGN.critical(2, 5) * statistics.stdev(first) / math.sqrt(6), rel=1e-9)


def test_a_length_rung_beside_runs_at_their_pairs_cap_is_the_only_rung(rows, tmp_path):
    """`max_new_tokens` set on a ladder's runs and unset on the rest, read back from a dataset directory (a
    nullable integer column: `<NA>` for the unset): the rest read `max_new_tokens off`, so only the ladder's levels are rungs (a
    `<NA>` read as a cap made every level a rung, and the admission fit found no level to fit on)."""
    extra = [_run(dataclasses.replace(BASE, max_new_tokens=16, rollout=r, seed=s), 0.40, 1.0)
             for r in ("none", "noise:0.5") for s in range(3)]
    write_frame(rows, tmp_path / "a.parquet")  # two parts of a dataset directory, as a sweep writes them
    write_frame(pd.concat(extra, ignore_index=True), tmp_path / "b.parquet")
    back = read_results(tmp_path)
    assert str(back["max_new_tokens"].dtype) == "Int64" and back["max_new_tokens"].isna().any()
    levels = level_table(run_table(back))
    capped = levels["settings"].str.contains("max_new_tokens 16")
    assert capped.sum() == 1 and (~capped).sum() > 1
    assert is_rung(levels["settings"]).tolist() == capped.tolist()
    assert not levels["settings"].str.contains("<NA>").any()
