"""OPD reports: verdicts grouped against the matching clean run, curves and table written."""

import math

import pandas as pd
import pytest

from mismatch.report_opd import is_opd, opd_verdicts, rollout_label, write_opd_report


def _run(rollout: str, staleness: int, kl: dict[int, float], acc: dict[int, float], mismatch: list[float],
         seed: int = 0) -> pd.DataFrame:
    rows = [{"step": s, "metric": "heldout_rkl", "value": v} for s, v in kl.items()]
    rows += [{"step": s, "metric": "heldout_accuracy", "value": v} for s, v in acc.items()]
    rows += [{"step": i + 1, "metric": "mismatch_kl", "value": v} for i, v in enumerate(mismatch)]
    return pd.DataFrame(rows).assign(run_id=f"{rollout}|{staleness}|{seed}", pair="sort-gpt2", rollout=rollout,
                                     staleness=staleness, loss="full-rkl", seed=seed, steps=2, batch_size=4,
                                     lr=3e-4, temperature=1.0, tis_cap="")


@pytest.fixture
def rows():
    return pd.concat([
        _run("none", 0, {0: 2.6, 2: 2.0}, {0: 0.27, 2: 0.35}, [0.0, 0.0]),
        _run("int4:group128", 0, {0: 2.6, 2: 2.5}, {0: 0.27, 2: 0.30}, [0.4, 0.6]),
        _run("stale:4", 0, {0: 2.6, 2: 2.1}, {0: 0.27, 2: 0.34}, [0.01, 0.03]),
        _run("noise:0.1", 0, {0: 2.6, 2: 2.1}, {0: 0.27, 2: 0.34}, [0.2, 0.2], seed=1),  # no clean run for seed 1
    ], ignore_index=True)


def test_verdicts_against_the_clean_run_of_the_same_group(rows):
    table = opd_verdicts(rows).set_index("rollout")
    assert list(table.index) == ["int4:group128", "stale:4"]
    int4, stale = table.loc["int4:group128"], table.loc["stale:4"]
    assert int4["kl_ratio"] == pytest.approx(2.5 / 2.0) and int4["acc_delta"] == pytest.approx(-0.05)
    assert int4["mismatch_kl"] == pytest.approx(0.5) and not int4["tolerated"]
    assert stale["kl_ratio"] == pytest.approx(1.05) and stale["acc_delta"] == pytest.approx(-0.01)
    assert stale["tolerated"]
    assert not opd_verdicts(rows, kl_tol=0.01).set_index("rollout").loc["stale:4", "tolerated"]
    assert math.isnan(table.loc["stale:4", "mismatch_logp_abs_diff_mean"])  # not in these rows


def test_report_files(rows, tmp_path):
    curves, md = write_opd_report(rows, tmp_path)
    assert curves.stat().st_size > 10_000
    text = md.read_text()
    assert "| int4:group128 |" in text and "**no**" in text and "| stale:4 |" in text
    assert "final held-out reverse KL 2.000 nats, accuracy 35.0%" in text


def test_labels_and_detection(rows):
    assert [rollout_label(r, k) for r, k in [("none", 0), ("", 4), ("int4:group128", 0), ("noise:0.1", 2)]] == [
        "clean", "stale:4", "int4:group128", "noise:0.1 + stale:2"]
    assert is_opd(rows)
    assert not is_opd(rows.assign(level="summary"))
