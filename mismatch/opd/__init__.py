"""On-policy distillation under training–inference mismatch: losses (`losses`), the rollout
copy with stale weights (`ring`), the training recipe (`recipe`)."""

from mismatch.opd.recipe import OPDConfig, train

__all__ = ["OPDConfig", "train"]
