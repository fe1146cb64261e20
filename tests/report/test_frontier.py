"""The cost frontier from a hand-made study: costs on the student's architecture, cheapest marks."""

import pandas as pd
import pytest

import mismatch
from mismatch.admission.cost import rollout_cost
from mismatch.pairs.registry import member_spec
from mismatch.report.frontier import frontier_table, student_skeleton
from tests.admission.test_thresholds import study  # noqa: F401  (the fixture)


def test_the_skeleton_has_the_students_shapes_and_no_weights():
    real = mismatch.load(member_spec("sort-gpt2:student")).model
    skeleton = student_skeleton("sort-gpt2")
    assert next(skeleton.parameters()).is_meta
    assert {n: p.shape for n, p in skeleton.named_parameters()} == {n: p.shape for n, p in real.named_parameters()}


def test_frontier_costs_levels_and_marks_the_cheapest(study):  # noqa: F811
    table = frontier_table(study).set_index(["pair", "level"])
    real = mismatch.load(member_spec("sort-gpt2:student")).model
    int4 = rollout_cost(real, "int4:group128", rollout_share=0.5)  # no rollout_s rows: the share defaults to ½
    row = table.loc[("sort-gpt2", "int4:group128")]
    assert row["weight_bytes"] == pytest.approx(int4.weight_bytes) and row["step_wall"] == pytest.approx(int4.step_wall)
    assert table.loc[("sort-gpt2", 2), "step_wall"] == pytest.approx(0.5)  # stale:2 overlaps: max(½, ½)
    assert table.loc[("sort-gpt2", 1.0), "weight_bytes"] == 1.0  # noise: a full-precision copy
    assert row["cheapest"] == "tolerated, by means"  # int4 is the cheapest, and it kept up
    assert pd.isna(table.loc[("copy-x", "int4:group128"), "weight_bytes"])  # not a pair here: cost unknown
