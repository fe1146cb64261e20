"""The teacher-side candidate for the committed study's runs (issue 34 §1): each static run's rollout copy
judged by the teacher at step 0, `copy_heldout_rkl` (`mismatch.opd.evaluate.copy_heldout_rkl`, which new runs
record themselves), written as that run's own rows so that `mismatch report` and `make thresholds` read it
beside them.

    python experiments/teacher_gap/measure.py experiments/study_data/study.parquet \
        experiments/study_data/teacher_gap.parquet [--pairs sort-gpt2,reverse-qwen3]

Step 0's copy is the perturbed initial student, so the value depends on the run's pair, rollout, layers,
seed and evaluation settings only, not on its loss or learning rate: it is computed once per such key and
written for every run that shares it. Resumable: runs already in OUT are skipped; OUT is rewritten
atomically after each key. Same seed, same numbers (the trainer's own function on the trainer's own setup).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from mismatch.opd.config import OPDConfig
from mismatch.opd.evaluate import copy_heldout_rkl
from mismatch.opd.trainer import setup
from mismatch.pairs import load_pair
from mismatch.results import read_results
from mismatch.rollout.spec import RolloutSpec

KEY = ["pair", "rollout", "layers", "seed", "eval_prompts", "max_new_tokens", "eval_probe", "chunk_tokens"]
FIELDS = [f.name for f in dataclasses.fields(OPDConfig)]


def _config(row: pd.Series) -> OPDConfig:
    values = {f: (row[f].item() if hasattr(row[f], "item") else row[f]) for f in FIELDS if f in row.index}
    values = {k: (None if v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v) for k, v in values.items()}
    types = {f.name: f.type for f in dataclasses.fields(OPDConfig)}
    for k, v in list(values.items()):
        if v is not None and "int" in str(types[k]) and "float" not in str(types[k]) and isinstance(v, float):
            values[k] = int(v)
    return OPDConfig(**values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--pairs", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = read_results(args.results)
    opd = rows[(rows["kind"] == "opd") & (rows["level"] == "step")]
    first = opd[(opd["step"] == 0) & (opd["metric"] == "heldout_rkl")].drop_duplicates("run_id")
    first = first[[RolloutSpec.parse(r).source in ("format", "noise") for r in first["rollout"]]]
    if args.pairs:
        first = first[first["pair"].isin(args.pairs.split(","))]
    out = Path(args.out)
    done = read_results(out) if out.exists() else first.iloc[:0]
    first = first[~first["run_id"].isin(set(done["run_id"]))]
    pairs: dict[str, object] = {}
    groups = list(first.groupby(KEY, dropna=False, sort=True))
    print(f"{len(first)} runs, {len(groups)} keys to measure", flush=True)
    for i, (key, group) in enumerate(groups):
        t0 = time.perf_counter()
        config = _config(group.iloc[0])
        pair = pairs.setdefault(config.pair, load_pair(config.pair))
        values = copy_heldout_rkl(setup(config, pair))
        if not values:
            print(f"{key}: nothing measured (eval_probe 0)", flush=True)
            continue
        new = [group.assign(metric=m, value=float(v)) for m, v in values.items()]
        done = pd.concat([done, *new], ignore_index=True)
        tmp = out.with_suffix(".tmp.parquet")
        done.to_parquet(tmp, index=False)
        tmp.replace(out)
        print(f"[{i + 1}/{len(groups)}] {key}: copy_heldout_rkl {values['copy_heldout_rkl']:.4f} "
              f"({time.perf_counter() - t0:.1f} s, {len(group)} runs)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
