"""Refit the packaged OPD cost coefficients (`mismatch/data/sweep_costs.json`, what `mismatch sweep --dry-run`
estimates with before a results folder holds runs of its own) for the pairs named, from finished sweeps'
ledgers (`mismatch.sweep.estimate.fit_costs`); every other pair and the probes keep theirs.

    .venv/bin/python experiments/sweep_costs/refit.py FOLDER [FOLDER ...] --pairs PAIR [PAIR ...] --note TEXT

A pair's medians come from the first folder that ran it; the response caps (`by_length`) from every folder, the
first to measure a cap giving it. TEXT (where the folders' runs came from: what ran, on what, beside what) is
added to the file's `provenance`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mismatch.sweep.estimate import COSTS_FILE, fit_costs

PACKAGED = Path(__file__).resolve().parents[2] / "mismatch" / "data" / COSTS_FILE


def refit(folders: list[Path], pairs: list[str]) -> dict:
    costs = json.loads(PACKAGED.read_text())
    fits = [fit_costs(folder)["opd"] for folder in folders]
    for pair in pairs:
        mine = [fit[pair] for fit in fits if pair in fit]
        if not mine:
            raise SystemExit(f"no finished run of {pair} in {', '.join(map(str, folders))}")
        merged = {k: v for k, v in mine[0].items() if k != "by_length"}
        by_length: dict[str, dict] = {}
        for fit in mine:
            for cap, c in fit.get("by_length", {}).items():
                by_length.setdefault(cap, c)
        costs["opd"][pair] = {**merged, **({"by_length": by_length} if by_length else {})}
    return costs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Refit the packaged OPD cost coefficients of some pairs.")
    parser.add_argument("folders", nargs="+", type=Path, help="results folders of finished sweeps")
    parser.add_argument("--pairs", nargs="+", required=True, help="the pairs to refit")
    parser.add_argument("--note", required=True, help="where the runs came from, added to the provenance")
    args = parser.parse_args()
    got = refit(args.folders, args.pairs)
    got["provenance"] = f"{got['provenance']}; {', '.join(args.pairs)}: {args.note}"
    PACKAGED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    for pair in args.pairs:
        c = got["opd"][pair]
        print(f"{pair}: train_s {c['train_s']:.3f}, eval_s {c['eval_s']:.3f}, caps {sorted(c.get('by_length', {}))}")
