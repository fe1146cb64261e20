"""The admission check: is a cheaper rollout configuration safe for a model, and if not, which
layers must stay in high precision (recipes, exported to vLLM / llm-compressor), at what cost."""

from mismatch.admission.calibration import CalibrationSettings  # noqa: E402
from mismatch.admission.checker import Admission, Pipeline, check  # noqa: E402
from mismatch.admission.judge import Decision, judge  # noqa: E402
from mismatch.admission.lagged import LagMeasurement, TrainerSettings, measure_lag  # noqa: E402
from mismatch.admission.gates import PRESETS, Gate, rollout_stats  # noqa: E402
from mismatch.admission.thresholds import Thresholds, fit_thresholds, load_thresholds  # noqa: E402

__all__ = ["Admission", "CalibrationSettings", "Decision", "Pipeline", "check", "judge", "PRESETS", "Gate", "rollout_stats", "Thresholds", "fit_thresholds",
           "load_thresholds", "LagMeasurement", "TrainerSettings", "measure_lag"]
