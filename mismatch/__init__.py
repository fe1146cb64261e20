"""mismatch: measure how much training-inference mismatch on-policy distillation tolerates.

Public API (names are the contract, see docs/design.md):
    load, list_models, LM                    model/loader.py (load: pairs/registry.py, PAIR:student too)
    probe, reference, ProbeResult, Reference probes/core.py
    ProbeConfig, probe_candidates, run_probes probes/runs.py (one reference, many candidates)
    read_results                             results.py (the results dataset)
    generate, Batch, teacher_forced          model/generate.py
    perturbed, perturb_, restore_, parse_spec perturb/
    load_pair, list_pairs, Pair              pairs/
    check, Admission, fit_thresholds         admission/ (the admission check, thresholds, recipes, cost)
    score_rollouts, read_rollouts            engines/ (an engine's rollout dump scored against a checkpoint)
"""

# Importing changes nothing in the caller's process (no environment variable is set): loading stays
# offline by asking transformers for local files only; the CLI sets what its own process needs. The
# public names load on first use (module `__getattr__`), so `import mismatch` costs no torch import.
import importlib

from mismatch.version import __version__
from mismatch.errors import InputError, MismatchError, ModelNotAvailableError, NumericsError, VocabMismatchError

_LAZY = {  # public name -> (module, attribute)
    "LM": ("mismatch.model.loader", "LM"), "list_models": ("mismatch.model.loader", "list_models"),
    "load": ("mismatch.pairs.registry", "load_member"),  # PAIR:student too, as the CLI
    "probe": ("mismatch.probes.core", "probe"), "reference": ("mismatch.probes.core", "reference"),
    "ProbeResult": ("mismatch.probes.core", "ProbeResult"), "Reference": ("mismatch.probes.core", "Reference"),
    "ProbeConfig": ("mismatch.probes.runs", "ProbeConfig"), "probe_candidates": ("mismatch.probes.runs", "probe_candidates"),
    "run_probes": ("mismatch.probes.runs", "run_probes"), "read_results": ("mismatch.results", "read_results"),
    "Batch": ("mismatch.model.generate", "Batch"), "generate": ("mismatch.model.generate", "generate"),
    "teacher_forced": ("mismatch.model.generate", "teacher_forced"),
    "perturbed": ("mismatch.perturb", "perturbed"), "perturb_": ("mismatch.perturb", "perturb_"),
    "restore_": ("mismatch.perturb", "restore_"), "parse_spec": ("mismatch.perturb", "parse_spec"),
    "Pair": ("mismatch.pairs", "Pair"), "load_pair": ("mismatch.pairs", "load_pair"),
    "list_pairs": ("mismatch.pairs", "list_pairs"),
    "check": ("mismatch.admission", "check"), "Admission": ("mismatch.admission", "Admission"),
    "fit_thresholds": ("mismatch.admission", "fit_thresholds"),
    "score_rollouts": ("mismatch.engines", "score_rollouts"), "read_rollouts": ("mismatch.engines", "read_rollouts"),
    "write_rollouts": ("mismatch.engines", "write_rollouts"),
}
_SUBMODULES = {"model", "perturb", "probes", "pairs", "engines", "opd", "admission", "sweep", "report", "metrics", "monitor",
               "results", "files"}


def __getattr__(name: str):
    """A public name or subpackage, imported on first use (then cached in the module's namespace)."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"mismatch.{name}")
    else:
        raise AttributeError(f"module 'mismatch' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBMODULES})


__all__ = [
    "LM", "load", "list_models",
    "probe", "reference", "ProbeResult", "Reference",
    "ProbeConfig", "probe_candidates", "run_probes", "read_results",
    "Batch", "generate", "teacher_forced",
    "perturbed", "perturb_", "restore_", "parse_spec",
    "Pair", "load_pair", "list_pairs",
    "check", "Admission", "fit_thresholds",
    "score_rollouts", "read_rollouts", "write_rollouts",
    "MismatchError", "ModelNotAvailableError", "InputError", "VocabMismatchError", "NumericsError",
    "__version__",
]
