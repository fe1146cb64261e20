"""The admission limits applied to a training run's own log: `monitor(path)` reads what a run logged (TRL,
TensorBoard, verl's / prime-rl's JSON lines, mismatch's own results), maps each framework's mismatch
statistics onto the calibrated ones in the mode the run's framework config shows (`framework_config=`, or
the config the log carries) and judges them step by step. Names load on first use, so the CLI can
read `MonitorSettings` (stdlib only) without pandas or torch."""

import importlib

_LAZY = {"MonitorReport": "mismatch.monitor.drift", "monitor": "mismatch.monitor.drift",
         "write_monitor": "mismatch.monitor.drift", "MonitorSettings": "mismatch.monitor.settings"}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'mismatch.monitor' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
