#!/bin/bash
cd "$(dirname "$0")/../.."  # the repository root
while pgrep -f "experiments/stale1/batch1.sh" >/dev/null; do sleep 5; done
R=experiments/stale1/run.sh
$R lead_s0 --synthetic lead --seed 0
$R rand_s0 --synthetic rand --seed 0
$R stale1_s0_diag --rollout stale:1 --seed 0 --diag-every 20
$R clean_s0_diag --seed 0 --diag-every 20
$R lr3e-4_clean_s0 --lr 3e-4 --seed 0
$R lr3e-4_stale1_s0 --lr 3e-4 --rollout stale:1 --seed 0
$R b1z_clean_s0 --beta1 0 --seed 0
$R b1z_stale1_s0 --beta1 0 --rollout stale:1 --seed 0
$R wu0_clean_s0 --warmup 0 --seed 0
$R wu0_stale1_s0 --warmup 0 --rollout stale:1 --seed 0
$R lead_s1 --synthetic lead --seed 1
$R rand_s1 --synthetic rand --seed 1
$R lr3e-4_clean_s1 --lr 3e-4 --seed 1
$R lr3e-4_stale1_s1 --lr 3e-4 --rollout stale:1 --seed 1
$R b1z_clean_s1 --beta1 0 --seed 1
$R b1z_stale1_s1 --beta1 0 --rollout stale:1 --seed 1
