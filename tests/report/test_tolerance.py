"""Which probe runs count as a pair's student in the sweep report."""

import pandas as pd

from mismatch.report.probe import student_models, student_probes
from mismatch.results import tidy
from tests.conftest import STAMP



def _probe(reference: str, value: float) -> pd.DataFrame:
    config = {"reference": reference, "candidate": reference, "perturb": "int4:group128", "layers": "linear"}
    return tidy(pd.DataFrame([{"level": "summary", "metric": "kl_fwd_mean", "value": value}]), kind="probe",
                config=config, stamp=STAMP)


def test_a_students_own_model_spec_counts_as_that_pairs_student():
    models = student_models()
    assert models["smollm2-135m"] == "smollm2-concise"
    rows = pd.concat([_probe("smollm2-135m", 0.9), _probe("sort-gpt2:student", 0.02), _probe("tiny-llama", 5.0)])
    students = student_probes(rows).set_index("pair")["kl_fwd_mean"].to_dict()
    assert students == {"smollm2-concise": 0.9, "sort-gpt2": 0.02}  # tiny-llama is no pair's student


def test_no_static_vs_dynamic_figure_when_no_probe_shares_a_format_with_a_dynamic_level(tmp_path):
    """OPD levels of fp8 on sort-gpt2 and a student probe of int4 only: nothing pairs up, so no empty
    figure (nor matplotlib's warning about it) is written, and tolerance.md says why."""
    import dataclasses
    import warnings

    from mismatch.report.tolerance import write_tolerance_report
    from tests.analysis.test_tolerance import BASE, _run

    frames = [_run(dataclasses.replace(BASE, seed=s, rollout=r), 0.40, 1.0) for s in range(2) for r in ("none", "fp8-e4m3")]
    rows = pd.concat([*frames, _probe("sort-gpt2:student", 0.02)], ignore_index=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = [p.name for p in write_tolerance_report(rows, tmp_path)]
    assert "static_vs_dynamic.png" not in written and not (tmp_path / "static_vs_dynamic.png").exists()
    assert "No `static_vs_dynamic.png`" in (tmp_path / "tolerance.md").read_text()
    with_probe = pd.concat([rows, _probe("sort-gpt2:student", 0.01).assign(perturb="fp8-e4m3:channel",
                                                                          run_id="f" * 16)], ignore_index=True)
    assert "static_vs_dynamic.png" in [p.name for p in write_tolerance_report(with_probe, tmp_path / "b")]


def test_reports_never_build_or_check_a_pairs_weights(monkeypatch):
    """Reports read results: naming a synthetic pair's student must not verify or build (train) its weights,
    even when the recipe hash no longer matches the committed ones."""
    from mismatch.pairs import build, catalog
    from mismatch.report.probe import student_models

    def refuse(*args, **kwargs):
        raise AssertionError("a report reached synthetic_dir (which builds a pair whose recipe changed)")

    monkeypatch.setattr(build, "synthetic_dir", refuse)
    monkeypatch.setattr(build, "build_pair", refuse)
    assert student_models()["smollm2-135m"] == "smollm2-concise"
    assert str(catalog.committed_dir("sort-gpt2") / "student") in student_models()


def test_figures_have_short_titles_small_legends_and_one_colour_per_family():
    """A study with 10 stale levels and 3 formats on 9 lr settings: every panel title is the source (or
    pair · source), no legend holds more than MAX_LEGEND entries (a large family is split over panels),
    the settings sit in the caption, and each family's lines use its own colormap (format: blues)."""
    import dataclasses

    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt

    from mismatch.analysis.tolerance import level_table, run_table
    from mismatch.report.common import MAX_LEGEND
    from mismatch.report.tolerance import levels_figure, seed_curves_figure
    from mismatch.verdict import Tolerance
    from tests.analysis.test_tolerance import BASE, _run

    rollouts = ["none", *(f"stale:{k}" for k in range(1, 11)), "fp8-e4m3", "int4:group128", "int8:channel"]
    lrs = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)  # 9 series per source: more than one legend holds
    # each lr's runs differ (runs equal bit for bit across settings would be one level, reported once)
    frames = [_run(dataclasses.replace(BASE, seed=s, rollout=r, lr=lr), 0.40 - 0.002 * i - 0.0001 * j, 1.0 + 0.01 * i)
              for s in range(2) for j, lr in enumerate(lrs) for i, r in enumerate(rollouts)]
    rows = pd.concat(frames, ignore_index=True)
    runs = run_table(rows)
    for fig in (levels_figure(level_table(runs), tolerance=Tolerance()), seed_curves_figure(rows, runs)):
        axes = [ax for ax in fig.axes if ax.get_visible()]
        titles = [ax.get_title() for ax in axes if ax.get_title()]
        assert titles and all(len(t) <= 24 for t in titles), titles  # no settings string in a title
        legends = [len(ax.get_legend().get_texts()) for ax in axes if ax.get_legend() is not None]
        assert legends and max(legends) <= MAX_LEGEND, legends
        labels = [t.get_text() for ax in axes if ax.get_legend() is not None for t in ax.get_legend().get_texts()]
        assert "lr" in fig._mismatch_caption or any("lr" in x for x in labels)  # the differing setting is said
        for ax in axes:
            if ax.get_title().endswith("format"):
                series = [(c.get_label(), c.lines[0]) for c in ax.containers] + [(x.get_label(), x) for x in ax.get_lines()]
                colours = [mcolors.to_rgb(line.get_color()) for label, line in series
                           if label.startswith(("fp8", "int", "lr"))]  # the format series, not clean
                assert colours and all(b > r and b > g for r, g, b in colours), colours  # shades of blue
        plt.close(fig)


