"""Rollouts from inference engines other than PyTorch: dumps read in the shapes engines and RL
frameworks emit (`dumps`), scored against the trainer's checkpoint or the trainer log-probs the dump
logged (`score`)."""

from mismatch.engines.dumps import DumpRecord, EngineDump, read_rollouts, write_rollouts
from mismatch.engines.score import score_rollouts, trainer_side

__all__ = ["DumpRecord", "EngineDump", "read_rollouts", "score_rollouts", "trainer_side", "write_rollouts"]
