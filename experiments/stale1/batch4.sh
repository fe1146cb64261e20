#!/bin/bash
cd "$(dirname "$0")/../.."  # the repository root
while pgrep -f "exp3.py --tag lead_s2" >/dev/null; do sleep 3; done
R=experiments/stale1/run.sh
$R b1z_lr2e-4_clean_s0 --beta1 0 --lr 2e-4 --seed 0
$R b1z_lr2e-4_stale1_s0 --beta1 0 --lr 2e-4 --rollout stale:1 --seed 0
$R b05_clean_s0 --beta1 0.5 --seed 0
$R b05_stale1_s0 --beta1 0.5 --rollout stale:1 --seed 0
$R clean_s0_ucos --seed 0 --steps 40 --eval-prompts 256 --eval-every 40
