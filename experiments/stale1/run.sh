#!/bin/bash
# usage: experiments/stale1/run.sh TAG [exp3.py args...]
cd "$(dirname "$0")/../.."  # the repository root
HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python experiments/stale1/exp3.py --tag "$@" > experiments/stale1/logs/$1.log 2>&1
grep RESULT experiments/stale1/logs/$1.log
