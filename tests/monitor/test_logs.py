"""`mismatch monitor` on logs as the frameworks' own writers leave them: non-finite statistics (verl's file
logger, which writes them as `null` through orjson; transformers' `trainer_state.json`, which writes `NaN`;
TensorBoard, which stores the float) count as crossing and are counted; a live log's half-written last
line is skipped with a note, any other malformed line stays an error."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from mismatch.admission.thresholds import load_thresholds
from mismatch.cli.app import app
from mismatch.errors import InputError
from mismatch.monitor import MonitorSettings, monitor
from mismatch.monitor.logs import read_log

LIMIT = load_thresholds().limits["mismatch_kl"]
INF, NAN = float("inf"), float("nan")


def _verl_file_log(path, rows: list[dict], monkeypatch) -> None:
    """`rows` (one metrics dict per step, from step 1) through verl 0.9.1's own `FileLogger`
    (verl/utils/tracking.py:529-548: `orjson.dumps({"step", "data"}) + "\\n"` per call)."""
    from verl.utils.tracking import FileLogger

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("project", "experiment")
    for step, row in enumerate(rows, 1):
        logger.log(row, step=step)
    logger.finish()


def test_verls_infinite_kl_on_three_steps_crosses_and_is_counted(tmp_path, monkeypatch):
    """rollout_corr/kl = Infinity on steps 2–4 (before: WITHIN, exit 0, "0/2 steps above" of 5 logged)."""
    path = tmp_path / "verl.jsonl"
    kl = [0.5 * LIMIT, INF, INF, INF, 0.5 * LIMIT]
    _verl_file_log(path, [{"rollout_corr/kl": v, "rollout_corr/k3_kl": 0.01} for v in kl], monkeypatch)
    assert '"rollout_corr/kl":null' in path.read_text()  # orjson writes a non-finite float as null
    report = monitor(path, settings=MonitorSettings(patience=3))
    gate = report.gating
    assert gate.logged_as == "rollout_corr/kl" and list(gate.values.index) == [1, 2, 3, 4, 5]
    # every trailing window that holds a non-finite value is above: steps 2–5 (step 5's window holds 2–4)
    assert gate.nonfinite_steps == [2, 3, 4] and gate.crossed_steps == [2, 3, 4, 5]
    assert report.status == "crossed" and report.alarm_step == 4
    res = CliRunner().invoke(app, ["monitor", str(path)])
    assert res.exit_code == 1, res.output
    assert "CROSSED" in res.output and "4/5 (3 not finite)" in res.output
    summary = json.loads(CliRunner().invoke(app, ["monitor", str(path), "--json"]).output,
                         parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert summary["gating"]["nonfinite_steps"] == [2, 3, 4] and summary["gating"]["crossed_steps"] == [2, 3, 4, 5]
    assert summary["gating"]["last_window"]["mean"] == "nan"  # strict JSON: the window holds infinities


def test_nan_among_values_is_kept_as_a_crossing_step(tmp_path):
    """A NaN in transformers' own `trainer_state.json` (TrainerState.save_to_json: json.dumps writes NaN): the
    step is kept and makes every window holding it above the limit (before: the step silently vanished)."""
    from transformers.trainer_callback import TrainerState

    lo, hi = 0.5 * LIMIT, 2 * LIMIT
    state = TrainerState(log_history=[{"step": s, "mismatch_kl": v, "loss": 1.0}
                                      for s, v in zip(range(1, 7), [lo, hi, NAN, hi, hi, lo])])
    state.save_to_json(tmp_path / "trainer_state.json")
    assert "NaN" in (tmp_path / "trainer_state.json").read_text()
    report = monitor(tmp_path, settings=MonitorSettings(patience=3))
    assert list(report.gating.values.index) == [1, 2, 3, 4, 5, 6] and report.steps == 6
    # step 2's window (lo, hi) is uncertain at t(1); from step 3 on every window holds the NaN: above
    assert report.gating.nonfinite_steps == [3] and report.gating.crossed_steps == [3, 4, 5, 6]
    assert report.alarm_step == 5 and report.gating.longest_run() == 4


def test_tensorboard_keeps_the_infinity_verl_logged(tmp_path):
    """verl's `_TensorboardAdapter.log` is `writer.add_scalar(key, value, step)` per key
    (verl/utils/tracking.py:562-564): TensorBoard stores inf, and the monitor reads it."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step, v in enumerate([0.01, INF, -INF, NAN, 0.01], 1):
        writer.add_scalar("rollout_corr/kl", v, step)
    writer.close()
    gate = monitor(tmp_path / "tb", settings=MonitorSettings(patience=1)).gating
    assert gate.nonfinite_steps == [2, 3, 4] and gate.crossed_steps == [2, 3, 4, 5]  # 5's window holds them
    assert gate.values[2] == INF and gate.values[3] == -INF and math.isnan(gate.values[4])


