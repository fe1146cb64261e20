"""Compact a results dataset directory into one parquet file (zstd), the form the reports are committed from.

    .venv/bin/python experiments/study_data/compact.py results/paper experiments/study_data/paper.parquet
    .venv/bin/python experiments/study_data/compact.py results/study experiments/study_data/study.parquet --finished

Reads the directory as `mismatch report` does (`mismatch.results.read_results`: every part, the newest row of
each item) and writes its rows unchanged, so `mismatch report` on the file gives the same reports. With
`--finished`, only the OPD runs whose sweep task is recorded `done` in the directory's ledger (`_sweep/`) are
kept: a run stopped mid-way (a session's end) is left out rather than committed half-written. With `--only
STUDY`, only the OPD runs of that study file's plan are kept (its clean twins too); with `--hold-out STUDY`, its
mismatched runs are left out (its clean twins are kept: they are the other studies' too). The held-out cases of
the admission check (sweeps/validation.toml) share a results directory with the study and must stay out of the
thresholds' fit (`--hold-out` may be given again: a level whose look is not yet whole is left out the same way,
by a study file holding its block):

    .venv/bin/python experiments/study_data/compact.py results/study experiments/study_data/study.parquet \
        --finished --hold-out sweeps/validation.toml
    .venv/bin/python experiments/study_data/compact.py results/study experiments/validation/validation.parquet \
        --finished --only sweeps/validation.toml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.results import canonical_order, read_results, run_id
from mismatch.sweep import load_study
from mismatch.sweep.tasks import read_ledger


def finished_runs(source: str | Path) -> set[str]:
    """Run ids of the OPD tasks the ledger of `source` records as done."""
    return {run_id("opd", run_columns(OPDConfig(**record["config"])))
            for record in read_ledger(source).values()
            if record.get("status") == "done" and record.get("task", "").startswith("opd ")}


def study_runs(path: str | Path, mismatched_only: bool = False) -> set[str]:
    """Run ids of the OPD runs a study file plans (only those with a mismatched rollout, if asked)."""
    return {run_id("opd", run_columns(config)) for config in load_study(path).plan.opd
            if not mismatched_only or config.rollout != "none"}


def main(source: str, target: str, finished: bool = False, only: str | None = None,
         hold_out: list[str] | None = None) -> None:
    rows = read_results(source)
    opd = rows["kind"] == "opd"
    if finished:
        rows = rows[~opd | rows["run_id"].isin(finished_runs(source))]
        opd = rows["kind"] == "opd"
    if only is not None:
        rows = rows[opd & rows["run_id"].isin(study_runs(only))]
        opd = rows["kind"] == "opd"
    for study in hold_out or []:
        rows = rows[~opd | ~rows["run_id"].isin(study_runs(study, mismatched_only=True))]
        opd = rows["kind"] == "opd"
    rows = canonical_order(rows)
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), target, compression="zstd", compression_level=9)
    print(f"{len(rows):,} rows of {rows['run_id'].nunique():,} runs -> {target} ({Path(target).stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("--finished", action="store_true", help="keep only the OPD runs the ledger records as done")
    parser.add_argument("--only", metavar="STUDY", help="keep only the OPD runs this study file plans")
    parser.add_argument("--hold-out", metavar="STUDY", action="append",
                        help="leave out the mismatched OPD runs this study file plans (may be given again)")
    args = parser.parse_args()
    main(args.source, args.target, args.finished, args.only, args.hold_out)
