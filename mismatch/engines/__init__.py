"""Rollouts from inference engines other than PyTorch: dumps read in the shapes engines emit
(`dumps`), scored against the trainer's checkpoint (`score`)."""

from mismatch.engines.dumps import EngineRollout, RolloutDump, read_rollouts, write_rollouts
from mismatch.engines.score import score_rollouts

__all__ = ["EngineRollout", "RolloutDump", "read_rollouts", "score_rollouts", "write_rollouts"]
