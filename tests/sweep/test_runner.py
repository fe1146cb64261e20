"""Running a study: every task into one dataset, a ledger of done/failed tasks, resume that skips
what is done, failures recorded without stopping, and kill -9 + resume ending with the same tables."""

import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mismatch.analysis.twins import verdict_table
from mismatch.opd.runs import run_columns
from mismatch.results import ROW_KEY, read_results, run_id, summaries
from mismatch.sweep import load_study, read_ledger, run_study, still_to_run, task_id
from mismatch.sweep.tasks import LEDGER, write_record
from mismatch.opd import OPDConfig
import mismatch
from mismatch.pairs.catalog import member_spec
from mismatch.rollout.cost import rollout_cost
from mismatch.sweep.estimate import estimates, longest_first, measured_seconds

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


def _study(tmp_path, layers='["linear"]', **settings):
    """The tiny study, with `settings` (steps, batch_size, …, and `pairs`) replacing its own."""
    text = STUDY.format(layers=layers)
    for key, value in settings.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {json.dumps(value)}", text)
    path = tmp_path / "tiny.toml"
    path.write_text(text)
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
    # every OPD row carries its run's cost factors, the real student's analytic cost (the report reads them)
    student = mismatch.load(member_spec(f"{study.plan.opd[0].pair}:student")).model
    for config in study.plan.opd:
        mine = rows[rows.run_id == run_id("opd", run_columns(config))]
        want = rollout_cost(student, config.rollout_spec.perturbation_spec, config.layers)
        got = mine[["cost_reference_bits", "cost_weight_bytes", "cost_matmul"]].drop_duplicates()
        assert len(got) == 1 and tuple(got.iloc[0]) == pytest.approx((want.reference_bits, want.weight_bytes,
                                                                         want.matmul_cost))
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
    turn = [sum(1 for t in tasks[:i] if getattr(t, "seed", None) == getattr(task, "seed", None)
                and getattr(t, "pair", None) == getattr(task, "pair", None)) if hasattr(task, "pair") else 0
            for i, task in enumerate(tasks)]  # equal estimates: round-robin over (pair, seed), then plan order
    assert all(secs[a] > secs[b] or (secs[a] == secs[b] and (turn[a], a) < (turn[b], b)) for a, b in zip(order, order[1:]))
    again = run_study(study, out, resume=True)
    assert again.ran == () and len(again.skipped) == 4
    assert sorted(p.name for p in out.glob("*.parquet")) == parts  # nothing rewritten
    # what `--resume --dry-run` lists: nothing now; a task whose record is gone (or failed) again
    assert still_to_run(study, out).plan.opd == () and still_to_run(study, out).plan.probes == ()
    assert measured_seconds(tasks, out) == (len(tasks), pytest.approx(sum(seconds.values()), rel=1e-12))
    last = study.plan.opd[-1]
    record = read_ledger(out)[task_id(last)]
    write_record(out, task_id(last), {**record, "status": "failed"})
    assert still_to_run(study, out).plan.opd == () and still_to_run(study, out, retry_failed=True).plan.opd == (last,)
    # a failed task took time but is not done: it counts in neither
    assert measured_seconds(tasks, out) == (len(tasks) - 1, pytest.approx(sum(seconds.values()) - record["seconds"]))
    (out / LEDGER / f"{task_id(last)}.json").unlink()
    assert still_to_run(study, out).plan.opd == (last,)
    assert run_study(study, out, resume=True).ran == (task_id(last),)


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


def _kill_mid_task(cmd, out, study, timeout=240):
    """Start `cmd` in its own process group and SIGKILL the whole group once an OPD task has written a
    part but not finished (no ledger record): a half-written task, not a task boundary."""
    runs = {run_id("opd", run_columns(c)): task_id(c) for c in study.plan.opd}
    proc = subprocess.Popen(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    half = set()
    while not half and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        ledger = read_ledger(out)
        half = {rid for rid, tid in runs.items() if tid not in ledger and list(out.glob(f"*-opd-{rid}-*.parquet"))}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert half, "no task was caught half-written"
    return half


MEASURED = ["step_wall", "rollout_share", "cheapest"]  # the cost frontier's wall-clock columns: timings, not results


def _tables(out, folder):
    """The study's report tables (CSV) written from `out` into `folder`, but for measured times."""
    from mismatch.report import write_reports

    write_reports(read_results(out), folder)
    tables = {p.name: pd.read_csv(p) for p in sorted(folder.glob("*.csv"))}
    assert {"tolerance_levels.csv", "cost_frontier.csv"} <= set(tables), sorted(tables)
    tables |= {p.name: pd.DataFrame({"text": [p.read_text()]}) for p in folder.glob("admission*.md")}
    return {name: t.drop(columns=[c for c in MEASURED if c in t]).to_csv(index=False) for name, t in tables.items()}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["serial", "ray"])
