"""Tolerance verdict against hand-made final values."""

import math

import pytest
from typer.testing import CliRunner

from mismatch.verdict import Tolerance
from mismatch.cli.app import app
from mismatch.analysis.twins import accuracy_metric, final_value, first_value, kl_curve_area, verdict, verdict_table
from mismatch.results import read_results


def _rows(kls, accs, metric="heldout_accuracy"):
    rows = [{"step": s, "metric": "heldout_rkl", "value": v} for s, v in kls.items()]
    return rows + [{"step": s, "metric": metric, "value": v} for s, v in accs.items()]


def _exact(kls, accs):
    return _rows(kls, accs, "heldout_expected_accuracy")


def test_final_value_takes_the_last_step():
    rows = _rows({0: 5.0, 10: 3.0, 20: 2.0}, {})
    assert final_value(rows, "heldout_rkl") == 2.0
    assert math.isnan(final_value(rows, "heldout_accuracy"))


def test_first_value_takes_the_earliest_step_that_recorded_it():
    """A run's first-step mismatch (the check's statistic, the length law's) is the earliest recorded value, in
    whatever order the rows come; the mean over steps is another number once the statistic drifts."""
    rows = [{"step": s, "metric": "mismatch_kl", "value": v} for s, v in ((3, 0.2), (1, 0.8), (2, 0.5))]
    rows += [{"step": 0, "metric": "heldout_rkl", "value": 5.0}]
    assert first_value(rows, "mismatch_kl") == 0.8
    assert math.isnan(first_value(rows, "heldout_accuracy"))


def test_verdict_thresholds():
    clean = _exact({0: 5.0, 20: 2.0}, {0: 0.3, 20: 0.60})
    ok = verdict(clean, _exact({20: 2.19}, {20: 0.585}))  # KL +9.5%, accuracy −1.5 points: within
    assert ok["kl_ratio"] == pytest.approx(1.095) and ok["acc_delta"] == pytest.approx(-0.015)
    assert ok["kept_up"]
    assert not verdict(clean, _exact({20: 2.21}, {20: 0.60}))["kept_up"]
    assert not verdict(clean, _exact({20: 2.0}, {20: 0.57}))["kept_up"]
    assert verdict(clean, _exact({20: 2.0}, {20: 0.57}), tolerance=Tolerance(acc_tol=0.05))["kept_up"]
    no_task = verdict(_rows({20: 2.0}, {}), _rows({20: 2.1}, {}))  # KL only
    assert no_task["kept_up"] and math.isnan(no_task["acc_delta"])
    # a sampled accuracy is reported, not judged: −3 points of binomial noise do not decide against KL 1.0
    sampled = verdict(_rows({20: 2.0}, {20: 0.60}), _rows({20: 2.0}, {20: 0.57}))
    assert sampled["acc_delta"] == pytest.approx(-0.03) and sampled["kept_up"]
    assert not verdict(_rows({20: 2.0}, {20: 0.60}), _rows({20: 2.21}, {20: 0.60}))["kept_up"]


def test_verdict_compares_the_expected_accuracy_where_both_runs_recorded_it():
    """The exact expected exact match, when both twins have it, is the accuracy compared; otherwise
    (older results, tasks without one correct response) the sampled one."""
    def with_expected(rows, values):
        return rows + [{"step": s, "metric": "heldout_expected_accuracy", "value": v} for s, v in values.items()]

    clean = with_expected(_rows({20: 2.0}, {20: 0.60}), {20: 0.50})
    run = with_expected(_rows({20: 2.0}, {20: 0.61}), {20: 0.47})  # sampled +1 point, expected −3 points
    v = verdict(clean, run)
    assert v["accuracy_metric"] == "heldout_expected_accuracy"
    assert v["acc_delta"] == pytest.approx(-0.03) and not v["kept_up"]
    only_sampled = verdict(clean, _rows({20: 2.0}, {20: 0.61}))  # one twin lacks it: both compare sampled
    assert only_sampled["accuracy_metric"] == "heldout_accuracy" and only_sampled["acc_delta"] == pytest.approx(0.01)
    assert accuracy_metric(clean) == "heldout_expected_accuracy" and accuracy_metric(_rows({}, {})) == "heldout_accuracy"


@pytest.mark.slow
def test_cli_baseline_prints_every_run_and_its_verdict(tmp_path):
    """Two rollouts against one clean baseline: three runs in one results dataset, and the printed
    verdicts agree with the verdict table recomputed from those rows (what `mismatch report` writes)."""
    res = CliRunner().invoke(app, ["opd", "--pair", "reverse-qwen3", "--rollout", "noise:0.05", "--rollout",
                                   "stale:1", "--steps", "2", "--batch-size", "4", "--eval-prompts", "8",
                                   "--eval-every", "2", "--baseline", "--out", str(tmp_path / "results"),
                                   "--save", str(tmp_path / "students")], terminal_width=200)
    assert res.exit_code == 0, res.output
    rows = read_results(tmp_path / "results")
    assert sorted(p.name for p in (tmp_path / "students").iterdir()) == ["clean", "noise_0.05", "stale_1"]
    assert (tmp_path / "students" / "stale_1" / "model.safetensors").is_file()
    assert sorted(rows["rollout"].unique()) == ["noise:0.05", "none", "stale:1"] and set(rows["kind"]) == {"opd"}
    table = verdict_table(rows).set_index("rollout")
    assert list(table.index) == ["clean", "noise:0.05", "stale:1"]
    assert (table.loc[["noise:0.05", "stale:1"], "baseline"] == table.loc["clean", "run_id"]).all()
    lines = {line.split()[1]: line for line in res.output.splitlines() if line.startswith("│")}
    assert "baseline" in lines["clean"]
    for label in ("noise:0.05", "stale:1"):  # one seed: the tolerance rule calls no verdict
        assert "uncertain (1 seed)" in lines[label] and "tolerated" not in lines[label]
        assert f"{table.loc[label, 'kl_ratio']:.3f}" in lines[label]


def test_a_run_that_lags_and_catches_up_has_an_area_ratio_above_one():
    """Learning speed beside the final verdict: the held-out KL curve's area (trapezoids) ÷ the clean twin's,
    by hand: clean 5 → 3 → 2 has mean height (10·4 + 10·2.5) / 20 = 3.25, a run 5 → 4 → 2 has 3.75."""
    clean = _rows({0: 5.0, 10: 3.0, 20: 2.0}, {})
    lagging = verdict(clean, _rows({0: 5.0, 10: 4.0, 20: 2.0}, {}))
    assert lagging["kl_ratio"] == pytest.approx(1.0) and lagging["kl_auc_ratio"] == pytest.approx(3.75 / 3.25)
    assert kl_curve_area(clean, [0, 10, 20]) == pytest.approx(3.25)
    assert math.isnan(kl_curve_area(clean, [0, 15]))  # a step the run did not evaluate: no area
    early = verdict(clean, _rows({0: 5.0, 10: 3.0}, {}))  # a run still going: compared up to step 10
    assert early["kl_auc_ratio"] == pytest.approx(1.0)
