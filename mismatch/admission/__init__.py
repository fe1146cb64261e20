"""The admission check: is a cheaper rollout configuration safe for a model, and if not, which
layers must stay in high precision (recipes, exported to vLLM / llm-compressor), at what cost.
Names load on first use: the fitted limits (`thresholds`, `limits`, `transfer`) import no torch."""

from mismatch.lazy import lazy

__getattr__, __dir__ = lazy(globals(), {
    "CalibrationSettings": "mismatch.admission.calibration",
    "Admission": "mismatch.admission.checker", "Pipeline": "mismatch.admission.checker",
    "check": "mismatch.admission.checker",
    "Decision": "mismatch.admission.decision", "judge": "mismatch.admission.decision",
    "LagMeasurement": "mismatch.admission.lagged", "TrainerSettings": "mismatch.admission.lagged",
    "measure_lag": "mismatch.admission.lagged",
    "PRESETS": "mismatch.admission.gates", "Gate": "mismatch.admission.gates",
    "rollout_stats": ("mismatch.metrics", "rollout_stats"),
    "Thresholds": "mismatch.admission.thresholds", "fit_thresholds": "mismatch.admission.thresholds",
    "load_thresholds": "mismatch.admission.thresholds",
})
__all__ = ["Admission", "CalibrationSettings", "Decision", "Pipeline", "check", "judge", "PRESETS", "Gate",
           "rollout_stats", "Thresholds", "fit_thresholds", "load_thresholds", "LagMeasurement", "TrainerSettings",
           "measure_lag"]
