"""OPD reports: every run judged against the clean run that shares every non-rollout field, the
verdict numbers recomputed from the rows, and the plotted curves equal to the data."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from mismatch.verdict import Tolerance
from mismatch.opd.config import COMPARISON_FIELDS, ROLLOUT_FIELDS, OPDConfig
from mismatch.rollout.spec import rollout_label
from mismatch.analysis.twins import verdict_table
from mismatch.report.opd import curves_figure, write_opd_report
from mismatch.results import ResultsWriter, read_results
from tests.conftest import opd_rows

BASE = OPDConfig(pair="sort-gpt2", steps=2, batch_size=4, lr=3e-4)


def _run(config: OPDConfig, kl: dict[int, float], acc: dict[int, float], mismatch: list[float]) -> pd.DataFrame:
    return opd_rows(config, {"heldout_rkl": kl, "heldout_accuracy": acc,
                             "mismatch_kl": {i + 1: v for i, v in enumerate(mismatch)}})


def _with(**fields) -> OPDConfig:
    return dataclasses.replace(BASE, **fields)


@pytest.fixture
def rows():
    return pd.concat([
        _run(BASE, {0: 2.6, 2: 2.0}, {0: 0.27, 2: 0.35}, [0.0, 0.0]),
        _run(_with(rollout="int4:group128"), {0: 2.6, 2: 2.5}, {0: 0.27, 2: 0.30}, [0.4, 0.6]),
        _run(_with(rollout="stale:4"), {0: 2.6, 2: 2.1}, {0: 0.27, 2: 0.34}, [0.01, 0.03]),
        _run(_with(rollout="noise:0.1", seed=1), {0: 2.6, 2: 2.1}, {0: 0.27, 2: 0.34}, [0.2, 0.2]),  # no clean seed 1
    ], ignore_index=True)


def _slow_verdicts(rows: pd.DataFrame, kl_tol: float, acc_tol: float) -> dict[str, tuple]:
    """Per non-clean run with a clean twin (every field but rollout/staleness/layers equal): KL ratio,
    accuracy delta, mean mismatch_kl and the verdict, from the raw rows."""
    out = {}
    configs = rows.drop_duplicates("run_id").set_index("run_id")
    fields = [f.name for f in dataclasses.fields(OPDConfig) if f.name not in ("rollout", "staleness", "layers")]

    def final(rid, metric):
        r = rows[(rows.run_id == rid) & (rows.metric == metric)]
        return r.sort_values("step")["value"].iloc[-1]

    for rid, cfg in configs.iterrows():
        if cfg["rollout"] == "none":
            continue
        twins = [c for c, other in configs.iterrows() if other["rollout"] == "none"
                 and all(str(other[f]) == str(cfg[f]) for f in fields)]
        if len(twins) != 1:
            continue
        ratio = final(rid, "heldout_rkl") / final(twins[0], "heldout_rkl")
        delta = final(rid, "heldout_accuracy") - final(twins[0], "heldout_accuracy")
        mean_kl = rows[(rows.run_id == rid) & (rows.metric == "mismatch_kl")]["value"].mean()
        out[cfg["rollout"]] = (ratio, delta, mean_kl, bool(ratio <= 1 + kl_tol and delta >= -acc_tol))
    return out


@pytest.mark.parametrize("kl_tol,acc_tol", [(0.10, 0.02), (0.01, 0.02), (0.10, 0.10)])
def test_verdict_numbers_equal_a_recomputation_from_the_rows(rows, kl_tol, acc_tol):
    table = verdict_table(rows, tolerance=Tolerance(acc_tol=acc_tol, kl_tol=kl_tol)).set_index("rollout")
    expected = _slow_verdicts(rows, kl_tol, acc_tol)
    judged = table[~table["clean"] & (table["baseline"] != "")]
    assert sorted(judged.index) == sorted(expected) == ["int4:group128", "stale:4"]
    for label, (ratio, delta, mean_kl, ok) in expected.items():
        row = judged.loc[label]
        assert (row["kl_ratio"], row["acc_delta"], row["mismatch_kl"]) == pytest.approx((ratio, delta, mean_kl))
        assert row["kept_up"] == ok
    assert table.loc["noise:0.1", "kept_up"] is None and table.loc["noise:0.1", "baseline"] == ""


@pytest.mark.parametrize("field,value", [("top_p", 0.9), ("decay", "constant"), ("warmup_steps", 0),
                                         ("eval_prompts", 256), ("max_new_tokens", 8)])
def test_each_run_meets_the_clean_run_that_differs_only_in_its_rollout(field, value):
    """Two studies that differ only in `field` (which the old hand list of 8 grouping fields ignored):
    each mismatched run must be judged against its own study's clean run, never the other's."""
    other = _with(**{field: value})
    rows = pd.concat([
        _run(BASE, {2: 2.0}, {2: 0.40}, [0.0, 0.0]),
        _run(_with(rollout="fp8-e4m3"), {2: 2.1}, {2: 0.39}, [0.01, 0.01]),
        _run(other, {2: 3.0}, {2: 0.20}, [0.0, 0.0]),
        _run(dataclasses.replace(other, rollout="fp8-e4m3"), {2: 3.15}, {2: 0.18}, [0.01, 0.01]),
    ], ignore_index=True)
    table = verdict_table(rows)
    judged = table[~table["clean"]]
    assert judged["kl_ratio"].tolist() == pytest.approx([2.1 / 2.0, 3.15 / 3.0])
    assert judged["acc_delta"].tolist() == pytest.approx([-0.01, -0.02])
    clean_ids = table[table["clean"]]["run_id"].tolist()
    assert judged["baseline"].tolist() == clean_ids


@pytest.mark.parametrize("dest", ["ds", "r.csv", "r.parquet"])
def test_verdicts_are_the_same_after_a_round_trip_through_storage(tmp_path, dest):
    """Studies that differ in an optional field (None in one, a number in another) written to disk and
    read back (nullable integer columns, CSV text) still find their own clean runs."""
    other = _with(max_new_tokens=8, top_p=0.9)
    frames = [_run(BASE, {2: 2.0}, {2: 0.40}, [0.0, 0.0]), _run(_with(rollout="fp8-e4m3"), {2: 2.1}, {2: 0.39}, [0.01, 0.01]),
              _run(other, {2: 3.0}, {2: 0.20}, [0.0, 0.0]),
              _run(dataclasses.replace(other, rollout="fp8-e4m3"), {2: 3.15}, {2: 0.18}, [0.01, 0.01])]
    writer = ResultsWriter(tmp_path / dest)
    for frame in frames:
        writer.write(frame)
    expected = verdict_table(pd.concat(frames, ignore_index=True))
    got = verdict_table(read_results(tmp_path / dest))
    assert got["run_id"].tolist() == expected["run_id"].tolist()
    assert got["baseline"].tolist() == expected["baseline"].tolist()
    assert got["kl_ratio"].tolist() == pytest.approx([1.0, 2.1 / 2.0, 1.0, 3.15 / 3.0])


def test_comparison_fields_are_every_config_field_but_the_rollout_ones_and_the_pair_data():
    names = {f.name for f in dataclasses.fields(OPDConfig)}
    assert set(COMPARISON_FIELDS) == names - set(ROLLOUT_FIELDS) | {"pair_sha256"}
    assert len(COMPARISON_FIELDS) == len(names) - 3 + 1


def test_report_files_hold_the_verdict_numbers(rows, tmp_path):
    curves, md = write_opd_report(rows, tmp_path)
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = ("| pair | rollout | mismatch_kl | mismatch_logp_abs_diff_mean | heldout_rkl | kl_ratio | heldout_accuracy "
              "| acc_delta | status |")  # one seed among the judged runs: no seed column
    assert header in md.read_text().splitlines()
    lines = {line.split(" | ")[1]: line for line in md.read_text().splitlines() if line.startswith("| sort-gpt2")}
    assert set(lines) == {"int4:group128", "stale:4"}
    # one seed is never a verdict, however far the numbers are (the tolerance table's rule)
    assert lines["int4:group128"].endswith("| 0.5 | nan | 2.500 | 1.250 | 30.0% | -5.0 pts | uncertain (1 seed) |")
    assert lines["stale:4"].endswith("| 0.02 | nan | 2.100 | 1.050 | 34.0% | -1.0 pts | uncertain (1 seed) |")
    assert ("final held-out reverse KL 2.000 nats, accuracy 35.0% (step 0: 2.600 nats, 27.0%; heldout_accuracy)"
            in md.read_text())


def test_plotted_curves_are_the_data(rows):
    fig = curves_figure(rows)
    kl_ax, acc_ax = fig.axes
    for ax, metric in ((kl_ax, "heldout_rkl"), (acc_ax, "heldout_accuracy")):
        plotted = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
        for rid, run in rows.groupby("run_id", sort=False):
            first = run.iloc[0]
            curve = run[run.metric == metric].sort_values("step")
            label = f"{rollout_label(first)} (seed {first['seed']})"  # 2 seeds
            assert plotted[label] == (curve["step"].tolist(), curve["value"].tolist()), (metric, label)
    assert len(kl_ax.lines) == rows["run_id"].nunique() == 4
    assert [line.get_color() for line in kl_ax.lines if line.get_label().startswith("clean")] == ["black"]
    assert np.isclose(kl_ax.lines[0].get_linewidth(), 2.5)


def test_labels():
    """One label for a rollout configuration, wherever its fields come from: a config, a result row, a probe."""
    cases = [("none", 0, "linear"), ("", 4, "linear"), ("int4:group128", 0, "linear"), ("noise:0.1", 2, "linear"),
             ("int4:group128", 0, "attn"), ("none", 0, "attn")]
    want = ["clean", "stale:4", "int4:group128", "noise:0.1 + stale:2", "int4:group128 [attn]", "clean"]
    assert [rollout_label({"rollout": r, "staleness": k, "layers": s}) for r, k, s in cases] == want
    configs = [OPDConfig(pair="sort-gpt2", rollout=r or "none", staleness=k, layers=s) for r, k, s in cases]
    assert [c.label for c in configs] == want  # an OPDConfig's label is the same function of its fields


def test_verdicts_of_several_seeds_name_the_seed(tmp_path):
    rows = pd.concat([_run(_with(seed=s, rollout=r), {2: kl}, {2: acc}, [0.0, 0.0])
                      for s in (0, 1) for r, kl, acc in (("none", 2.0, 0.4), ("stale:1", 2.4 + s, 0.3))],
                     ignore_index=True)
    _, md = write_opd_report(rows, tmp_path)
    table = [line for line in md.read_text().splitlines() if line.startswith("| ")]
    assert table[0].startswith("| pair | rollout | seed | mismatch_kl |")
    assert [line.split(" | ")[2] for line in table[1:]] == ["0", "1"]
    assert [line.split(" | ")[6] for line in table[1:]] == [f"{2.4 / 2.0:.3f}", f"{3.4 / 2.0:.3f}"]
    assert "seed 0 / 1" in md.read_text()


def test_a_run_that_did_not_finish_is_marked_unfinished_not_final(rows, tmp_path):
    """An interrupted run (its last evaluation before `steps`) is never read as final: its status says
    where it stopped, and its level gets no verdict from it."""
    cut = rows[~((rows["rollout"] == "int4:group128") & (rows["step"] == 2))]
    _, md = write_opd_report(cut, tmp_path)
    line = next(l for l in md.read_text().splitlines() if l.startswith("| sort-gpt2 | int4:group128"))
    assert line.endswith("| **unfinished at step 0 of 2** |")
    from mismatch.analysis.tolerance import level_table, run_table

    assert "int4:group128" not in set(level_table(run_table(cut))["level"])


def test_a_run_whose_heldout_kl_ends_far_above_its_start_is_marked_diverged(rows, tmp_path):
    """The student collapsed (held-out KL 2.6 → 5.0, ×1.9 > 1.5): said in the status, wherever it is shown."""
    from mismatch.analysis.twins import diverged
    from mismatch.analysis.tolerance import run_verdicts

    collapsed = pd.concat([rows, _run(_with(rollout="fp8-e4m3"), {0: 2.6, 2: 5.0}, {0: 0.27, 2: 0.0}, [0.1, 0.1])],
                          ignore_index=True)
    table = run_verdicts(collapsed).set_index("rollout")
    assert table.loc["fp8-e4m3", "status"].startswith("diverged") and not table.loc["stale:4", "diverged"]
    assert diverged([{"step": 0, "metric": "heldout_rkl", "value": 2.0}, {"step": 9, "metric": "heldout_rkl", "value": 3.0}]) is False
    assert diverged([{"step": 0, "metric": "heldout_rkl", "value": 2.0}, {"step": 9, "metric": "heldout_rkl", "value": 3.1}]) is True
    _, md = write_opd_report(collapsed, tmp_path)
    assert "| **diverged" not in md.read_text() and "diverged (held-out KL ended > 1.5× its start)" in md.read_text()
