"""Rollout dumps: what inference engines (vLLM, SGLang, OpenAI-style servers) and RL trainers (prime-rl,
slime, verl) write, read into one shape (`formats`) and scored against the trainer's checkpoint or the
trainer log-probs the dump logged (`score`). Names load on first use."""

from mismatch.lazy import lazy

__getattr__, __dir__ = lazy(globals(), {
    "DumpRecord": "mismatch.dumps.formats", "EngineDump": "mismatch.dumps.formats",
    "read_rollouts": "mismatch.dumps.formats", "write_rollouts": "mismatch.dumps.formats",
    "score_rollouts": "mismatch.dumps.score", "trainer_side": "mismatch.dumps.score",
})
__all__ = ["DumpRecord", "EngineDump", "read_rollouts", "score_rollouts", "trainer_side", "write_rollouts"]
