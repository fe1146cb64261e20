"""On-policy distillation under training–inference mismatch: losses (`losses`), the rollout copy
with stale weights (`ring`), the run's configuration (`config`), the trainer (`trainer`), tolerance across seeds (`tolerance`),
planning and running several runs into a results dataset (`runs`), verdicts (`verdict`)."""

from mismatch.opd.config import OPDConfig
from mismatch.opd.trainer import save_student, train
from mismatch.opd.runs import label, plan, run_all
from mismatch.opd.verdict import verdict_table

__all__ = ["OPDConfig", "train", "save_student", "plan", "run_all", "label", "verdict_table"]
