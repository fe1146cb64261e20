"""Probe reports, isolation-map branch included: tables and plotted series equal to the result rows."""

import numpy as np
import pytest

from mismatch.probes.runs import ProbeConfig, run_probes
from mismatch.report import report
from mismatch.report.probe import (
    isolation_map,
    kl_cdf_figure,
    layer_map_figure,
    per_layer_figure,
    probe_label,
    write_probe_report,
)
from mismatch.results import of_kind, per_layer, read_results, summaries

TEXTS = ("hello world, again", "the quick brown fox")
SPECS = ("fp8-e4m3:channel", "int4:group128")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "results"
    run_probes(ProbeConfig(reference="tiny-llama", perturb=SPECS, texts=TEXTS), out=out)
    run_probes(ProbeConfig(reference="tiny-llama", perturb=SPECS, texts=TEXTS, each_layer=True, per_layer=False),
               out=out)
    return out


def test_isolation_map_section_holds_the_per_block_numbers(dataset, tmp_path):
    rows = read_results(dataset)
    runs = summaries(rows)
    iso = runs[runs["layers"].isin(["0", "1", "2"])]
    assert len(iso) == 3 * len(SPECS)  # tiny-llama has 3 blocks
    md = (tmp_path / "summary.md")
    write_probe_report(of_kind(rows, "probe"), tmp_path)
    text = md.read_text()
    assert "## Per-layer isolation map" in text
    table = {line.split(" | ")[0][2:]: [float(c) for c in line.strip(" |").split(" | ")[1:]]
             for line in text.split("## Per-layer isolation map")[1].splitlines() if line[:3] in ("| 0", "| 1", "| 2")}
    assert sorted(table) == ["0", "1", "2"]
    for block, cells in table.items():  # printed to 4 significant digits
        by_spec = iso[iso["layers"] == block].set_index("perturb")
        expected = [by_spec.loc[s, m] for s in SPECS for m in ("kl_fwd_mean", "top1_agree")]
        assert cells == pytest.approx(expected, rel=5e-4)
    for spec in SPECS:
        kl = iso[iso["perturb"] == spec].set_index("layers")["kl_fwd_mean"]
        worst = kl.idxmax()
        assert f"- {spec}: most sensitive blocks {worst} ({kl.max():.3g})" in text
        assert f"max/median = {kl.max() / kl.median():.1f}×" in text
    # isolation runs are left out of the headline table and the per-layer plots
    headline = [line for line in text.split("## ")[0].splitlines() if line.startswith("| ") and "run" not in line]
    assert sorted(line.split(" | ")[0][2:] for line in headline) == sorted(SPECS)


def test_layer_map_plots_kl_per_block(dataset):
    runs = summaries(read_results(dataset))
    kl, top1 = isolation_map(runs[runs["layers"].isin(["0", "1", "2"])])
    fig = layer_map_figure(kl)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == list(SPECS) and ax.get_yscale() == "log"
    for line, spec in zip(ax.lines, SPECS):
        expected = runs[runs["perturb"] == spec].set_index("layers").loc[["0", "1", "2"], "kl_fwd_mean"]
        assert list(line.get_xdata()) == [0, 1, 2] and list(line.get_ydata()) == expected.tolist()
    assert top1.loc[0, SPECS[0]] == runs[(runs.layers == "0") & (runs.perturb == SPECS[0])]["top1_agree"].item()


def test_per_layer_and_kl_cdf_plot_the_rows(dataset):
    rows = read_results(dataset)
    whole = rows[rows["layers"] == "linear"]
    runs = summaries(whole).assign(run=lambda f: f.apply(probe_label, axis=1))
    layers = per_layer(whole)
    fig = per_layer_figure(layers, runs)
    (sqnr_ax,) = fig.axes  # both specs are formats on the decoder linears: one panel
    assert len(sqnr_ax.lines) == len(runs) == len(SPECS) and sqnr_ax.get_title() == "format · linear"
    for line, (_, run) in zip(sqnr_ax.lines, runs.iterrows()):
        mine = layers[layers.run_id == run["run_id"]]
        assert line.get_label() == run["run"] and list(line.get_ydata()) == mine["sqnr_db"].tolist()
        # the relative L2 error is not drawn: it is the same number
        assert np.allclose(mine["rel_l2"], 10 ** (-mine["sqnr_db"] / 20), rtol=1e-9)
    token_kl = whole[(whole.level == "token") & (whole.metric == "kl_fwd")]
    fig = kl_cdf_figure(token_kl, runs)
    assert len(fig.axes[0].lines) == token_kl["run_id"].nunique() == len(SPECS)
    for line, (rid, group) in zip(fig.axes[0].lines, token_kl.groupby("run_id", sort=False)):
        values = np.clip(np.sort(group["value"].to_numpy()), 1e-12, None)
        assert np.array_equal(line.get_xdata(), values)
        assert np.array_equal(line.get_ydata(), np.arange(1, len(values) + 1) / len(values))


