"""Which probe runs count as a pair's student in the sweep report."""

import pandas as pd

from mismatch.report.sweep import _student_probes, student_models
from mismatch.results import tidy

STAMP = {"mismatch_version": "0", "torch_version": "t", "transformers_version": "h", "git_sha": "g",
         "timestamp": "2026-01-01T00:00:00+00:00"}


def _probe(reference: str, value: float) -> pd.DataFrame:
    config = {"reference": reference, "candidate": reference, "perturb": "int4:group128", "layers": "linear"}
    return tidy(pd.DataFrame([{"level": "summary", "metric": "kl_fwd_mean", "value": value}]), kind="probe",
                config=config, stamp=STAMP)


def test_a_students_own_model_spec_counts_as_that_pairs_student():
    models = student_models()
    assert models["smollm2-135m"] == "smollm2-concise"
    rows = pd.concat([_probe("smollm2-135m", 0.9), _probe("sort-gpt2:student", 0.02), _probe("tiny-llama", 5.0)])
    students = _student_probes(rows).set_index("pair")["kl_fwd_mean"].to_dict()
    assert students == {"smollm2-concise": 0.9, "sort-gpt2": 0.02}  # tiny-llama is no pair's student
