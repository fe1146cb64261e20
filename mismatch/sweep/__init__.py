"""Sweeps: a study file (TOML) → a validated grid of runs (`study`); running them into one results
dataset is the next step of the sweep issue."""

from mismatch.sweep.study import Plan, Study, load_study, plan_study

__all__ = ["Plan", "Study", "load_study", "plan_study"]
