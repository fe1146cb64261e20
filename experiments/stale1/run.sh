#!/bin/bash
# usage: investigation/run.sh TAG [exp3.py args...]
cd /tmp/stale_wt
PYTHONPATH=/tmp/stale_wt HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /work/main/.venv/bin/python investigation/exp3.py --tag "$@" > investigation/logs/$1.log 2>&1
grep RESULT investigation/logs/$1.log
