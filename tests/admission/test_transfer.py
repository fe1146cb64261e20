"""Which statistic transfers across sources: the per-run candidates against sums by hand, and the
cross-source table against limits fitted by hand on a hand-made study with static and lagged levels."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from mismatch.admission.limits import fit_limit
from mismatch.admission.transfer import level_points, ranking, run_statistics, transfer_table
from mismatch.opd.config import OPDConfig
from mismatch.analysis.tolerance import analyse
from mismatch.results import tidy

STAMP = {"mismatch_version": "0", "torch_version": "t", "transformers_version": "h", "git_sha": "g",
         "timestamp": "2026-01-01T00:00:00+00:00"}
STEPS, WINDOW = 5, 2


def _run(config: OPDConfig, acc: float, kl_by_step: list[float], copy: float | None = None) -> pd.DataFrame:
    """A run's rows: held-out numbers at steps 0 and STEPS, `mismatch_kl` (and `mismatch_chi2_token` = 2×)
    per step, `copy_kl_fwd_mean` at step 0 (0: the initial copy) and at step 3 when `copy` is given."""
    rows = [{"step": 0, "metric": "heldout_rkl", "value": 2.0}, {"step": STEPS, "metric": "heldout_rkl", "value": 1.0},
            {"step": STEPS, "metric": "heldout_expected_accuracy", "value": acc},
            {"step": STEPS, "metric": "tokens", "value": 40.0}]
    for step, kl in enumerate(kl_by_step, start=1):
        rows += [{"step": step, "metric": "mismatch_kl", "value": kl},
                 {"step": step, "metric": "mismatch_chi2_token", "value": 2 * kl}]
    if copy is not None:
        rows += [{"step": 0, "metric": "copy_kl_fwd_mean", "value": 0.0}, {"step": 3, "metric": "copy_kl_fwd_mean",
                                                                             "value": copy}]
    return tidy(pd.DataFrame(rows).assign(level="step"), kind="opd", config=dataclasses.asdict(config), stamp=STAMP)


# per pair: rollout → (per-step mismatch_kl, Δ accuracy in points). Static levels measure their mismatch
# from step 1; a stale copy measures 0 until it lags (steps ≤ K) and its window (steps K+1 … K+2) is what counts.
LEVELS = {"a": {"int8:channel": ([0.01, 0.01, 0.02, 0.02, 0.02], 0.0), "noise:1.0": ([1.0] * 5, -15.0),
                "stale:1": ([0.0, 0.02, 0.04, 0.04, 0.04], 0.0), "stale:2": ([0.0, 0.1, 0.5, 0.7, 0.7], -12.0)},
          "b": {"int4:group128": ([0.05] * 5, 0.0), "noise:2.0": ([2.0] * 5, -20.0),
                "stale:2": ([0.0, 0.01, 0.3, 0.3, 0.3], -9.0)}}


@pytest.fixture(scope="module")
def study() -> pd.DataFrame:
    frames = []
    for pair, levels in LEVELS.items():
        base = OPDConfig(pair=pair, steps=STEPS, batch_size=4)
        for seed in range(3):
            frames.append(_run(dataclasses.replace(base, seed=seed), 0.5, [0.0] * STEPS))
            for rollout, (kls, delta) in levels.items():
                wobble = 1 + 0.1 * seed - 0.1  # the seeds' statistics average to the listed ones
                frames.append(_run(dataclasses.replace(base, rollout=rollout, seed=seed),
                                   0.5 + (delta + 0.2 * seed - 0.2) / 100, [k * wobble for k in kls],
                                   copy=3 * kls[-1] * wobble))
    return pd.concat(frames, ignore_index=True)


def test_the_window_starts_after_the_lag_and_first_is_step_one(study):
    stats = run_statistics(study, window=WINDOW)
    runs = study.groupby("run_id")[["pair", "rollout", "seed"]].first()
    for run_id, (pair, rollout, seed) in runs.iterrows():
        if rollout == "none":
            continue
        kls = np.array(LEVELS[pair][rollout][0]) * (1 + 0.1 * seed - 0.1)
        lag = int(rollout.split(":")[1]) if rollout.startswith("stale") else 0
        assert stats.loc[run_id, "first:mismatch_kl"] == pytest.approx(kls[0])
        assert stats.loc[run_id, "window:mismatch_kl"] == pytest.approx(kls[lag: lag + WINDOW].mean())
        assert stats.loc[run_id, "window:mismatch_chi2_token"] == pytest.approx(2 * kls[lag: lag + WINDOW].mean())
        assert stats.loc[run_id, "copy:kl_fwd_mean"] == pytest.approx(3 * kls[-1])  # step 3's, not step 0's


def test_a_limit_fitted_on_one_group_is_scored_on_the_other(study):
    analysis = analyse(study)
    points = level_points(study, analysis.runs, analysis.levels, window=WINDOW)
    assert points["decided"].all() and len(points) == 7
    by = points.set_index(["pair", "source", "level"])
    assert by.loc[("a", "stale", "2"), "group"] == "lagged" and by.loc[("a", "noise", "1.0"), "group"] == "static"
    assert by.loc[("a", "stale", "2"), "window:mismatch_kl"] == pytest.approx(0.6)  # steps 3–4, mean over seeds
    assert by.loc[("a", "stale", "2"), "window:seq_kl"] == pytest.approx(0.6 * 10)  # 40 tokens / batch of 4
    table = transfer_table(points, ["first:mismatch_kl", "window:mismatch_kl"]).set_index(["statistic", "scheme"])

    def by_hand(statistic, train, test):
        limit = fit_limit(train[statistic].to_numpy(), train["tolerated"].to_numpy())
        return limit, int(((test[statistic] <= limit) == test["tolerated"]).sum())

    static, lagged = points[points["group"] == "static"], points[points["group"] == "lagged"]
    for statistic in ("first:mismatch_kl", "window:mismatch_kl"):
        limit, right = by_hand(statistic, static, lagged)
        row = table.loc[(statistic, "static → lagged")]
        assert row["limit"] == pytest.approx(limit) and row["right"] == right and row["levels"] == 3
        assert (row["always_admit"], row["always_reject"]) == (1, 2)
        lopo = sum(by_hand(statistic, points[points["pair"] != p], points[points["pair"] == p])[1] for p in "ab")
        assert table.loc[(statistic, "leave one pair out"), "right"] == lopo
    # the first step cannot see a stale copy (0 ≤ any limit: every lagged level admitted, 1 of 3 right);
    # the window sees it: static limit between 0.05 and 1.0 → admits stale:1 (0.03), rejects both stale:2
    assert table.loc[("first:mismatch_kl", "static → lagged"), "right"] == 1
    assert table.loc[("window:mismatch_kl", "static → lagged"), "right"] == 3
    assert table.loc[("window:mismatch_kl", "static → lagged"), "limit"] == pytest.approx(math.sqrt(0.05 * 1.0))
    assert ranking(table).index[0] == "window:mismatch_kl"


def test_the_report_writes_the_transfer_table(study, tmp_path):
    from mismatch.report.admission import write_admission_report

    written = {p.name for p in write_admission_report(study, tmp_path, sources=["hand-made"])}
    assert {"admission_transfer.md", "admission_transfer.csv", "admission.md"} <= written
    text = (tmp_path / "admission_transfer.md").read_text()
    assert "lagged sources (staleness, reuse) 1 tolerated, 2 not" in text
    assert len(pd.read_csv(tmp_path / "admission_transfer.csv")) % 4 == 0  # four schemes per statistic


def test_drift_is_the_ratio_of_the_window_to_the_first_step_and_of_the_last_steps_to_the_window(study):
    from mismatch.admission.transfer import drift_table

    analysis = analyse(study)
    drift = drift_table(level_points(study, analysis.runs, analysis.levels, window=WINDOW),
                        floor=1e-3).set_index("source")
    # int8: first 0.01, window (steps 1–2) 0.01, end (steps 4–5) 0.02; int4: 0.05 throughout
    assert drift.loc["format", "window_over_first_n"] == 2 and drift.loc["format", "window_over_first_max"] == pytest.approx(1.0)
    assert drift.loc["format", "end_over_window_max"] == pytest.approx(2.0)
    assert drift.loc["format", "end_over_window_median"] == pytest.approx(1.5)
    # a stale copy's first step is 0: no first-step ratio; end / window: 0.04/0.03, 0.7/0.6, 0.3/0.3
    assert drift.loc["stale", "window_over_first_n"] == 0
    assert drift.loc["stale", "end_over_window_max"] == pytest.approx(0.04 / 0.03)
    assert drift.loc["stale", "end_over_window_median"] == pytest.approx(0.7 / 0.6)
    # the peak (the larger of window and end) over the first step: int8 0.02 / 0.01, int4 1 → margin 1.5 / 2;
    # noise 1.0 and 2.0 constant: ratios 1, margin 1; a lagged source has no margin
    assert drift.loc["format", "peak_over_first_max"] == pytest.approx(2.0)
    assert drift.loc["format", "peak_over_first_median"] == pytest.approx(1.5)
    assert drift.loc["format", "margin"] == pytest.approx(0.75)
    assert drift.loc["noise", "margin"] == pytest.approx(1.0) and math.isnan(drift.loc["stale", "margin"])


def test_the_teacher_side_gap_is_the_copys_heldout_kl_over_the_students_or_the_lag_times_the_twins_progress():
    """A static copy: its step-0 held-out KL to the teacher minus the student's (`_run` writes 2.0 for the
    student; the int4 copy measured 2.3); a lagged copy: lag × its clean twins' held-out KL decrease per
    step (2.0 → 1.0 over STEPS in every `_run`): K for stale:K, (R − 1)/2 for reuse:R. An unmeasured static
    copy has none; the lagged run's own curve is not used (here its run falls as fast: the same numbers)."""
    from mismatch.admission.transfer import GAP

    base = OPDConfig(pair="a", steps=STEPS, batch_size=4)
    frames = []
    for seed in range(3):
        for rollout in ("none", "int4:group128", "noise:0.1", "stale:2", "reuse:3"):
            run = _run(dataclasses.replace(base, rollout=rollout, seed=seed), 0.5, [0.01] * STEPS)
            if rollout == "int4:group128":
                run = pd.concat([run, run.iloc[:1].assign(metric="copy_heldout_rkl", value=2.3)], ignore_index=True)
            if rollout == "stale:2":  # the lagged run's own curve rises: its gap must not follow it
                run.loc[(run["metric"] == "heldout_rkl") & (run["step"] == STEPS), "value"] = 3.0
            frames.append(run)
    study = pd.concat(frames, ignore_index=True)
    analysis = analyse(study)
    points = level_points(study, analysis.runs, analysis.levels, window=WINDOW).set_index(["source", "level"])
    per_step = (2.0 - 1.0) / STEPS
    assert points.loc[("format", "int4:group128"), GAP] == pytest.approx(0.3)
    assert points.loc[("stale", "2"), GAP] == pytest.approx(2 * per_step)
    assert points.loc[("reuse", "3"), GAP] == pytest.approx(1 * per_step)
    assert math.isnan(points.loc[("noise", "0.1"), GAP])


def test_a_tie_goes_to_the_candidate_listed_first_not_to_the_name_sorted_first():
    schemes = ["static → lagged", "lagged → static", "leave one pair out", "in sample"]
    rows = [{"statistic": s, "scheme": scheme, "right": right, "levels": 10}
            for s, right in (("window:mismatch_kl", 7), ("window:mismatch_k3", 7), ("window:mismatch_chi2_token", 8))
            for scheme in schemes]
    table = pd.DataFrame(rows)  # the table's order: candidates(), mismatch_kl before mismatch_k3 ("k3" < "kl")
    order = list(ranking(table).index)
    assert order == ["window:mismatch_chi2_token", "window:mismatch_kl", "window:mismatch_k3"]
    assert list(ranking(table.iloc[::-1]).index)[1:] == ["window:mismatch_k3", "window:mismatch_kl"]
