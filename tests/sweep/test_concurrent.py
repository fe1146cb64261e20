"""Writers that share a results directory lose nothing: two processes writing the same run (the per-run
lock of `ResultsWriter`), two sweeps started on one folder (the second refused in one line), and a sweep
whose disk fills up (stopped in one line; the task is retried by `--resume`, not skipped)."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from mismatch.errors import WriteError
from mismatch.results import ROW_KEY, read_results
from mismatch.sweep import read_ledger, run_study, task_id
from mismatch.sweep.runner import DiskFullError, SweepBusyError, sweep_lock
from tests.sweep.test_runner import _numbers, _study

# One run written in FLUSHES parts, SLEEP s apart, then finished: the shape of an OPD run's flushes.
WRITER = textwrap.dedent("""
    import sys, time
    import pandas as pd
    from mismatch.results import ResultsWriter, tidy
    out, name, flushes, sleep = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    config = {"pair": "p", "rollout": "none", "seed": 0}
    print("ready", flush=True)
    with ResultsWriter(out) as w:
        for step in range(flushes):
            rows = pd.DataFrame({"step": [step, step], "metric": ["loss", "heldout_rkl"],
                                 "value": [float(step), 2.0 * step]}).assign(level="step")
            w.write(tidy(rows, kind="opd", config=config, stamp={"timestamp": name}))
            time.sleep(sleep)
        w.finish("opd", tidy(rows, kind="opd", config=config)["run_id"].iloc[0])
    print(name, "done")
""")


def _writer(out: Path, name: str, flushes: int, sleep: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(out), name, str(flushes), str(sleep)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_processes_writing_one_run_leave_every_row_of_it(tmp_path):
    """Process A writes 4 flushes 2 s apart; B, ready to write while A is still writing, writes the same
    run at once. Unlocked, B's `finish` removed A's first parts as "an earlier copy" and A's `finish` then
    removed all of B's: the run kept A's last two steps only. Locked, B waits for A to finish, then writes
    its own complete copy and replaces A's: every step, each once."""
    out = tmp_path / "out"
    a = _writer(out, "A", 4, 2.0)
    assert a.stdout.readline().strip() == "ready"
    b = _writer(out, "B", 4, 0.0)
    assert b.stdout.readline().strip() == "ready"
    assert a.poll() is None and len(list(out.glob("*.parquet"))) < 4, "A ended before B was ready: no overlap"
    for p in (a, b):
        _, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-2000:]
    rows = read_results(out)
    assert sorted(rows["step"].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]  # 4 steps × 2 metrics, none twice
    assert set(rows["timestamp"]) == {"B"}  # B finished last: its copy replaced A's whole
    raw = pd.concat([pd.read_parquet(p) for p in out.glob("*.parquet")])
    assert not raw.duplicated(subset=list(ROW_KEY)).any()


def test_a_second_sweep_on_a_folder_being_swept_is_refused_in_one_line(tmp_path):
    """The lock a sweep holds is an OS lock on `DIR/_sweep/.lock`: held by another process (here a child
    that holds it, as a running sweep does), a second sweep is refused before it plans anything."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from mismatch.sweep.runner import sweep_lock
        lock = sweep_lock(Path({str(out)!r}))
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        study = _study(tmp_path)
        with pytest.raises(SweepBusyError, match="being written by another sweep") as info:
            run_study(study, out)
        assert "\n" not in str(info.value)
        assert not list(out.glob("*.parquet")) and read_ledger(out) == {}  # nothing ran
    finally:
        holder.communicate("", timeout=30)
    sweep_lock(out).release()  # the holder's end released it


@pytest.mark.slow
def test_two_sweeps_started_on_one_folder_lose_nothing(tmp_path):
    """The issue's case, with real `mismatch sweep` processes: the second one exits 2 with one line, the first
    ends with every row an uninterrupted sweep has; `--resume` then skips every task as done. The first sweep
    is stopped (SIGSTOP) once it has written its first part, so it holds the lock, whatever the CPU's speed,
    while the second starts; it is continued (SIGCONT) after the second has exited."""
    study = _study(tmp_path, steps=24, eval_every=8)
    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).with_name("mismatch")), "sweep", str(study.path), "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("*.parquet")) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    first.send_signal(signal.SIGSTOP)  # past its lock: a part is written only by a sweep that holds it
    try:
        assert first.poll() is None, "the first sweep ended before its first part was seen: make it longer"
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-2000:]
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [f"error: {out} is being written by another sweep: wait for it "
                                                  "to end (then `--resume` continues), or write to another --out"]
    run_study(study, tmp_path / "alone")
    pd.testing.assert_frame_equal(_numbers(out), _numbers(tmp_path / "alone"))
    again = run_study(study, out, resume=True)
    assert again.ran == () and len(again.skipped) == len(read_ledger(out))


@pytest.mark.slow
def test_a_full_disk_stops_the_sweep_and_resume_runs_that_task_again(tmp_path, monkeypatch):
    """The disk fills while the second task writes (its write raises ENOSPC, as pyarrow does on a full disk):
    the sweep stops with one line naming the file, the ledger marks the task `retry`, and `--resume` (without
    `--retry-failed`) runs it again once there is space: the rows equal an uninterrupted sweep's."""
    import mismatch.results as results

    study = _study(tmp_path)
    out = tmp_path / "out"
    real, calls = results.write_frame, []

    def fills_up(frame, path):
        calls.append(path)
        if len(calls) == 2:  # the second part: the first task's rows are on disk
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real(frame, path)

    monkeypatch.setattr(results, "write_frame", fills_up)
    with pytest.raises(DiskFullError, match="No space left on device") as info:
        run_study(study, out)
    assert "rerun with --resume" in str(info.value) and "\n" not in str(info.value)
    ledger = read_ledger(out)
    second = task_id(study.plan.probes[0])  # a probe group writes one part per candidate: its second failed
    assert ledger[second]["status"] == "failed" and ledger[second]["retry"] is True
    monkeypatch.setattr(results, "write_frame", real)
    resumed = run_study(study, out, resume=True)
    assert second in resumed.ran and resumed.skipped_failed == ()
    run_study(study, tmp_path / "alone")
    pd.testing.assert_frame_equal(_numbers(out), _numbers(tmp_path / "alone"))


def test_a_write_refused_by_the_system_names_the_output_not_its_temporary_file(tmp_path):
    from mismatch.files import atomic_write

    target = tmp_path / "table.parquet"
    target.write_text("before")

    def full(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    with pytest.raises(WriteError) as info:
        atomic_write(target, full)
    assert str(info.value) == f"cannot write {target}: No space left on device" and info.value.disk_full
    assert target.read_text() == "before" and [p.name for p in tmp_path.iterdir()] == ["table.parquet"]
