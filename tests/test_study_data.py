"""`experiments/study_data/save.py`: a sweep's finished runs copied back into the committed data folders, each file
once across them, and nothing of a run stopped mid-way."""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.results import run_id
from mismatch.sweep.tasks import write_record

HERE = Path(__file__).resolve().parents[1] / "experiments" / "study_data"


@pytest.fixture(scope="module")
def save():
    sys.path.insert(0, str(HERE))  # save.py imports compact.py beside it, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("study_data_save", HERE / "save.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(HERE))


def _run(results: Path, seed: int, status: str | None, chunks: int = 2) -> str:
    """A run's parts as a sweep names them and, unless `status` is None (stopped before its record), its record."""
    config = OPDConfig(pair="smollm2-concise", rollout="noise:0.1", seed=seed)
    rid = run_id("opd", run_columns(config))
    for chunk in range(chunks):
        (results / f"2026120{seed}T0000000-opd-{rid}-w{seed}-{chunk:05d}.parquet").write_bytes(b"part %d" % chunk)
    if status is not None:
        write_record(results, f"task{seed}", {"status": status, "task": f"opd run {seed}",
                                              "config": dataclasses.asdict(config)})
    return rid


def test_only_finished_runs_not_held_elsewhere_are_copied(save, tmp_path):
    results, target, besides = tmp_path / "results", tmp_path / "target", tmp_path / "ladder"
    results.mkdir()
    done = _run(results, 0, "done")
    elsewhere = _run(results, 1, "done")
    _run(results, 2, None)  # stopped mid-way: parts, no record
    _run(results, 3, "failed")
    (besides / "_sweep").mkdir(parents=True)
    for part in results.glob(f"*-{elsewhere}-*.parquet"):
        (besides / part.name).write_bytes(part.read_bytes())
    (besides / "_sweep" / "task1.json").write_text((results / "_sweep" / "task1.json").read_text())

    assert save.save(results, target, [besides]) == (2, 1)
    assert sorted(p.name.split("-")[2] for p in target.glob("*.parquet")) == [done, done]
    assert [p.name for p in (target / "_sweep").glob("*.json")] == ["task0.json"]
    assert save.save(results, target, [besides]) == (0, 0)  # again: everything is held already


def test_a_folder_without_a_ledger_is_one_line_and_exit_1(save, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        save.main([str(tmp_path / "nope"), str(tmp_path / "target")])
    assert "no sweep ledger" in str(stop.value) and not (tmp_path / "target").exists()
