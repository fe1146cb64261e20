#!/bin/bash
# One part of `make reproduce-study` timed end to end (README.md here): run from a worktree of the repository
# whose .venv is installed (`make install`), in the background; stop_part.sh stops it. On a new machine the
# earlier parts' runs are restored first (restore.sh), so --resume skips them.
set -u
cd "$(git rev-parse --show-toplevel)"
out=results/e2e
mkdir -p "$out"
log=results/e2e/parts.log  # this machine's parts; timing.json (committed) keeps them all
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "part start $(date -u +%FT%TZ) $(date +%s) git $(git rev-parse --short HEAD) cpu ${cpu:-?}" >> "$log"
# the report apart from the checkout's reports/, which holds the committed report of a larger dataset
PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 make -o .venv/.installed reproduce-study RESULTS="$out" REPORTS="$out/reports" \
  >> "$out.log" 2>&1
rc=$?
echo "part end $(date -u +%FT%TZ) $(date +%s) rc $rc" >> "$log"
