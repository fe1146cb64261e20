#!/bin/bash
# Stop the running part (run_part.sh) before a session ends; the task it interrupts runs again in the next part.
cd "$(git rev-parse --show-toplevel)"
pkill -f run_part.sh; pkill -f "mismatch sweep"; sleep 5
.venv/bin/ray stop --force > /dev/null 2>&1
echo "part stopped $(date -u +%FT%TZ) $(date +%s)" >> results/e2e/parts.log
