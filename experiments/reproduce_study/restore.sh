#!/bin/bash
# Before a part on a machine that did not run the earlier ones: their finished runs (data/, committed at each
# part's end) back into the results folder, so `--resume` skips them. Their ledger entries get this machine's
# modification times, before the new part's start: timing.py counts them in the earlier parts (timing.json).
set -eu
cd "$(git rev-parse --show-toplevel)"
mkdir -p results/e2e/paper/_sweep
cp -a experiments/study_data/loss.parquet results/e2e/paper/  # part 1: the loss study, compacted
cp -a experiments/study_data/ledger/. results/e2e/paper/_sweep/
cp -a experiments/reproduce_study/data/. results/e2e/paper/
echo "restored $(ls results/e2e/paper/_sweep | wc -l) finished tasks into results/e2e/paper"
