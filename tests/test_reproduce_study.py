"""`make reproduce-study` is timed in parts (`experiments/reproduce_study/`): timing.py's accounting of a part's
wall time and tasks, and the committed `timing.json` against the table its README quotes."""

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "experiments" / "reproduce_study"


@pytest.fixture(scope="module")
def timing():
    spec = importlib.util.spec_from_file_location("reproduce_study_timing", HERE / "timing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _iso(epoch: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _task(results: Path, name: str, seconds: float, finished: float, status: str = "done") -> None:
    path = results / "_sweep" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": name, "status": status, "seconds": seconds}))
    os.utime(path, (finished, finished))


def _log(path: Path, lines: list[tuple]) -> None:
    text = []
    for kind, epoch, *rest in lines:
        if kind == "start":
            text.append(f"part start {_iso(epoch)} {epoch} git abc1234 cpu AMD EPYC 9B14")
        elif kind == "end":
            text.append(f"part end {_iso(epoch)} {epoch} rc {rest[0]}")
        else:
            text.append(f"part stopped {_iso(epoch)} {epoch}")
    path.write_text("\n".join(text) + "\n")


T0 = 1_800_000_000


def test_a_stopped_part_ends_at_its_last_finished_task_and_a_finished_one_at_its_end(timing, tmp_path):
    """Part 1 is stopped: its wall runs to its last finished task (the interrupted one is not counted); part 2
    runs to the end: its wall is start → end. Tasks restored from an earlier machine (finished before the
    first part here) are on disk but in no part of this log; a task still running (not done) counts nowhere."""
    results, log = tmp_path / "r", tmp_path / "parts.log"
    _task(results, "restored", 100.0, T0 - 5000)
    _task(results, "a", 600.0, T0 + 610)
    _task(results, "b", 700.0, T0 + 1300)
    _task(results, "running", 50.0, T0 + 1500, status="running")
    _task(results, "c", 900.0, T0 + 3000)
    _log(log, [("start", T0), ("stopped", T0 + 1700), ("start", T0 + 2000), ("end", T0 + 3100, 0)])
    got = timing.timing(results, log)
    one, two = got["parts"]
    assert (one["wall_s"], one["tasks"], one["task_s"], one["ran_to_the_end"]) == (1300.0, 2, 1300.0, False)
    assert (two["wall_s"], two["tasks"], two["task_s"], two["ran_to_the_end"], two["rc"]) == (1100.0, 1, 900.0,
                                                                                             True, 0)
    assert one["cpu"] == "AMD EPYC 9B14" and one["git"] == "abc1234"
    assert got["wall_s"] == 2400.0 and got["tasks"] == 3 and got["tasks_on_disk"] == 4 and got["tasks_here"] == 3
    assert got["finished"]


def test_earlier_parts_are_summed_in_once_however_often_it_runs(timing, tmp_path):
    """`--before` (the committed timing.json) lists the earlier machines' parts first; running the script again
    with its own output as `--before` replaces the parts this log holds rather than adding them twice."""
    results, log = tmp_path / "r", tmp_path / "parts.log"
    _task(results, "a", 500.0, T0 + 400)
    _log(log, [("start", T0)])
    earlier = [{"part": 1, "started": "2026-12-04T22:50:36Z", "git": "9b010d6", "cpu": "AMD EPYC",
                "ran_to_the_end": False, "rc": None, "wall_s": 2995.7, "tasks": 355, "task_s": 5850.9}]
    first = timing.timing(results, log, earlier)
    again = timing.timing(results, log, first["parts"])
    assert first == again
    assert [p["part"] for p in first["parts"]] == [1, 2]
    assert first["wall_s"] == pytest.approx(2995.7 + 400.0) and first["tasks"] == 356
    assert not first["finished"]


def test_the_committed_timing_adds_up_and_the_readme_quotes_it(timing):
    """timing.json's totals are its parts' sums, and the README's table gives each part's wall in minutes."""
    got = json.loads((HERE / "timing.json").read_text())
    parts = got["parts"]
    assert [p["part"] for p in parts] == list(range(1, len(parts) + 1))
    assert got["wall_s"] == pytest.approx(sum(p["wall_s"] for p in parts), abs=0.15)
    assert got["tasks"] == sum(p["tasks"] for p in parts)
    assert got["task_s"] == pytest.approx(sum(p["task_s"] for p in parts), abs=0.15)
    table = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r"^\| (\d+) \|.*\| ([\d.]+) min \|$", (HERE / "README.md").read_text(encoding="utf-8"), re.M)}
    assert table == {p["part"]: round(p["wall_s"] / 60, 1) for p in parts}