def test_write_reports_computes_the_analysis_once(tmp_path, monkeypatch):
    """Every writer reads one `Analysis`: the pooling over seeds (`level_table`) and the twin matching
    (`run_table`) run once per report, not once per writer."""
    import dataclasses

    from mismatch.analysis import tolerance
    from mismatch.report import write_reports
    from tests.analysis.test_tolerance import BASE, _run

    calls = {"run_table": 0, "level_table": 0}
    for name in calls:
        original = getattr(tolerance, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(tolerance, name, counted)
    frames = [_run(dataclasses.replace(BASE, seed=s, rollout=r), 0.40, 1.0) for s in range(2)
              for r in ("none", "fp8-e4m3", "stale:1")]
    written = [p.name for p in write_reports(pd.concat(frames, ignore_index=True), tmp_path)]
    assert {"opd_verdicts.md", "tolerance.md", "cost_frontier.md"} <= set(written)  # the premise: writers ran
    assert calls == {"run_table": 1, "level_table": 1}


def test_reports_are_the_same_whatever_order_the_runs_finished_in(tmp_path):
    """Ray workers finish runs in any order, and a results dataset keeps the order they were written in:
    every table the reports write is byte for byte the same for the runs in another order."""
    import dataclasses
    import random

    from mismatch.report import write_reports
    from tests.analysis.test_tolerance import BASE, DELTAS, _run

    frames = [_run(dataclasses.replace(BASE, seed=s, rollout=r), 0.40 + (d[0][s] if s < len(d[0]) else 0) / 100,
                   d[1] if r != "none" else 1.0, mismatch=0.01 * (1 + s))
              for r, d in [("none", ([0, 0, 0], 1.0)), *DELTAS.items()] for s in range(3)]
    shuffled = frames[:]
    random.Random(1).shuffle(shuffled)
    assert [f["run_id"].iloc[0] for f in shuffled] != [f["run_id"].iloc[0] for f in frames]  # the premise
    written = {}
    for name, order in (("as planned", frames), ("shuffled", shuffled)):
        out = tmp_path / name.replace(" ", "_")
        files = write_reports(pd.concat(order, ignore_index=True), out)
        written[name] = {p.name: p.read_bytes() for p in files if p.suffix in (".md", ".csv", ".json")}
    assert set(written["as planned"]) == set(written["shuffled"]) and len(written["shuffled"]) >= 4
    for name, content in written["as planned"].items():
        assert written["shuffled"][name] == content, name
