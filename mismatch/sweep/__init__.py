"""Sweeps: a study file (TOML) → a validated grid of runs (`study`) → tasks run into one results
dataset (`tasks`), serially or on Ray (`runner`, `ray_pool`), resumable through a ledger; with adaptive
seeds in rounds for the levels still undecided (`decide`)."""

from mismatch.sweep.runner import SweepReport, run_study, still_to_run, with_rounds
from mismatch.sweep.study import Plan, Study, load_study, plan_study
from mismatch.sweep.tasks import execute, read_ledger, task_id, task_label

__all__ = ["Plan", "Study", "SweepReport", "execute", "load_study", "plan_study", "read_ledger", "run_study",
           "still_to_run", "task_id", "task_label", "with_rounds"]