def test_a_half_written_last_line_of_a_live_log_is_skipped_with_a_note(tmp_path, monkeypatch):
    """verl's file logger mid-write (before: exit 2, ':4: not a JSON object')."""
    path = tmp_path / "live.jsonl"
    _verl_file_log(path, [{"rollout_corr/kl": 0.01}] * 3, monkeypatch)
    with path.open("ab") as f:
        f.write(b'{"step":4,"data":{"rollout_corr/kl":0.0')
    log = read_log(path)
    assert list(log.values.index) == [1, 2, 3]
    assert len(log.notes) == 1 and "line 4" in log.notes[0] and "half-written" in log.notes[0]
    report = monitor(path)
    assert report.notes == log.notes and report.status == "within"
    res = CliRunner().invoke(app, ["monitor", str(path)])
    assert res.exit_code == 0 and "half-written" in res.output


def test_prime_rls_live_metrics_file_alike(tmp_path):
    """prime-rl's FileMonitor appends `json.dumps({"step", "time", **metrics}) + "\\n"` line-buffered
    (monitors/file.py:30, 40-41, prime-rl 559b447) so a dashboard can tail it: a cut last line is skipped."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "time": 0.0, "mismatch_kl/all/mean": 0.01}) + "\n" for s in (1, 2)]
    path.write_text("".join(lines) + lines[0][:17])
    report = monitor(path)
    assert list(report.gating.values.index) == [1, 2] and "line 3" in report.notes[0]


@pytest.mark.parametrize("content, message", [
    ('{"step": 1, "mismatch_kl": 0.1}\n{"step": 2, "mism\n{"step": 3, "mismatch_kl": 0.1}\n', ":2: not a JSON object"),
    ('{"step": 1, "mismatch_kl": 0.1}\nnot json\n', ":2: not a JSON object"),  # complete (ends in a newline)
])
def test_a_malformed_line_that_is_not_a_cut_last_line_stays_an_error(tmp_path, content, message):
    path = tmp_path / "log.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        monitor(path)
    res = CliRunner().invoke(app, ["monitor", str(path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1


def test_the_figure_marks_each_non_finite_step(tmp_path, monkeypatch):
    """matplotlib draws nothing for ±inf or NaN, so the plot would show a gap where the loudest signal is: each
    non-finite step of a panel gets its own band, centred on the step, and a legend entry counts them."""
    import mismatch.report.monitor as figure

    path = tmp_path / "verl.jsonl"
    _verl_file_log(path, [{"rollout_corr/kl": v} for v in [0.5 * LIMIT, INF, NAN, 0.4 * LIMIT]], monkeypatch)
    report = monitor(path, settings=MonitorSettings(patience=3))
    drawn = {}
    monkeypatch.setattr(figure, "save_figure", lambda fig, where: drawn.setdefault("fig", fig) and where)
    figure.plot_monitor(report, tmp_path / "monitor.png")
    ax = drawn["fig"].axes[0]
    bands = sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches
                   if p.get_facecolor()[:3] == pytest.approx((0.580, 0.404, 0.741), abs=1e-3))  # tab:purple
    assert bands == [(1.5, 2.5), (2.5, 3.5)]  # steps 2 (inf) and 3 (NaN), nothing else
    assert any(text.get_text().startswith("not finite (2 steps") for text in ax.get_legend().get_texts())
