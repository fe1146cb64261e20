"""The cost frontier from a hand-made study: costs on the student's architecture, cheapest marks."""

import pandas as pd
import pytest

import mismatch
from mismatch.rollout.cost import rollout_cost
from mismatch.pairs.catalog import member_spec
from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_cost_factors
from mismatch.pairs.load import student_architecture
from mismatch.report.frontier import frontier_table
from tests.admission.test_thresholds import study  # noqa: F401  (the fixture)


def test_the_skeleton_has_the_students_shapes_and_no_weights():
    real = mismatch.load(member_spec("sort-gpt2:student")).model
    skeleton = student_architecture("sort-gpt2")
    assert next(skeleton.parameters()).is_meta
    assert {n: p.shape for n, p in skeleton.named_parameters()} == {n: p.shape for n, p in real.named_parameters()}


def _with_costs(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows as `run_all` writes them: each run's cost factors beside its provenance."""
    out = []
    for _, run in rows.groupby("run_id", sort=False):
        first = run.iloc[0]
        config = OPDConfig(pair=first["pair"], rollout=first["rollout"], staleness=int(first["staleness"]),
                           layers=first["layers"])
        out.append(run.assign(**run_cost_factors(config)))
    return pd.concat(out, ignore_index=True)


def test_frontier_costs_levels_and_marks_the_cheapest(study):  # noqa: F811
    table = frontier_table(_with_costs(study)).set_index(["pair", "level"])
    real = mismatch.load(member_spec("sort-gpt2:student")).model
    int4 = rollout_cost(real, "int4:group128", rollout_share=0.5)  # no rollout_s rows: the share defaults to ½
    row = table.loc[("sort-gpt2", "int4:group128")]
    assert row["weight_bytes"] == pytest.approx(int4.weight_bytes) and row["step_wall"] == pytest.approx(int4.step_wall)
    assert table.loc[("sort-gpt2", 2), "step_wall"] == pytest.approx(0.5)  # stale:2 overlaps: max(½, ½)
    assert table.loc[("sort-gpt2", 1.0), "weight_bytes"] == 1.0  # noise: a full-precision copy
    assert row["cheapest"] == "tolerated, by means"  # int4 is the cheapest, and it kept up
    assert pd.isna(table.loc[("copy-x", "int4:group128"), "weight_bytes"])  # not a pair here: cost unknown


def test_rows_without_stored_cost_factors_are_not_costed_and_no_model_is_built(study, monkeypatch):  # noqa: F811
    """Rows written before the factors were stored: every cost is NaN (said in the Markdown), verdicts stay."""
    from mismatch.pairs import load

    monkeypatch.setattr(load, "student_architecture", lambda *a: pytest.fail("the report built a model"))
    table = frontier_table(study)
    assert table["weight_bytes"].isna().all() and table["verdict"].notna().all() and len(table) > 3


def test_the_markdown_marks_uncosted_levels(study):  # noqa: F811
    from mismatch.report.frontier import UNCOSTED, frontier_markdown
    from mismatch.verdict import Tolerance

    text = frontier_markdown(frontier_table(study), tolerance=Tolerance())
    assert UNCOSTED in text and "×nan" not in text
    table = frontier_table(_with_costs(study)).set_index(["pair", "level"])
    costed = frontier_markdown(table.reset_index(), tolerance=Tolerance())
    assert f"| ×{table.loc[('sort-gpt2', 'int4:group128'), 'weight_bytes']:.3f} |" in costed  # a factor, as ×x
    assert UNCOSTED in costed  # copy-x is no pair here: its levels stay uncosted, and the note says so
