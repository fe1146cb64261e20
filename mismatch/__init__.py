"""mismatch: measure how much training-inference mismatch on-policy distillation tolerates.

Public API (names are the contract, see DESIGN.md):
    load, list_models, LM                    models.py (load: pairs/registry.py, PAIR:student too)
    probe, reference, ProbeResult, Reference probes.py
    ProbeConfig, probe_candidates, run_probes probe_runs.py (one reference, many candidates)
    read_results                             results.py (the results dataset)
    generate, Batch                          rollout.py
    perturbed, perturb_, restore_, parse_spec perturb/
    load_pair, list_pairs, Pair              pairs/
    check, Admission, fit_thresholds         admission/ (the admission check, thresholds, recipes, cost)
    score_rollouts, read_rollouts            engines/ (an engine's rollout dump scored against a checkpoint)
"""

# Importing changes nothing in the caller's process (no environment variable is set): loading stays
# offline by asking transformers for local files only; the CLI sets what its own process needs.
from mismatch.version import __version__  # noqa: E402
from mismatch.errors import (  # noqa: E402
    InputError,
    MismatchError,
    ModelNotAvailableError,
    NumericsError,
    VocabMismatchError,
)
from mismatch.models import LM, list_models  # noqa: E402
from mismatch.probes import ProbeResult, Reference, probe, reference  # noqa: E402
from mismatch.perturb import parse_spec, perturb_, perturbed, restore_  # noqa: E402
from mismatch.pairs import Pair, list_pairs, load_pair  # noqa: E402
from mismatch.pairs.registry import load_member as load  # noqa: E402  (PAIR:student too, as the CLI)
from mismatch import rollout  # noqa: E402
from mismatch.rollout import Batch, generate, teacher_forced  # noqa: E402
from mismatch.probe_runs import ProbeConfig, probe_candidates, run_probes  # noqa: E402
from mismatch.results import read_results  # noqa: E402
from mismatch.admission import Admission, check, fit_thresholds  # noqa: E402
from mismatch.engines import read_rollouts, score_rollouts, write_rollouts  # noqa: E402

__all__ = [
    "LM", "load", "list_models",
    "probe", "reference", "ProbeResult", "Reference",
    "ProbeConfig", "probe_candidates", "run_probes", "read_results",
    "rollout", "Batch", "generate", "teacher_forced",
    "perturbed", "perturb_", "restore_", "parse_spec",
    "Pair", "load_pair", "list_pairs",
    "check", "Admission", "fit_thresholds",
    "score_rollouts", "read_rollouts", "write_rollouts",
    "MismatchError", "ModelNotAvailableError", "InputError", "VocabMismatchError", "NumericsError",
    "__version__",
]
