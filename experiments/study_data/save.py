"""A results folder's finished OPD runs into a committed data folder, each file once across the study's folders.

The real-weight study's runs live in two committed folders — `experiments/real_study2/data` (sweeps/study.toml
and study-extended's smollm2-concise blocks) and `experiments/length_ladder/data` (sweeps/length.toml and
study-extended's smollm2-pruned blocks, which run at the ladder's 32-token rung) — and a sweep that continues
either runs in a folder made of both (`restore.sh` here). This copies back what the sweep added: the parquet
parts of the runs its ledger records as done and those tasks' ledger records (`_sweep/<task>.json`), each only
where neither the target nor a `--besides` folder holds it already, and the step-0 evaluation cache. A run
stopped mid-way is left out (it has no ledger record yet): the next `--resume` runs it again.

    .venv/bin/python experiments/study_data/save.py results/study experiments/real_study2/data \
        --besides experiments/length_ladder/data

Then `compact.py` (README.md here) turns the target folder into the parquet the reports are built from.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from compact import finished_runs  # the study data's own notion of a finished run


def _held(folders: list[Path]) -> set[str]:
    """Paths (relative to their folder) of every file the folders hold."""
    return {str(p.relative_to(f)) for f in folders if f.is_dir() for p in f.rglob("*") if p.is_file()}


def save(results: Path, target: Path, besides: list[Path]) -> tuple[int, int]:
    """Copy `results`' finished runs' parts and done ledger records that none of `target` and `besides` holds into
    `target`; returns (parts copied, ledger records copied)."""
    for folder in besides:
        if not folder.is_dir():
            raise SystemExit(f"error: --besides {folder} is not a folder")
    if not (results / "_sweep").is_dir():
        raise SystemExit(f"error: {results} has no sweep ledger (_sweep/): not a results folder of `mismatch sweep`")
    held, done = _held([target, *besides]), finished_runs(results)
    parts = records = 0
    for part in sorted(results.glob("*-opd-*.parquet")):  # <time>-opd-<run id>-<writer>-<chunk>.parquet
        if part.name.split("-")[2] in done and part.name not in held:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(part, target / part.name)
            parts += 1
    for ledger in sorted((results / "_sweep").glob("*.json")):
        name = f"_sweep/{ledger.name}"
        if json.loads(ledger.read_text()).get("status") == "done" and name not in held:
            (target / "_sweep").mkdir(parents=True, exist_ok=True)
            shutil.copy2(ledger, target / name)
            records += 1
    for cached in sorted(p for p in (results / "_cache").rglob("*") if p.is_file()):  # step-0 evaluations, once
        name = str(cached.relative_to(results))
        if name not in held:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(cached, target / name)
    return parts, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the sweep's results folder")
    parser.add_argument("target", type=Path, help="the committed data folder the new runs go to")
    parser.add_argument("--besides", type=Path, action="append", default=[],
                        help="another committed data folder whose files are not copied again (repeatable)")
    args = parser.parse_args(argv)
    parts, records = save(args.results, args.target, args.besides)
    print(f"{parts} parts and {records} ledger records of finished runs copied into {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
