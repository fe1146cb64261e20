"""Rollouts from inference engines other than PyTorch: dumps read in the shapes engines emit
(`dumps`), scored against the trainer's checkpoint (`score`)."""

from mismatch.engines.dumps import DumpRecord, EngineDump, read_rollouts, write_rollouts
from mismatch.engines.score import score_rollouts

__all__ = ["DumpRecord", "EngineDump", "read_rollouts", "score_rollouts", "write_rollouts"]
