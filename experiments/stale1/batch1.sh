#!/bin/bash
cd "$(dirname "$0")/../.."  # the repository root
R=experiments/stale1/run.sh
$R stale1_s0 --rollout stale:1 --seed 0
$R clean_s0_off1 --sample-offset 1
$R clean_s1 --seed 1
$R stale1_s1 --rollout stale:1 --seed 1
$R clean_s0_off2 --sample-offset 2
$R clean_s2 --seed 2
$R stale1_s2 --rollout stale:1 --seed 2
$R clean_s0_off3 --sample-offset 3
