"""The finished part of a timed `make reproduce-study` (README.md here) into git: the results folder's files of the
OPD runs its ledger records as done, their ledger entries and the shared initial-evaluation cache, copied into
experiments/reproduce_study/data/ (what restore.sh puts back on another machine). A run stopped mid-way is left
out: the next part runs it again. The loss study's runs are committed already, compacted
(experiments/study_data/loss.parquet and ledger/, from part 1): they are not copied twice.

    .venv/bin/python experiments/reproduce_study/save.py results/e2e/paper
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "study_data"))
from compact import finished_runs  # noqa: E402  (the study data's own notion of a finished run)

DATA = Path(__file__).resolve().parent / "data"
COMPACTED = Path(__file__).resolve().parents[1] / "study_data" / "loss.parquet"


def save(results: Path) -> int:
    done = finished_runs(results) - set(pq.read_table(COMPACTED, columns=["run_id"]).column("run_id").to_pylist())
    (DATA / "_sweep").mkdir(parents=True, exist_ok=True)
    copied = 0
    for part in results.glob("*-*.parquet"):  # <time>-opd-<run id>-<writer>-<chunk>.parquet (not restore.sh's loss.parquet)
        kind, rid = part.name.split("-")[1:3]
        if kind == "opd" and rid in done and not (DATA / part.name).exists():
            shutil.copy2(part, DATA / part.name)
            copied += 1
    for ledger in (results / "_sweep").glob("*.json"):
        record = json.loads(ledger.read_text())
        if record.get("status") == "done" and not (COMPACTED.parent / "ledger" / ledger.name).exists():
            shutil.copy2(ledger, DATA / "_sweep" / ledger.name)
    if (results / "_cache").is_dir():
        shutil.copytree(results / "_cache", DATA / "_cache", dirs_exist_ok=True)
    print(f"{len(done)} finished runs ({copied} files new) in {DATA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(save(Path(sys.argv[1])))
