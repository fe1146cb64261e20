"""`mismatch monitor` on logs written by real runs: TRL's trainer (trainer_state.json and TensorBoard), the
toolkit's own OPD loop (its results dataset), verl's own file logger fed that run's metrics, and prime-rl's
file-monitor lines; the trailing window (the check's window statistic) against an independent t-interval; the
patience rule against a hand-counted series; bad logs as one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import mismatch
from mismatch.admission.thresholds import load_thresholds
from mismatch.cli.app import app
from mismatch.errors import InputError
from mismatch.monitor import MonitorSettings, monitor
from mismatch.monitor.logs import read_log

pytest.importorskip("trl", reason="the trl extra is not installed (make test installs it)")
from tests.trl_runs import trl_trainer  # noqa: E402

THRESHOLDS = load_thresholds()
LIMIT = THRESHOLDS.window_limits["mismatch_kl"]  # what the gating statistic's windows are judged against
WINDOW = THRESHOLDS.window_steps


@pytest.fixture(scope="module")
def pair():
    return mismatch.load_pair("sort-gpt2")


@pytest.fixture(scope="module")
def trl_run(pair, tmp_path_factory):
    """A real TRL run with int4 rollouts, logging every step to its state and to TensorBoard."""
    out = tmp_path_factory.mktemp("trl") / "out"
    trainer = trl_trainer(pair, out, steps=4, rollout="int4:channel", report_to="tensorboard")
    trainer.train()
    trainer.save_state()
    logged = {row["step"]: row["mismatch_kl"] for row in trainer.state.log_history if "mismatch_kl" in row}
    return out, logged


@pytest.fixture(scope="module")
def opd_run(tmp_path_factory):
    """A real run of the toolkit's own OPD loop (`mismatch opd`), written as a results dataset."""
    out = tmp_path_factory.mktemp("opd") / "results"
    runner = CliRunner()
    res = runner.invoke(app, ["opd", "--pair", "sort-gpt2", "--rollout", "noise:0.3", "--steps", "4", "--batch-size",
                              "16", "--eval-every", "4", "--eval-prompts", "8", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = mismatch.read_results(out)
    assert rows.loc[rows["kind"] == "opd", "run_id"].nunique() == 1
    per_step = rows[(rows["kind"] == "opd") & rows["seq"].isna() & rows["layer"].isna()]
    steps = per_step.pivot_table(index="step", columns="metric", values="value").reset_index()  # one value each
    return out, steps[steps["mismatch_kl"].notna()].sort_values("step")


def test_trl_state_output_dir_and_tensorboard_give_the_logged_values(trl_run):
    out, logged = trl_run
    for path in (out / "trainer_state.json", out, out / "runs"):
        report = monitor(path)
        assert report.gating.name == "mismatch_kl" and report.gating.logged_as == "mismatch_kl"
        got = report.gating.values.to_dict()
        assert sorted(got) == sorted(logged)
        tolerance = 1e-7 if path.name == "runs" else 0  # TensorBoard stores scalars as float32: ≤ 2^-24 relative
        for step, value in logged.items():
            assert got[step] == pytest.approx(value, rel=tolerance, abs=0), (path, step)
    assert read_log(out / "runs").format == "tensorboard" and read_log(out).format == "trainer_state"


def test_opd_results_are_read_as_the_run_logged_them(opd_run):
    out, steps = opd_run
    report = monitor(out)
    assert report.format == "results"
    assert report.gating.values.to_dict() == dict(zip(steps["step"].astype(int), steps["mismatch_kl"]))
    # its verl-named copies are the same statistic: noted, not read twice
    assert "rollout_corr/kl" in report.gating.also_logged_as


def test_verls_own_file_logger_and_the_exact_conversion(opd_run, tmp_path, monkeypatch):
    """The OPD run's verl-named values (`rollout_stats`, in `ROLLOUT_STATS_CONFIG`'s verl mode) through verl's
    own file logger: read in that mode, the shares convert exactly; without a config their mode is unknown."""
    from verl.utils.tracking import FileLogger

    from mismatch.metrics import ROLLOUT_STATS_CONFIG

    _, steps = opd_run
    path = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("project", "experiment")
    verl_names = [c for c in steps.columns if c.startswith("rollout_corr/")]
    for row in steps.to_dict("records"):
        logger.log({name: row[name] for name in verl_names}, step=int(row["step"]))
    logger.finish()
    unknown = monitor(path)
    assert "mode unknown" in unknown.not_comparable["rollout_corr/rollout_is_ratio_fraction_high"][1]
    report = monitor(path, framework_config=ROLLOUT_STATS_CONFIG)
    assert report.format == "jsonl" and report.gating.logged_as == "rollout_corr/kl"
    assert report.gating.values.to_dict() == dict(zip(steps["step"].astype(int), steps["mismatch_kl"]))
    outside = {s.name: s for s in report.others}["mismatch_is_ratio_outside_frac"]
    assert outside.logged_as.startswith("rollout_corr/rollout_is_ratio_fraction_high + ")
    # high + low shares of the same tokens: the check's own share outside [½, 2] (no |log r| > 20 here)
    expected = steps["mismatch_is_ratio_outside_frac"].to_numpy()
    assert outside.values.to_numpy() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_prime_rl_lines_map_its_mismatch_kl_onto_k3(opd_run, tmp_path):
    _, steps = opd_run
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:  # prime-rl's FileMonitor: {"step", "time", **metrics}, several lines per step
        for row in steps.to_dict("records"):
            f.write(json.dumps({"step": int(row["step"]), "time": 0.0, "optim/lr": 1e-3}) + "\n")
            f.write(json.dumps({"step": int(row["step"]), "time": 0.0, "mismatch_kl/all/mean": row["mismatch_k3"],
                                "masked_mismatch_kl/mean": 0.0}) + "\n")
    report = monitor(path)
    assert report.gating.name == "mismatch_k3" and report.gating.framework == "prime-rl"
    assert "staleness" in report.gating.caveat  # no config read: prime-rl's default allows 8 stale steps
    assert report.gating.values.to_dict() == dict(zip(steps["step"].astype(int), steps["mismatch_k3"]))
    assert "masked_mismatch_kl/mean" in report.not_comparable


def _series_log(path, values: list[float], name: str = "mismatch_kl"):
    path.write_text("".join(json.dumps({"step": 10 * (i + 1), name: v}) + "\n" for i, v in enumerate(values)))
    return path


def test_the_trailing_window_is_the_checks_window_statistic_judged_as_the_check_judges_it(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(0)
    values = [LIMIT * (0.5 if s <= 15 else 3.0) * (1 + 0.3 * rng.standard_normal()) for s in range(1, 41)]
    log = tmp_path / "dense.jsonl"
    log.write_text("".join(json.dumps({"step": s, "mismatch_kl": v}) + "\n" for s, v in enumerate(values, 1)))
    report = monitor(log, settings=MonitorSettings(patience=3))
    windows = report.gating.windows
    assert report.gating.window == WINDOW and len(windows) == 40
    rejected = []
    for s in range(1, 41):  # independent: the mean of the logged values in (s − W, s] and scipy's t quantile
        inside = np.array(values[max(0, s - WINDOW):s])
        mean = inside.mean()
        half = stats.t.ppf(0.975, len(inside) - 1) * inside.std(ddof=1) / np.sqrt(len(inside)) if len(inside) > 1 else 0
        row = windows.loc[s]
        assert row["n"] == len(inside) and row["mean"] == pytest.approx(mean, rel=1e-12)
        # the package's t quantiles are tabled to 3 decimals (≥ 2.04 at these df): ≤ 0.0005 / 2.04 of the half-width
        assert (row["high"] - row["low"]) / 2 == pytest.approx(half, rel=2.5e-4, abs=1e-15)
        assert (row["high"] + row["low"]) / 2 == pytest.approx(mean, rel=1e-12)
        rejected.append(mean - half > LIMIT)
    run, expected = 0, None
    for s, r in enumerate(rejected, 1):  # hand count: the first run of 3 consecutive rejected windows
        run = run + 1 if r else 0
        expected = s if expected is None and run >= 3 else expected
    assert 16 < expected <= 16 + WINDOW  # the shift at step 16 shows within a window, not at once
    assert report.status == "crossed" and report.alarm_step == expected
    assert report.gating.crossed_steps == [s for s, r in zip(range(1, 41), rejected) if r]
    summary = report.summary()["gating"]
    assert summary["window"] == WINDOW and summary["last_window"]["decision"] == "reject"
    assert summary["last_window"]["mean"] == pytest.approx(np.mean(values[-WINDOW:]), rel=1e-12)
    # without window limits (a thresholds file written before them) each value is judged alone, with a note
    old = tmp_path / "old.json"
    from mismatch.admission.thresholds import DEFAULT_FILE

    fields = json.loads(DEFAULT_FILE.read_text())
    fields["limits"]["mismatch_kl"] = LIMIT  # the same number, so the two judgements differ only in how
    del fields["window_limits"], fields["window_brackets"]
    old.write_text(json.dumps(fields))
    alone = monitor(log, thresholds=old, settings=MonitorSettings(patience=3))
    assert alone.gating.window is None and any("no window limit" in n for n in alone.notes)
    above = [v > LIMIT for v in values]
    assert alone.gating.crossed_steps == [s for s, a in zip(range(1, 41), above) if a]


@pytest.mark.parametrize("loss", ["pg-rkl-is", "full-rkl", "pg-rkl"])
def test_a_trainers_loss_gets_its_own_limit_where_the_check_uses_one(tmp_path, loss):
    log = tmp_path / "flat.jsonl"
    log.write_text("".join(json.dumps({"step": s, "mismatch_kl": 0.05}) + "\n" for s in range(1, 13)))
    pooled = monitor(log)
    assert pooled.gating.limit == LIMIT and not any("the loss" in n for n in pooled.notes)
    report = monitor(log, loss=loss)
    # the loss's own window limit where its held-out record is at least the pooled one's; pg-rkl has none
    own = THRESHOLDS.own_limit(loss, window=True) if loss in THRESHOLDS.loss_window_limits else None
    assert report.gating.limit == (own["limit"] if own else LIMIT)
    assert any(f"the loss {loss}" in n for n in report.notes)
    assert report.gating.limit_levels == THRESHOLDS.for_loss(loss, window=True)[3] and not pooled.gating.limit_levels
    assert (own is not None) == (report.gating.limit_levels == f"{loss}'s levels alone")
    res = CliRunner().invoke(app, ["monitor", str(log), "--loss", loss, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["gating"]["limit"] == report.gating.limit


def test_an_unknown_loss_is_a_one_line_error(tmp_path):
    log = tmp_path / "flat.jsonl"
    log.write_text(json.dumps({"step": 1, "mismatch_kl": 0.05}) + "\n")
    with pytest.raises(InputError, match="pg-rkl-iss") as err:
        monitor(log, loss="pg-rkl-iss")
    assert "\n" not in str(err.value)
    res = CliRunner().invoke(app, ["monitor", str(log), "--loss", "pg-rkl-iss"])
    assert res.exit_code == 2 and res.output.count("\n") == 1


def test_patience_counts_consecutive_logged_steps_above_the_limit(tmp_path):
    # a log written every 10 steps: each trailing window holds one logged value, judged as it is
    lo, hi = 0.5 * LIMIT, 2 * LIMIT
    log = _series_log(tmp_path / "log.jsonl", [lo, hi, lo, hi, hi, hi, lo])
    # hand count: above at steps 20, 40, 50, 60; the first run of 3 ends at step 60
    assert monitor(log, settings=MonitorSettings(patience=3)).alarm_step == 60
    assert monitor(log, settings=MonitorSettings(patience=1)).alarm_step == 20
    report = monitor(log, settings=MonitorSettings(patience=4))
    assert report.status == "within" and report.gating.longest_run() == 3
    assert report.gating.crossed_steps == [20, 40, 50, 60]
    runner = CliRunner()
    crossed = runner.invoke(app, ["monitor", str(log), "--patience", "3", "--out", str(tmp_path / "m")])
    assert crossed.exit_code == 1 and "CROSSED" in crossed.output
    assert {p.name for p in (tmp_path / "m").iterdir()} == {"monitor.png", "monitor.csv", "monitor.json"}
    summary = json.loads((tmp_path / "m" / "monitor.json").read_text())
    assert summary["alarm_step"] == 60 and summary["gating"]["crossed_steps"] == [20, 40, 50, 60]
    assert runner.invoke(app, ["monitor", str(log), "--patience", "4"]).exit_code == 0


def test_a_rising_trend_below_the_limit_is_flagged_when_it_reaches_the_limit_within_the_run(tmp_path):
    values = [LIMIT * (0.2 + 0.07 * i) for i in range(10)]  # steps 10 … 100, all below the limit (0.83 × it last)
    log = _series_log(tmp_path / "rise.jsonl", values)
    report = monitor(log)
    steps = [10 * (i + 1) for i in range(10)]
    slope, intercept = np.polyfit(steps, values, 1)  # independent: numpy's least squares
    assert report.trend.slope == pytest.approx(slope, rel=1e-9) and report.trend.low > 0
    meets = (LIMIT - intercept) / slope  # the line meets the limit here: step ≈ 124
    assert report.trend.reaches_limit_at == pytest.approx(meets, rel=1e-9)
    assert report.horizon == 190 and report.status == "rising" and report.alarm_step is None  # the span once more
    assert monitor(log, settings=MonitorSettings(total_steps=110)).status == "within"  # ends before it meets it
    assert monitor(log, settings=MonitorSettings(total_steps=int(meets) + 1)).status == "rising"
    runner = CliRunner()
    assert runner.invoke(app, ["monitor", str(log)]).exit_code == 3
    assert runner.invoke(app, ["monitor", str(log), "--total-steps", "110"]).exit_code == 0
    summary = json.loads(runner.invoke(app, ["monitor", str(log), "--json"]).output)
    assert summary["status"] == "rising" and summary["trend"]["points"] == 10
    # the same rise with the sign flipped falls: never flagged; a flat series with noise neither
    assert monitor(_series_log(tmp_path / "fall.jsonl", values[::-1])).status == "within"
    flat = [LIMIT * (0.5 + 0.2 * (-1) ** i) for i in range(10)]
    assert monitor(_series_log(tmp_path / "flat.jsonl", flat)).status == "within"
    with pytest.raises(InputError, match="trend steps must be"):
        monitor(log, settings=MonitorSettings(trend_steps=4))


def test_the_gates_of_a_real_trl_run_beyond_the_limit_cross(pair, tmp_path):
    from scipy import stats

    trainer = trl_trainer(pair, tmp_path / "out", steps=4, rollout="noise:1.0")
    trainer.train()
    trainer.save_state()
    report = monitor(tmp_path / "out", settings=MonitorSettings(patience=2))
    values = report.gating.values.to_numpy()
    assert all(v > LIMIT for v in values)
    # a growing window: one value at step 1 (judged as it is), then t-intervals; t(1) at step 2 is too wide to
    # place 2 values, so the alarm waits for the windows of 3 and 4 values, both wholly above the limit
    for n in (3, 4):
        low = values[:n].mean() - stats.t.ppf(0.975, n - 1) * values[:n].std(ddof=1) / np.sqrt(n)
        assert low > LIMIT and report.gating.windows.loc[n, "decision"] == "fail"
    assert report.gating.windows.loc[1, "decision"] == "fail"
    assert report.status == "crossed" and report.alarm_step == 4


@pytest.mark.parametrize("content, message", [
    ('{"step": 1, "loss": 0.5}\n', "no statistic a calibrated limit applies to"),
    ('{"step": 1, "train/token_mult_prob_error": 1.02}\n', "NeMo RL"),
    ('{"step": 1, "mismatch_kl": 0.1}\nnot json\n', ":2: not a JSON object"),
    ('{"mismatch_kl": 0.1}\n', "no metric logged with a step"),
])
def test_bad_logs_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "log.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message) as err:
        monitor(path)
    assert "\n" not in str(err.value)
    res = CliRunner().invoke(app, ["monitor", str(path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1


@pytest.mark.parametrize("name", ["missing.jsonl", "log.bin", "empty_dir"])
def test_unreadable_or_unknown_paths_are_one_line_errors(tmp_path, name):
    path = tmp_path / name
    if name == "log.bin":
        path.write_bytes(b"\x00\x01")
    if name == "empty_dir":
        path.mkdir()
    with pytest.raises(InputError) as err:
        monitor(path)
    assert "\n" not in str(err.value)


def test_a_bad_output_folder_fails_before_the_log_is_read(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputError, match="is a file"):
        monitor(tmp_path / "never-read.jsonl", out_dir=blocker)


def test_several_opd_runs_need_a_run(tmp_path, opd_run):
    out, steps = opd_run
    rows = mismatch.read_results(out)
    other = rows.assign(run_id=rows["run_id"] + "-other")
    both = pd.concat([rows, other])
    path = tmp_path / "both.parquet"
    both.to_parquet(path)
    with pytest.raises(InputError, match="--run"):
        monitor(path)
    chosen = monitor(path, run=rows["run_id"].iloc[0])
    assert chosen.gating.values.to_dict() == dict(zip(steps["step"].astype(int), steps["mismatch_kl"]))
