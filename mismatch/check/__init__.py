"""The admission check: is a cheaper rollout configuration safe for a model, and if not, which
layers must stay in high precision (recipes, exported to vLLM / llm-compressor), at what cost."""

from mismatch.check.admission import Admission, Decision, check  # noqa: E402
from mismatch.check.gates import PRESETS, Gate, rollout_stats  # noqa: E402
from mismatch.check.thresholds import Thresholds, fit_thresholds, load_thresholds  # noqa: E402

__all__ = ["Admission", "Decision", "check", "PRESETS", "Gate", "rollout_stats", "Thresholds", "fit_thresholds",
           "load_thresholds"]
