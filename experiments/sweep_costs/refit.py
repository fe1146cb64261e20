"""Refit the packaged OPD cost coefficients (`mismatch/data/sweep_costs.json`, what `mismatch sweep --dry-run`
estimates with before a results folder holds runs of its own) for the pairs named, from finished sweeps'
ledgers (`mismatch.sweep.estimate.fit_costs`); every other pair and the probes keep theirs.

    .venv/bin/python experiments/sweep_costs/refit.py FOLDER [FOLDER ...] --pairs PAIR [PAIR ...] --note TEXT

A pair's medians come from the first folder that ran it; the response caps (`by_length`) from every folder, the
first to measure a cap giving it. TEXT (where the folders' runs came from: what ran, on what, beside what) is
added to the file's `provenance`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from mismatch.sweep.estimate import COSTS_FILE, fit_costs

PACKAGED = Path(__file__).resolve().parents[2] / "mismatch" / "data" / COSTS_FILE


def refit(folders: list[Path], pairs: list[str]) -> dict:
    costs = json.loads(PACKAGED.read_text())
    fits = [(folder, fit_costs(folder)["opd"]) for folder in folders]
    for pair in pairs:
        mine = [(folder, fit[pair]) for folder, fit in fits if pair in fit]
        if not mine:
            raise SystemExit(f"no finished run of {pair} in {', '.join(map(str, folders))}")
        merged = {k: v for k, v in mine[0][1].items() if k != "by_length"}
        by_length: dict[str, dict] = {}
        for _, fit in mine:
            for cap, c in fit.get("by_length", {}).items():
                by_length.setdefault(cap, c)
        costs["opd"][pair] = {**merged, **({"by_length": by_length} if by_length else {})}
    return costs


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--pairs" not in args or "--note" not in args or args.index("--pairs") == 0:
        raise SystemExit("usage: " + __doc__.strip().splitlines()[3].strip())
    at, note = args.index("--pairs"), args.index("--note")
    pairs = args[at + 1:note] if note > at else args[at + 1:]
    got = refit([Path(a) for a in args[:min(at, note)]], pairs)
    got["provenance"] = f"{got['provenance']}; {', '.join(pairs)}: {args[note + 1]}"
    PACKAGED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    for pair in pairs:
        c = got["opd"][pair]
        print(f"{pair}: train_s {c['train_s']:.3f}, eval_s {c['eval_s']:.3f}, caps {sorted(c.get('by_length', {}))}")
