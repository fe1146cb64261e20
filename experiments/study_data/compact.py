"""Compact a results dataset directory into one parquet file (zstd), the form the reports are committed from.

    .venv/bin/python experiments/study_data/compact.py results/paper experiments/study_data/paper.parquet
    .venv/bin/python experiments/study_data/compact.py results/study experiments/study_data/study.parquet --finished

Reads the directory as `mismatch report` does (`mismatch.results.read_results`: every part, the newest row of
each item) and writes its rows unchanged, so `mismatch report` on the file gives the same reports. With
`--finished`, only the OPD runs whose sweep task is recorded `done` in the directory's ledger (`_sweep/`) are
kept: a run stopped mid-way (a session's end) is left out rather than committed half-written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mismatch.opd.runs import make_config, run_columns
from mismatch.results import canonical_order, read_results, run_id
from mismatch.sweep.tasks import read_ledger


def finished_runs(source: str | Path) -> set[str]:
    """Run ids of the OPD tasks the ledger of `source` records as done."""
    return {run_id("opd", run_columns(make_config(**record["config"])))
            for record in read_ledger(source).values()
            if record.get("status") == "done" and record.get("task", "").startswith("opd ")}


def main(source: str, target: str, finished: bool = False) -> None:
    rows = read_results(source)
    if finished:
        done = finished_runs(source)
        rows = rows[(rows["kind"] != "opd") | rows["run_id"].isin(done)]
    rows = canonical_order(rows)
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), target, compression="zstd", compression_level=9)
    print(f"{len(rows):,} rows of {rows['run_id'].nunique():,} runs -> {target} ({Path(target).stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("--finished", action="store_true", help="keep only the OPD runs the ledger records as done")
    args = parser.parse_args()
    main(args.source, args.target, args.finished)
