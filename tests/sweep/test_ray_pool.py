"""Sweeps on Ray: a local Ray instance with 2 CPUs gives exactly the rows of the serial sweep (at
equal torch thread counts), and a worker killed mid-run has its task retried once, no row twice."""

import os
import signal

import pandas as pd
import pytest
import ray

from mismatch.results import ROW_KEY, ResultsWriter
from mismatch.sweep import execute, read_ledger, run_study, task_id, task_label
from mismatch.sweep.ray_pool import run_on_ray

from .test_runner import _numbers, _study


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance with 2 CPUs for the module (a sweep uses one already started)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The tiny study run serially at 1 torch thread: (study, its results directory, its report)."""
    folder = tmp_path_factory.mktemp("serial")
    study = _study(folder)
    return study, folder / "out", run_study(study, folder / "out")


@pytest.mark.slow
def test_a_sweep_on_two_ray_workers_gives_exactly_the_rows_of_the_serial_sweep(tmp_path, local_ray, serial):
    study, serial_out, serial_report = serial
    on_ray = run_study(study, tmp_path / "ray", workers=2)
    assert on_ray.ran == serial_report.ran and on_ray.failed == serial_report.failed == {}
    pd.testing.assert_frame_equal(_numbers(tmp_path / "ray"), _numbers(serial_out))
    ledger = read_ledger(tmp_path / "ray")
    assert {r["status"] for r in ledger.values()} == {"done"} and {r["threads"] for r in ledger.values()} == {1}
    assert os.getpid() not in {r["pid"] for r in ledger.values()}  # every task ran in a Ray worker


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_retried_once_without_duplicate_rows(tmp_path, local_ray, serial):
    study, serial_out, _ = serial
    tasks = list(study.plan.opd)
    target, marker = tasks[1], tmp_path / "killed-once"

    def die_after_first_part(task, out, threads):
        """The target's first attempt: SIGKILL its own worker right after its first part is on disk."""
        if task == target and not marker.exists():
            marker.write_text(str(os.getpid()))
            write = ResultsWriter.write

            def write_then_die(self, rows):
                write(self, rows)
                os.kill(os.getpid(), signal.SIGKILL)

            ResultsWriter.write = write_then_die
        return execute(task, out, threads)

    records = run_on_ray(tasks, tmp_path / "ray", workers=2, threads=1, execute_fn=die_after_first_part)
    assert marker.exists() and [r["status"] for r in records] == ["done"] * len(tasks)
    assert records[1]["pid"] != int(marker.read_text())  # the killed worker's task ended in another process
    raw = pd.concat([pd.read_parquet(p) for p in (tmp_path / "ray").glob("*.parquet")], ignore_index=True)
    assert not raw.duplicated(subset=list(ROW_KEY)).any()  # the dead attempt's part is gone
    serial_opd = _numbers(serial_out)
    serial_opd = serial_opd[serial_opd["kind"] == "opd"].reset_index(drop=True)
    pd.testing.assert_frame_equal(_numbers(tmp_path / "ray"), serial_opd)
    assert set(read_ledger(tmp_path / "ray")) == {task_id(t) for t in tasks}


@pytest.mark.slow
def test_refill_is_asked_when_a_worker_would_go_idle_and_what_it_returns_runs(tmp_path, local_ray, serial):
    """`refill` (how `--decide` hands out a judging group's next look): asked before the first task when nothing is
    waiting, then whenever a task ends with none waiting; what it returns runs, its records after the others'."""
    study, _, _ = serial
    tasks = list(study.plan.opd)
    first, later = tasks[:1], tasks[1:3]
    asked = []

    def refill():
        asked.append(len(asked))
        return later if len(asked) == 1 else []

    def record(task, out, threads):
        return {"status": "done", "task": task_label(task)}

    records = run_on_ray(first, tmp_path / "ray", workers=2, threads=1, execute_fn=record, refill=refill)
    assert [r["task"] for r in records] == [task_label(t) for t in first + later]
    # asked once the first task is out and the second worker idle (the two later tasks); not while the second
    # of them waits; then with nothing waiting after each of the last two ends (nothing more)
    assert len(asked) == 3
    asked.clear()
    nothing_first = run_on_ray([], tmp_path / "ray2", workers=2, threads=1, execute_fn=record, refill=refill)
    assert [r["task"] for r in nothing_first] == [task_label(t) for t in later]  # asked before any task ran