def test_kill_9_mid_task_then_resume_gives_the_rows_and_tables_of_an_uninterrupted_serial_sweep(tmp_path, workers):
    """A study is a function of its file: serially or on 2 Ray workers, killed with SIGKILL while a task
    is half-written and resumed, every row and every report table is bit-identical to an uninterrupted
    serial sweep (each task runs at the study's torch thread count, 1, while this process runs at its
    own, 2 on these machines). sort-gpt2 at 64 prompts a step: large enough that torch splits its sums
    over threads, so a task at another thread count gives other rows."""
    study = _study(tmp_path, pairs=["sort-gpt2"], steps=6, batch_size=64, eval_prompts=64)
    run_study(study, tmp_path / "whole")
    out = tmp_path / "killed"
    cmd = [str(Path(sys.executable).with_name("mismatch")), "sweep", str(study.path), "--out", str(out), *workers]
    _kill_mid_task(cmd, out, study)
    read_results(out)  # whatever was left is readable (a temporary file, if any, is never read)
    done = subprocess.run([*cmd, "--resume"], env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    raw = pd.concat([pd.read_parquet(p) for p in out.glob("*.parquet")], ignore_index=True)
    assert not raw.duplicated(subset=list(ROW_KEY)).any()  # the half-written attempt's rows are gone, none twice
    pd.testing.assert_frame_equal(_numbers(out), _numbers(tmp_path / "whole"))
    assert {r["threads"] for r in read_ledger(out).values()} == {1}
    assert _tables(out, tmp_path / "rep_killed") == _tables(tmp_path / "whole", tmp_path / "rep_whole")


def test_tasks_never_measured_go_first_then_the_longest():
    short, long_ = (OPDConfig(pair="sort-gpt2", steps=n, batch_size=64) for n in (10, 80))
    unknown = OPDConfig(pair="a-pair-never-measured", steps=1)
    secs = estimates([short, long_, unknown])
    assert secs[1] > secs[0] > 0 and secs[2] != secs[2]  # NaN: no cost measured for that pair
    assert longest_first([short, long_, unknown, short]) == [2, 1, 0, 3]
    # equal estimates: one run of each seed before the second of any (twins share step 0's evaluation)
    twins = [dataclasses.replace(short, seed=s, rollout=r) for s in (0, 1) for r in ("none", "fp8-e4m3")]
    assert longest_first(twins) == [0, 2, 1, 3]


def test_estimates_know_the_response_cap(tmp_path):
    """Runs of one pair at two response caps get a coefficient each (a step's cost grows with the responses it
    samples): fitted from a ledger of finished tasks, each cap's estimate is its own runs' measured seconds; a cap
    never measured falls back to the pair's median over every run."""
    from mismatch.sweep.estimate import estimate_seconds, fit_costs

    configs = {cap: OPDConfig(pair="sort-gpt2", steps=2, batch_size=4, eval_every=2, eval_prompts=8, max_new_tokens=cap)
               for cap in (4, 16)}
    wall = {4: 3.0, 16: 12.0}  # the runs' own per-step seconds (train), and their ledger seconds (train + evals)
    ledger = {4: 5.0, 16: 20.0}
    rows = []
    for cap, config in configs.items():
        rid = run_id("opd", run_columns(config))
        rows.append({"kind": "opd", "run_id": rid, "metric": "wall_s", "value": wall[cap]})
        write_record(tmp_path, task_id(config), {"status": "done", "config": dataclasses.asdict(config),
                                                  "seconds": ledger[cap], "threads": 1})
    pd.DataFrame(rows).to_parquet(tmp_path / "part-0.parquet")
    costs = fit_costs(tmp_path)
    for cap, config in configs.items():
        assert estimate_seconds(config, costs) == pytest.approx(ledger[cap])
    other = dataclasses.replace(configs[4], max_new_tokens=64)
    both = [(wall[c] / 8, (ledger[c] - wall[c]) / (2 * 8)) for c in (4, 16)]
    want = 8 * statistics.median(t for t, _ in both) + 2 * 8 * statistics.median(e for _, e in both)
    assert estimate_seconds(other, costs) == pytest.approx(want)
