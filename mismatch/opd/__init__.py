"""On-policy distillation under training–inference mismatch: the run's configuration (`config`), its losses
(`losses`), the trainer (`trainer`), the student's fp32 masters (`precision`), planning and running several
runs into a results dataset (`runs`). The rollout copy is `mismatch.rollout.copy`; verdicts across runs and
seeds are `mismatch.analysis`. Names load on first use: `import mismatch.opd` imports no torch."""

from mismatch.lazy import lazy

__getattr__, __dir__ = lazy(globals(), {
    "OPDConfig": "mismatch.opd.config", "train": "mismatch.opd.trainer", "save_student": "mismatch.opd.trainer",
    "plan": "mismatch.opd.runs", "run_all": "mismatch.opd.runs",
})
__all__ = ["OPDConfig", "train", "save_student", "plan", "run_all"]