def test_probe_figures_split_many_runs_into_panels_by_source_and_scope(tmp_path):
    """11 formats and 2 noise levels on the decoder linears, 2 formats on every layer: panels of at
    most MAX_LEGEND runs, grouped by source and layer scope, every run drawn exactly once."""
    from mismatch.report.common import MAX_LEGEND

    formats = ("fp8-e4m3:channel", "fp8-e4m3:tensor", "fp8-e5m2:channel", "int8:channel", "int8:group32",
               "int4:channel", "int4:group32", "int4:group128", "int3:group32", "int2:group32", "dtype:bf16")
    run_probes(ProbeConfig(reference="tiny-llama", perturb=(*formats, "noise:0.01", "noise:0.1"), texts=TEXTS),
               out=tmp_path / "r")
    run_probes(ProbeConfig(reference="tiny-llama", perturb=SPECS, layers="all", texts=TEXTS), out=tmp_path / "r")
    rows = read_results(tmp_path / "r")
    runs = summaries(rows).assign(run=lambda f: f.apply(probe_label, axis=1))
    token_kl = rows[(rows.level == "token") & (rows.metric == "kl_fwd")]
    expected_titles = ["format · linear (1/2)", "format · linear (2/2)", "noise · linear", "format · all"]
    for fig in (kl_cdf_figure(token_kl, runs), per_layer_figure(per_layer(rows), runs)):
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in axes] == expected_titles
        assert all(len(ax.get_legend().get_texts()) <= MAX_LEGEND for ax in axes)
        labels = [line.get_label() for ax in axes for line in ax.lines]  # the scope is in the title
        assert sorted(labels) == sorted(runs["perturb"]) and len(labels) == len(runs) == 15


def test_report_of_a_dataset_writes_every_probe_file(dataset, tmp_path):
    written = report([dataset], tmp_path)
    assert [p.name for p in written] == ["summary.md", "per_layer.png", "kl_cdf.png", "layer_map.png", "report.json"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written[1:-1])


def test_a_dataset_holding_only_an_isolation_map(tmp_path):
    """Only `--each-layer --no-per-layer` runs: the summary holds the map, layer_map.png is drawn,
    and no per-layer or KL plot is attempted (every run is an isolation run)."""
    run_probes(ProbeConfig(reference="tiny-gpt2", perturb=("int4:group128",), texts=TEXTS, each_layer=True,
                           per_layer=False), out=tmp_path / "map")
    written = report([tmp_path / "map"], tmp_path / "rep")
    assert [p.name for p in written] == ["summary.md", "layer_map.png", "report.json"]
    runs = summaries(read_results(tmp_path / "map")).set_index("layers")
    kl, _ = isolation_map(runs.reset_index())
    assert kl["int4:group128"].tolist() == runs.loc[["0", "1"], "kl_fwd_mean"].tolist()
    assert "## Per-layer SQNR" not in (tmp_path / "rep" / "summary.md").read_text()


def test_several_references_get_their_own_sections_and_figures(tmp_path):
    for model in ("tiny-gpt2", "tiny-llama"):
        run_probes(ProbeConfig(reference=model, perturb=("int4:group128",), texts=TEXTS), out=tmp_path / "two")
    written = report([tmp_path / "two"], tmp_path / "rep")
    assert [p.name for p in written] == ["summary.md", "per_layer_tiny-gpt2.png", "kl_cdf_tiny-gpt2.png",
                                         "per_layer_tiny-llama.png", "kl_cdf_tiny-llama.png", "report.json"]
    md = (tmp_path / "rep" / "summary.md").read_text()
    sections = md.split("## Per-layer SQNR (dB) of the hidden states — ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["tiny-gpt2", "tiny-llama"]
    assert "layers.2" not in sections[0] and "layers.2" in sections[1]  # tiny-gpt2 has 2 blocks, tiny-llama 3
