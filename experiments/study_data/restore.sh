#!/bin/bash
# The real-weight study's results folder on any machine: the committed runs of both its folders
# (experiments/real_study2/data and experiments/length_ladder/data) merged into results/study, so that
#   mismatch sweep sweeps/study-extended.toml --out results/study --workers 2 --resume
# (or sweeps/study.toml, sweeps/length.toml) runs only what neither holds; save.py here copies the new runs back.
set -eu
cd "$(git rev-parse --show-toplevel)"
out=${1:-results/study}
mkdir -p "$out"
cp -a experiments/real_study2/data/. "$out"/
(cd experiments/length_ladder/data && find . -type f) | while read -r f; do  # the first folder's copy wins
  [ -e "$out/$f" ] || { mkdir -p "$(dirname "$out/$f")"; cp -a "experiments/length_ladder/data/$f" "$out/$f"; }
done
echo "restored $(ls "$out"/_sweep/*.json | wc -l) finished tasks into $out"
