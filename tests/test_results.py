"""The tidy results table: lossless round trip, append without loss, atomic replace."""

import pandas as pd
import pytest

import mismatch
from mismatch.errors import InputError
from mismatch.results import per_layer, read_results, summaries, to_rows, write_results
from tests.conftest import random_ids


@pytest.fixture(scope="module")
def result(tiny):
    return mismatch.probe(tiny("tiny-llama", 0), tiny("tiny-llama", 1), random_ids(2, 7))


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_round_trip_restores_every_number(result, tmp_path, suffix):
    path = write_results(to_rows(result, {"cand_dtype": "fp32", "seed": 0}), tmp_path / f"r{suffix}")
    rows = read_results(path)
    tok = rows[rows["level"] == "token"].pivot_table(index=["seq", "pos", "token"], columns="metric",
                                                     values="value").reset_index()
    for col in ("kl_fwd", "kl_rev", "tv", "logp_ref", "logp_cand", "is_ratio", "k3"):
        assert tok[col].tolist() == pytest.approx(result.per_token[col].tolist(), rel=1e-12, abs=0), col
    assert tok["top1_agree"].astype(bool).tolist() == result.per_token["top1_agree"].tolist()
    summ = summaries(rows).iloc[0]
    for key, value in result.summary.items():
        assert summ[key] == pytest.approx(value, rel=1e-12), key
    assert summ["reference"] == "tiny-llama" and summ["seed"] == 0
    lay = per_layer(rows)
    assert lay["layer"].tolist() == result.per_layer["layer"].tolist()
    assert lay["sqnr_db"].tolist() == pytest.approx(result.per_layer["sqnr_db"].tolist(), rel=1e-12)
    for col in ("git_sha", "torch_version", "transformers_version", "timestamp", "run_id"):
        assert rows[col].notna().all()


def test_append_keeps_earlier_runs_and_overwrite_replaces(result, tmp_path):
    path = tmp_path / "r.parquet"
    first = to_rows(result, {})
    write_results(first, path)
    write_results(to_rows(result, {}), path)
    assert read_results(path)["run_id"].nunique() == 2
    write_results(first, path, overwrite=True)
    assert read_results(path)["run_id"].unique().tolist() == [first["run_id"].iloc[0]]
    assert not list(tmp_path.glob(".*tmp"))


def test_bad_paths(result, tmp_path):
    with pytest.raises(InputError, match=r"\.parquet or \.csv"):
        write_results(to_rows(result, {}), tmp_path / "r.json")
    with pytest.raises(InputError, match="not found"):
        read_results(tmp_path / "missing.parquet")


def test_rows_are_tidy(result):
    rows = to_rows(result, {})
    assert set(rows["level"]) == {"summary", "layer", "token"}
    assert len(rows[rows["level"] == "token"]) == len(result.per_token) * 8
    assert rows.groupby(["level", "metric", "seq", "pos", "layer"], dropna=False).size().max() == 1
    assert isinstance(rows, pd.DataFrame) and rows["value"].dtype == "float64"
