"""Mismatch inside the trainers people use. `mismatch.integrations.trl`: TRL's `DistillationTrainer` with
rollouts from a mismatched copy and the admission gates in the loop (needs the `trl` extra; the TRL releases
it is tested on are `mismatch.integrations.trl.TESTED_TRL`, and importing it checks TRL's private hooks)."""
