"""Compact a results dataset directory into one parquet file (zstd), the form the reports are committed from.

    .venv/bin/python experiments/study_data/compact.py results/paper experiments/study_data/paper.parquet

Reads the directory as `mismatch report` does (`mismatch.results.read_results`: every part, the newest row of
each item) and writes its rows unchanged, so `mismatch report` on the file gives the same reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mismatch.results import canonical_order, read_results


def main(source: str, target: str) -> None:
    rows = canonical_order(read_results(source))
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), target, compression="zstd", compression_level=9)
    print(f"{len(rows):,} rows of {rows['run_id'].nunique():,} runs -> {target} ({Path(target).stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
