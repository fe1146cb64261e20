"""mismatch: measure how much training-inference mismatch on-policy distillation tolerates.

The public names (the contract; docs/design.md says what each takes and where the package's layers are):
    load, list_models, LM, generate, Batch            a model spec → a model; responses
    probe, reference, ProbeResult, Reference          a candidate's divergence from a reference
    ProbeConfig, probe_candidates, run_probes         one reference, many candidates, into results
    perturbed, perturb_, restore_, parse_spec         a perturbation applied in place, restored exactly
    load_pair, list_pairs, Pair                       student–teacher pairs
    check, Admission, fit_thresholds, judge           the admission check; its gates inside a training loop
    score_rollouts, read_rollouts                     an engine's or trainer's rollout dump scored
    read_results                                      the results dataset
"""

# Importing changes nothing in the caller's process (no environment variable is set): loading stays
# offline by asking transformers for local files only; the CLI sets what its own process needs. The
# public names load on first use (module `__getattr__`), so `import mismatch` costs no torch import.
from mismatch.lazy import lazy
from mismatch.version import __version__
from mismatch.errors import InputError, MismatchError, ModelNotAvailableError, NumericsError, VocabMismatchError

_SUBMODULES = ("model", "perturb", "rollout", "probes", "pairs", "opd", "analysis", "dumps", "admission", "sweep",
               "report", "metrics", "monitor", "results", "files")
__getattr__, __dir__ = lazy(globals(), {
    "LM": "mismatch.model.loader", "list_models": "mismatch.model.loader",
    "load": ("mismatch.pairs.load", "load"),  # the model layer's `load`, with the pairs' PAIR:ROLE registered
    "probe": "mismatch.probes.core", "reference": "mismatch.probes.core",
    "ProbeResult": "mismatch.probes.core", "Reference": "mismatch.probes.core",
    "ProbeConfig": "mismatch.probes.runs", "probe_candidates": "mismatch.probes.runs",
    "run_probes": "mismatch.probes.runs", "read_results": "mismatch.results",
    "Batch": "mismatch.model.generate", "generate": "mismatch.model.generate",
    "perturbed": "mismatch.perturb", "perturb_": "mismatch.perturb",
    "restore_": "mismatch.perturb", "parse_spec": "mismatch.perturb",
    "Pair": "mismatch.pairs", "load_pair": "mismatch.pairs", "list_pairs": "mismatch.pairs",
    "check": "mismatch.admission", "Admission": "mismatch.admission", "fit_thresholds": "mismatch.admission",
    "judge": "mismatch.admission.decision",
    "score_rollouts": "mismatch.dumps", "read_rollouts": "mismatch.dumps",
}, submodules=_SUBMODULES)


__all__ = [
    "LM", "load", "list_models",
    "probe", "reference", "ProbeResult", "Reference",
    "ProbeConfig", "probe_candidates", "run_probes", "read_results",
    "Batch", "generate",
    "perturbed", "perturb_", "restore_", "parse_spec",
    "Pair", "load_pair", "list_pairs",
    "check", "Admission", "fit_thresholds", "judge",
    "score_rollouts", "read_rollouts",
    "MismatchError", "ModelNotAvailableError", "InputError", "VocabMismatchError", "NumericsError",
    "__version__",
]
