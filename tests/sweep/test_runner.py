"""Running a study: every task into one dataset, a ledger of done/failed tasks, resume that skips
what is done, failures recorded without stopping, and kill -9 + resume ending with the same tables."""

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from mismatch.opd.verdict import verdict_table
from mismatch.results import read_results, summaries
from mismatch.sweep import load_study, read_ledger, run_study, task_id
from mismatch.opd import OPDConfig
from mismatch.sweep.estimate import estimates, longest_first

STUDY = """
name = "tiny"

[static]
models = ["tiny-llama"]
texts = ["hello world, again", "the quick brown fox"]
perturb = ["fp8-e4m3:channel", "int4:group128"]
layers = {layers}

[dynamic]
pairs = ["reverse-qwen3"]
rollouts = ["fp8-e4m3", "stale:1"]
seeds = [0]

[dynamic.settings]
steps = 2
batch_size = 4
eval_every = 2
eval_prompts = 8
"""
TIMING = {"rollout_s", "teacher_s", "update_s", "metrics_s", "refresh_s", "wall_s", "tokens_per_s"}


def _study(tmp_path, layers='["linear"]'):
    path = tmp_path / "tiny.toml"
    path.write_text(STUDY.format(layers=layers))
    return load_study(path)


def _numbers(out) -> pd.DataFrame:
    """Every row that does not measure time, in a canonical order."""
    rows = read_results(out)
    rows = rows[~rows["metric"].isin(TIMING)]
    key = ["kind", "run_id", "level", "step", "seq", "pos", "token", "layer", "index", "metric"]
    return rows[key + ["value"]].sort_values(key, na_position="first").reset_index(drop=True)


@pytest.mark.slow
def test_a_sweep_runs_every_task_once_and_resume_skips_them(tmp_path):
    study = _study(tmp_path)
    out = tmp_path / "out"
    report = run_study(study, out)
    tasks = [*study.plan.probes, *study.plan.opd]
    assert len(tasks) == 4 and report.failed == {} and report.ran == tuple(task_id(t) for t in tasks)
    assert {tid: r["status"] for tid, r in read_ledger(out).items()} == {task_id(t): "done" for t in tasks}
    rows = read_results(out)
    assert summaries(rows[rows.kind == "probe"])["perturb"].tolist() == ["fp8-e4m3:channel", "int4:group128"]
    table = verdict_table(rows[rows.kind == "opd"]).set_index("rollout")
    assert list(table.index) == ["clean", "fp8-e4m3", "stale:1"]
    assert (table.loc[["fp8-e4m3", "stale:1"], "baseline"] == table.loc["clean", "run_id"]).all()
    parts = sorted(p.name for p in out.glob("*.parquet"))
    # estimates fitted from this sweep's own ledger and rows fall within its measured task times
    seconds = {tid: r["seconds"] for tid, r in read_ledger(out).items()}
    opd_seconds = [seconds[task_id(t)] for t in study.plan.opd]
    for task, est in zip(tasks, estimates(tasks, out=out)):
        if task in study.plan.opd:
            assert min(opd_seconds) * 0.999 <= est <= max(opd_seconds) * 1.001
        else:
            assert est == pytest.approx(seconds[task_id(task)], rel=1e-6)  # one probe group per reference
    # the pool's order: longest estimate first, then plan order; by the estimates just checked
    order = longest_first(tasks, out=out)
    secs = estimates(tasks, out=out)
    assert sorted(order) == list(range(len(tasks)))
    assert all(secs[a] > secs[b] or (secs[a] == secs[b] and a < b) for a, b in zip(order, order[1:]))
    again = run_study(study, out, resume=True)
    assert again.ran == () and len(again.skipped) == 4
    assert sorted(p.name for p in out.glob("*.parquet")) == parts  # nothing rewritten


@pytest.mark.slow
def test_a_failed_task_is_recorded_and_the_sweep_goes_on(tmp_path):
    study = _study(tmp_path, layers='["linear", "blocks.99"]')  # the second scope selects nothing
    out = tmp_path / "out"
    report = run_study(study, out)
    bad = task_id(study.plan.probes[1])
    assert list(report.failed) == [bad] and "selects no linear module" in report.failed[bad]
    ledger = read_ledger(out)
    assert ledger[bad]["status"] == "failed" and ledger[bad]["traceback"]
    assert sum(r["status"] == "done" for r in ledger.values()) == 4  # the other probe group and 3 OPD runs
    assert run_study(study, out, resume=True).ran == ()  # failed tasks stay skipped …
    assert run_study(study, out, resume=True, retry_failed=True).ran == (bad,)  # … unless retried


@pytest.mark.slow
def test_kill_9_mid_sweep_then_resume_gives_the_tables_of_an_uninterrupted_sweep(tmp_path):
    study = _study(tmp_path)
    run_study(study, tmp_path / "whole")
    out = tmp_path / "killed"
    code = (f"from mismatch.sweep import load_study, run_study; "
            f"run_study(load_study({str(study.path)!r}), {str(out)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 120
    while len(read_ledger(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(read_ledger(out))
    assert 2 <= done < 4, f"killed after {done} of 4 tasks"
    read_results(out)  # whatever was left is readable (a temporary file, if any, is never read)
    run_study(study, out, resume=True)
    pd.testing.assert_frame_equal(_numbers(out), _numbers(tmp_path / "whole"))


def test_tasks_never_measured_go_first_then_the_longest():
    short, long_ = (OPDConfig(pair="sort-gpt2", steps=n, batch_size=64) for n in (10, 80))
    unknown = OPDConfig(pair="a-pair-never-measured", steps=1)
    secs = estimates([short, long_, unknown])
    assert secs[1] > secs[0] > 0 and secs[2] != secs[2]  # NaN: no cost measured for that pair
    assert longest_first([short, long_, unknown, short]) == [2, 1, 0, 3]
