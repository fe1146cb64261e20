"""Sweeps: a study file (TOML) → a validated grid of runs (`study`) → one results dataset, serial and
resumable (`runner`)."""

from mismatch.sweep.runner import SweepReport, read_ledger, run_study, task_id, task_label
from mismatch.sweep.study import Plan, Study, load_study, plan_study

__all__ = ["Plan", "Study", "SweepReport", "load_study", "plan_study", "read_ledger", "run_study", "task_id",
           "task_label"]
