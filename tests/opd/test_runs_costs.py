"""`add_cost_factors`: old OPD rows get the factors a new run writes, nothing else changes."""

import dataclasses

import pandas as pd
import pytest

from mismatch.opd.runs import add_cost_factors, run_cost_factors
from mismatch.results import ResultsWriter, read_results
from mismatch.rollout.cost import COST_FACTOR_COLUMNS
from tests.analysis.test_tolerance import BASE, _run


def test_old_rows_get_the_factors_a_new_run_writes_and_nothing_else_changes(tmp_path):
    configs = [dataclasses.replace(BASE, rollout=r) for r in ("none", "int4:group128", "stale:2")]
    out = tmp_path / "old"
    with ResultsWriter(out) as writer:
        for config in configs:
            writer.write(_run(config, 0.4, 1.0))
    before = read_results(out)
    assert not set(COST_FACTOR_COLUMNS) & set(before.columns)  # the premise: rows of before the factors
    assert add_cost_factors(out) == 3
    after = read_results(out)
    pd.testing.assert_frame_equal(after[before.columns], before)  # every other cell as it was
    for config in configs:
        got = after.loc[after["rollout"] == config.rollout, list(COST_FACTOR_COLUMNS)].drop_duplicates()
        assert len(got) == 1 and dict(got.iloc[0]) == pytest.approx(run_cost_factors(config))
    assert add_cost_factors(out) == 0  # nothing left to add: nothing rewritten
    int4 = after.loc[after["rollout"] == "int4:group128", "cost_weight_bytes"].iloc[0]
    assert 0 < int4 < 0.5  # int4 weights: well under half the fp32 bytes (the exact factor: test_rollout_cost.py)
