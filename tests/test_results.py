"""The results dataset: one schema for every run kind, parts that are never rewritten, content-hash
run ids, lossless round trips (directory, .parquet, .csv), and older files still readable."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

import mismatch
from mismatch.errors import InputError
from mismatch.opd.config import OPDConfig
from mismatch.probes.runs import rows_of
from mismatch.results import FRONT, ResultsWriter, per_layer, read_results, run_id, summaries, tidy
from tests.conftest import opd_rows, random_ids



@pytest.fixture(scope="module")
def result(tiny):
    return mismatch.probe(tiny("tiny-llama", 0), tiny("tiny-llama", 1), random_ids(2, 7))


def _probe(result, **config):
    return tidy(rows_of(result), kind="probe", config={"reference": "tiny-llama", "seed": 0, **config})


def _opd(config: OPDConfig, values: dict[int, float]):
    return opd_rows(config, {"heldout_rkl": values})


@pytest.mark.parametrize("dest", ["dir", "r.parquet", "r.csv"])
def test_round_trip_restores_every_number(result, tmp_path, dest):
    path = ResultsWriter(tmp_path / dest).write(_probe(result, cand_dtype="fp32"))
    rows = read_results(tmp_path / dest)
    assert path.exists() and list(rows.columns[:len(FRONT)]) == list(FRONT)
    tok = rows[rows["level"] == "token"].pivot_table(index=["seq", "pos", "token"], columns="metric",
                                                     values="value").reset_index()
    for col in ("kl_fwd", "kl_rev", "tv", "logp_ref", "logp_cand", "is_ratio", "k3"):
        assert tok[col].tolist() == pytest.approx(result.per_token[col].tolist(), rel=1e-12, abs=0), col
    assert tok["top1_agree"].astype(bool).tolist() == result.per_token["top1_agree"].tolist()
    summ = summaries(rows).iloc[0]
    for key, value in result.summary.items():
        assert summ[key] == pytest.approx(value, rel=1e-12), key
    assert (summ["kind"], summ["reference"], summ["seed"]) == ("probe", "tiny-llama", 0)
    lay = per_layer(rows)
    assert lay["layer"].tolist() == result.per_layer["layer"].tolist()
    assert lay["sqnr_db"].tolist() == pytest.approx(result.per_layer["sqnr_db"].tolist(), rel=1e-12)
    for col in ("git_sha", "torch_version", "transformers_version", "timestamp", "run_id"):
        assert rows[col].notna().all()


def test_run_id_is_a_content_hash_of_the_configuration():
    base = dataclasses.asdict(OPDConfig(pair="sort-gpt2"))
    assert run_id("opd", base) == run_id("opd", dict(reversed(list(base.items()))))  # key order is irrelevant
    ids = {run_id("opd", {**base, name: value}) for name, value in
           [("seed", 1), ("top_p", 0.9), ("decay", "constant"), ("rollout", "fp8-e4m3:channel")]}
    assert len(ids | {run_id("opd", base)}) == 5  # every field changes it
    assert run_id("probe", base) != run_id("opd", base)
    # a configuration read back from a table (numpy scalars, integral floats, NaN) gives the same id
    assert run_id("opd", {**base, "steps": np.int64(120), "lr": 0.001, "top_p": float("nan")}) == run_id("opd", base)
    assert run_id("opd", {**base, "lr": 1}) == run_id("opd", {**base, "lr": 1.0})
    with pytest.raises(InputError, match="unknown run kind"):
        run_id("sweep", base)


def test_parts_are_appended_never_rewritten_and_both_kinds_share_one_dataset(result, tmp_path):
    writer = ResultsWriter(tmp_path / "ds")
    first = writer.write(_probe(result))
    before = (first.read_bytes(), first.stat().st_mtime_ns)
    cfg = OPDConfig(pair="sort-gpt2")
    opd_parts = [writer.write(_opd(cfg, {0: 2.0})), writer.write(_opd(cfg, {10: 1.5}))]  # two flushes of one run
    assert (first.read_bytes(), first.stat().st_mtime_ns) == before
    hidden = {p.name for p in (tmp_path / "ds").glob(".*")}  # no temporary file stays; `.locks`: the run locks
    assert len(list((tmp_path / "ds").glob("*.parquet"))) == 3 and hidden <= {".locks"}
    rows = read_results(tmp_path / "ds")
    assert rows.groupby("kind")["run_id"].nunique().to_dict() == {"opd": 1, "probe": 1}
    opd = rows[rows["kind"] == "opd"]
    assert opd["step"].tolist() == [0, 10] and opd["value"].tolist() == [2.0, 1.5]
    assert (opd["level"] == "step").all() and opd["seq"].isna().all()
    # the same run written again by a new writer: its old parts stay until the new copy is finished,
    # and readers see one run meanwhile (the newest row of each step and metric)
    again = ResultsWriter(tmp_path / "ds")
    again.write(_opd(cfg, {0: 2.5}))
    assert all(p.exists() for p in opd_parts)
    opd = read_results(tmp_path / "ds").query("kind == 'opd'").sort_values("step")
    assert opd["step"].tolist() == [0, 10] and opd["value"].tolist() == [2.5, 1.5]
    again.finish("opd", opd["run_id"].iloc[0])
    assert all(not p.exists() for p in opd_parts) and first.exists()
    assert read_results(tmp_path / "ds").groupby("kind").size().to_dict() == {"opd": 1, "probe": len(rows) - 2}
    fresh = ResultsWriter(tmp_path / "ds", overwrite=True)
    fresh.write(_opd(cfg, {5: 1.0}))
    assert first.exists()  # overwrite: the earlier content stays until every run of the writer ended
    fresh.close()
    assert read_results(tmp_path / "ds")["step"].tolist() == [5] and not first.exists()


def test_an_overwrite_that_fails_loses_nothing(result, tmp_path):
    """`--overwrite` replaces the destination only once the whole writing ended: a failure or an
    interrupt half-way leaves every earlier run readable (with the new runs written so far)."""
    cfg = OPDConfig(pair="sort-gpt2")
    for dest in (tmp_path / "ds", tmp_path / "r.parquet", tmp_path / "r.csv"):
        with ResultsWriter(dest) as w:
            w.write(_probe(result, seed=0))
        old = read_results(dest)
        for interrupt in (RuntimeError("boom"), KeyboardInterrupt()):
            with pytest.raises(type(interrupt)):
                with ResultsWriter(dest, overwrite=True) as w:
                    w.write(_opd(cfg, {0: 2.0}))
                    raise interrupt
            back = read_results(dest)
            assert set(back["run_id"]) == set(old["run_id"]) | {_opd(cfg, {0: 2.0})["run_id"].iloc[0]}
            kept = back[back["run_id"].isin(old["run_id"])].reset_index(drop=True)
            pd.testing.assert_frame_equal(kept[old.columns], old, check_dtype=False)
        with ResultsWriter(dest, overwrite=True) as w:  # the same writing, ending well: the old runs go
            w.write(_opd(cfg, {0: 2.0}))
        assert set(read_results(dest)["kind"]) == {"opd"}


def test_csv_keeps_ids_and_block_scopes_as_text(result, tmp_path):
    """Hex ids that look like numbers (`012345…`, `1e5…`) and block scopes (`007`) survive a CSV file."""
    rows = _probe(result, layers="007").assign(git_sha="012345678901", run_id="1e50000000000000")
    ResultsWriter(tmp_path / "r.csv").write(rows)
    back = read_results(tmp_path / "r.csv")
    assert (back["git_sha"].unique().tolist(), back["run_id"].unique().tolist()) == (["012345678901"], ["1e50000000000000"])
    assert back["layers"].unique().tolist() == ["007"] and str(back["step"].dtype) == "Int64"


def test_single_files_append_and_overwrite(result, tmp_path):
    path = tmp_path / "r.parquet"
    ResultsWriter(path).write(_probe(result, seed=0))
    ResultsWriter(path).write(_probe(result, seed=1))
    ResultsWriter(path).write(_probe(result, seed=1))  # the same run again: read back once
    assert read_results(path).groupby("run_id").size().tolist() == [len(_probe(result))] * 2
    with ResultsWriter(path, overwrite=True) as w:
        w.write(_probe(result, seed=0))
    assert read_results(path)["seed"].unique().tolist() == [0]
    assert not list(tmp_path.glob(".*tmp"))


def test_older_result_files_still_load(result, tmp_path):
    """Files written before `kind` existed: probe files (a `level` column, random run ids) and OPD
    `metrics.parquet` (step/metric/value and config columns, no `level`)."""
    old_probe = _probe(result).drop(columns=["kind", "step"]).assign(run_id="abc123")
    old_probe.to_csv(tmp_path / "old.csv", index=False)
    old_opd = pd.DataFrame({"step": [0, 1], "metric": ["heldout_rkl", "loss"], "value": [2.0, 1.0],
                            "run_id": "sort-gpt2|none|K=0|full-rkl|seed=0", "pair": "sort-gpt2", "rollout": "none"})
    old_opd.to_parquet(tmp_path / "metrics.parquet", index=False)
    probe_rows = read_results(tmp_path / "old.csv")
    assert set(probe_rows["kind"]) == {"probe"} and len(probe_rows) == len(old_probe)
    assert summaries(probe_rows).iloc[0]["kl_fwd_mean"] == pytest.approx(result.summary["kl_fwd_mean"], rel=1e-12)
    opd_rows = read_results(tmp_path / "metrics.parquet")
    assert set(opd_rows["kind"]) == {"opd"} and set(opd_rows["level"]) == {"step"}
    assert opd_rows["step"].tolist() == [0, 1]
    (tmp_path / "ds").mkdir()
    old_opd.to_parquet(tmp_path / "ds" / "metrics.parquet", index=False)  # an old file inside a dataset
    ResultsWriter(tmp_path / "ds").write(_probe(result))
    assert read_results(tmp_path / "ds").groupby("kind").size().to_dict() == {"opd": 2, "probe": len(old_probe)}


def test_bad_paths(result, tmp_path):
    (tmp_path / "r.parquet").mkdir()
    with pytest.raises(InputError, match="is a directory, not a results file"):
        ResultsWriter(tmp_path / "r.parquet")
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is a file, not a results directory"):
        ResultsWriter(tmp_path / "f")
    with pytest.raises(InputError, match="must end in .parquet or .csv"):
        read_results(tmp_path / "f")
    for missing in ("missing.parquet", "missing-dir"):
        with pytest.raises(InputError, match="results not found"):
            read_results(tmp_path / missing)
    dotted = ResultsWriter(tmp_path / "smollm2-1.7b").write(_probe(result))  # a directory, despite the dot
    assert dotted.parent == tmp_path / "smollm2-1.7b" and len(read_results(dotted.parent)) == len(_probe(result))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no parquet parts"):
        read_results(tmp_path / "empty")


def test_rows_are_tidy(result):
    rows = _probe(result)
    assert set(rows["level"]) == {"summary", "layer", "token"}
    assert len(rows[rows["level"] == "token"]) == len(result.per_token) * 8
    assert rows.groupby(["level", "metric", "seq", "pos", "layer"], dropna=False).size().max() == 1
    assert rows["value"].dtype == "float64" and rows["run_id"].nunique() == 1


def test_a_summary_metric_under_its_earlier_name_reads_under_the_new_one(result, tmp_path):
    """`ppl_ratio` (mismatch ≤ 0.2.0's probe summary, rollout over training perplexity) looked like verl's
    `rollout_corr/ppl_ratio`, its inverse: it reads back as `ppl_cand_over_ref`, the same number."""
    rows = _probe(result)
    old = rows.assign(metric=rows["metric"].replace({"ppl_cand_over_ref": "ppl_ratio"}))
    assert (old["metric"] == "ppl_ratio").sum() == 1
    ResultsWriter(tmp_path / "old.parquet").write(old)
    back = summaries(read_results(tmp_path / "old.parquet")).iloc[0]
    assert "ppl_ratio" not in back and back["ppl_cand_over_ref"] == result.summary["ppl_cand_over_ref"]


def test_a_writer_appends_by_default_and_finishing_a_run_it_never_wrote_removes_nothing(result, tmp_path):
    dest = tmp_path / "ds"
    with ResultsWriter(dest) as w:
        w.write(_probe(result, seed=0))
    other = _probe(result, seed=1)
    with ResultsWriter(dest) as w:
        w.write(other)
        w.finish("probe", _probe(result, seed=0)["run_id"].iloc[0])  # not this writer's run: its parts stay
        w.finish("probe", other["run_id"].iloc[0])
    assert read_results(dest)["seed"].nunique() == 2 and len(list(dest.glob("*.parquet"))) == 2


def test_a_directory_and_a_single_file_read_the_same_rows_with_the_same_dtypes(tmp_path):
    """One run caps its responses, its neighbour leaves the cap unset: read from a dataset directory
    (parts) or from one file, the rows, their dtypes and the unset value (`<NA>`) are the same."""
    capped = _opd(OPDConfig(pair="sort-gpt2", max_new_tokens=32), {0: 1.0, 1: 0.5})
    free = _opd(OPDConfig(pair="sort-gpt2", seed=1), {0: 1.0, 1: 0.75})
    for dest in ("dir", "r.parquet"):
        writer = ResultsWriter(tmp_path / dest)
        writer.write(capped)
        writer.write(free)
    by_dir, by_file = (read_results(tmp_path / d).sort_values(["seed", "step"], ignore_index=True)
                       for d in ("dir", "r.parquet"))
    assert dict(by_dir.dtypes) == dict(by_file.dtypes)
    assert by_file["max_new_tokens"].dtype == "Int64"
    assert by_file.groupby("seed")["max_new_tokens"].first(skipna=False).isna().tolist() == [False, True]
    pd.testing.assert_frame_equal(by_dir, by_file)
