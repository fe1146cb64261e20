"""The rollout: what generates the responses OPD trains on and the probes score as the candidate.
`spec` (`RolloutSpec`: a rollout string parsed once), `source` (a perturbed model or an engine, for the
block: `open_source`), `copy` (OPD's rollout copy, stale and perturbed, and the sampling seed of a step),
`cost` (what a rollout configuration saves), `llamacpp` and `gguf_export` (the llama.cpp engine).
Names load on first use: `RolloutSpec` imports no torch."""

from mismatch.lazy import lazy

__getattr__, __dir__ = lazy(globals(), {
    "RolloutSpec": "mismatch.rollout.spec", "rollout_label": "mismatch.rollout.spec",
    "RolloutSource": "mismatch.rollout.source", "open_source": "mismatch.rollout.source",
    "RolloutCopy": "mismatch.rollout.copy", "rollout_seed": "mismatch.rollout.copy",
    "rollout_cost": "mismatch.rollout.cost",
})
__all__ = ["RolloutSpec", "rollout_label", "RolloutSource", "open_source", "RolloutCopy", "rollout_seed",
           "rollout_cost"]
