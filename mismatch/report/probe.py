"""Probe reports: a Markdown summary and plots of probe runs. Reads results only, never a model.

`write_probe_report(rows, out_dir)` writes
  * `summary.md` — one line per run (reference vs candidate or perturbation) with the headline
    divergences, the per-layer SQNR table, and the per-layer isolation map when present;
  * `per_layer.png` — SQNR (dB) of every captured layer, one line per run;
  * `kl_cdf.png` — the distribution of per-token KL(p‖q) over scored tokens, one line per run;
  both with one panel per mismatch source and layer scope, at most `MAX_LEGEND` runs a panel;
  * `layer_map.png` — end-to-end kl_fwd_mean with one decoder block perturbed at a time
    (runs whose layer scope is a single block index, from `mismatch probe --each-layer`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from mismatch.pairs.catalog import PAIRS, member_spec
from mismatch.errors import InputError
from mismatch.report.common import (LEGEND_FONTSIZE, MAX_LEGEND, caption, family_color, markdown_table,
                                    save_figure, style_axes, subplots)
from mismatch.results import per_layer, summaries
from mismatch.rollout.spec import NONE_FORMS, RolloutSpec, rollout_label

HEADLINE = ("tokens", "kl_fwd_mean", "kl_fwd_p50", "kl_fwd_p99", "kl_fwd_max", "kl_rev_mean",
            "tv_mean", "top1_agree", "logp_abs_diff_mean", "is_ratio_outside_frac", "chi2_token",
            "is_ess", "ppl_cand_over_ref")


def _perturbed(perturb: object) -> bool:
    """Whether a probe run's recorded `perturb` is a spec (not empty, not `none`)."""
    return isinstance(perturb, str) and perturb not in NONE_FORMS


def probe_label(run: pd.Series) -> str:
    """Human label of a run: the candidate (unless it is the perturbed reference) and what
    differs from the reference."""
    perturb = run.get("perturb")
    perturbed = _perturbed(perturb)
    parts = [] if perturbed and run.get("candidate") == run.get("reference") else [str(run.get("candidate"))]
    if run.get("cand_dtype") not in (None, "fp32", run.get("ref_dtype")):
        parts.append(str(run.get("cand_dtype")))
    if perturbed:
        parts.append(rollout_label({"rollout": perturb, "layers": run.get("layers")}))
    return " · ".join(parts)


def is_isolation(layers: object) -> bool:
    """A run whose scope is one decoder block index (CSV files read it back as a number)."""
    return isinstance(layers, (str, int, np.integer)) and str(layers).isdigit()


def isolation_map(isolated: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`(kl_fwd_mean, top1_agree)`, each block × perturbation spec, of the isolation runs."""
    iso = isolated.assign(block=isolated["layers"].astype(int))
    return (iso.pivot_table(index="block", columns="perturb", values="kl_fwd_mean"),
            iso.pivot_table(index="block", columns="perturb", values="top1_agree"))


def _isolation_section(kl: pd.DataFrame, top1: pd.DataFrame, heading: str = "") -> list[str]:
    table = pd.DataFrame({"block": kl.index.astype(str)})
    for spec in kl.columns:
        table[f"{spec} kl_fwd_mean"] = kl[spec].to_numpy()
        table[f"{spec} top1_agree"] = top1[spec].to_numpy()
    md = [f"## Per-layer isolation map: one decoder block perturbed at a time{heading}", "",
          "End-to-end divergence with only that block's linear layers perturbed.", "", markdown_table(table), ""]
    for spec in kl.columns:
        ranked = kl[spec].sort_values(ascending=False)
        top = ", ".join(f"{b} ({v:.3g})" for b, v in ranked.head(3).items())
        md.append(f"- {spec}: most sensitive blocks {top}; least sensitive {ranked.index[-1]} "
                  f"({ranked.iloc[-1]:.3g}); max/median = {ranked.iloc[0] / ranked.median():.1f}×.")
    return md + [""]


def layer_map_figure(kl: pd.DataFrame):
    """kl_fwd_mean vs the block perturbed alone, one line per spec (log scale)."""
    fig, ax = subplots(figsize=(8, 4.2))
    for i, spec in enumerate(kl.columns):
        ax.plot(kl.index, kl[spec], marker="o", ms=3, label=spec, linestyle=LINESTYLES[i % len(LINESTYLES)])
    ax.set_yscale("log")
    style_axes(ax, xlabel="decoder block perturbed alone", ylabel="kl_fwd_mean (nats)")
    ax.legend(fontsize=LEGEND_FONTSIZE, ncols=1 + (len(kl.columns) - 1) // MAX_LEGEND)
    ax.set_title("Per-layer isolation map")
    return fig


LINESTYLES = ("-", "--", "-.", ":")  # beside the shades of a family's colour, so neighbours differ twice


def source_of(perturb: object) -> str:
    """The mismatch source of a probe run's perturbation (`RolloutSpec.source`: format, noise,
    engine); `other` for a candidate that is another model or dtype, or a spec no longer parsed."""
    if not _perturbed(perturb):
        return "other"
    try:
        return RolloutSpec.parse(perturb).source
    except InputError:
        return "other"


def run_panels(runs: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """The runs split for plotting: grouped by source and layer scope in recorded order, at most
    `MAX_LEGEND` per panel. Returns `(source, panel title, runs)` per panel."""
    source = runs["perturb"].map(source_of) if "perturb" in runs else pd.Series("other", index=runs.index)
    scope = runs["layers"].fillna("linear") if "layers" in runs else pd.Series("linear", index=runs.index)
    panels = []
    for (src, where), part in runs.groupby([source, scope], sort=False):
        chunks = [part.iloc[i:i + MAX_LEGEND] for i in range(0, len(part), MAX_LEGEND)]
        for k, chunk in enumerate(chunks):
            numbered = f" ({k + 1}/{len(chunks)})" if len(chunks) > 1 else ""
            panels.append((src, f"{src} · {where}{numbered}", chunk))
    return panels


def _panel_axes(count: int, *, width: float = 5.0, height: float = 3.4, **shared):
    """A figure with `count` panels, at most 3 a row; the unused cells hidden."""
    ncols, nrows = min(count, 3), -(-count // 3)
    fig, axes = subplots(ncols, nrows=nrows, figsize=(width * ncols, height * nrows), **shared)
    axes = np.atleast_1d(axes).ravel()
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes[:count]


def _panel_labels(part: pd.DataFrame) -> list[str]:
    """Legend labels inside a `run_panels` panel, whose title says the source and scope: the
    perturbation spec alone (the run label for a candidate that is another model or dtype)."""
    perturb = part["perturb"] if "perturb" in part else pd.Series(None, index=part.index)
    return [spec if _perturbed(spec) else label for spec, label in zip(perturb, part["run"])]


def _series_style(source: str, index: int, count: int) -> dict:
    return dict(color=family_color(source, index, count) if source != "other" else f"C{index}",
                linestyle=LINESTYLES[index % len(LINESTYLES)])


def _sqnr_section(layers: pd.DataFrame, runs: pd.DataFrame, heading: str = "") -> list[str]:
    sq = layers.pivot_table(index=["index", "layer"], columns="run_id", values="sqnr_db")
    sq = sq[[r for r in runs["run_id"] if r in sq.columns]].reset_index()  # runs in recorded order
    sq = sq.rename(columns=dict(zip(runs["run_id"], runs["run"])))
    return [f"## Per-layer SQNR (dB) of the hidden states{heading}", "", markdown_table(sq.drop(columns="index")), ""]


def per_layer_figure(layers: pd.DataFrame, runs: pd.DataFrame):
    """SQNR (dB) of every captured layer, one line per run with per-layer rows, one panel per
    `run_panels` group (the relative L2 error is the same number: 10^(−SQNR/20))."""
    by_run = dict(tuple(layers.groupby("run_id", sort=False)))
    panels = run_panels(runs[runs["run_id"].isin(by_run)])
    fig, axes = _panel_axes(len(panels), sharey=True)
    names = layers.drop_duplicates("index").sort_values("index")
    step = max(1, len(names) // 12)
    for ax, (source, title, part) in zip(axes, panels):
        for i, (run_id, label) in enumerate(zip(part["run_id"], _panel_labels(part))):
            ax.plot(by_run[run_id]["index"], by_run[run_id]["sqnr_db"], marker="o", ms=2.5, label=label,
                    **_series_style(source, i, len(part)))
        ax.set_xticks(names["index"][::step], names["layer"][::step], rotation=45, ha="right")
        style_axes(ax, ylabel="SQNR (dB)", legend=True)
        ax.set_title(title, fontsize=10)
    fig.suptitle("Hidden-state error per layer (candidate vs reference, scored tokens)")
    caption(fig, "SQNR = 10 log10(Σ h² / Σ (h − h')²) over the scored tokens; "
                 "the relative L2 error is 10^(−SQNR/20).")
    return fig


def kl_cdf_figure(kl: pd.DataFrame, runs: pd.DataFrame):
    """Empirical CDF of per-token KL(p‖q), one line per run (log x), one panel per `run_panels` group."""
    by_run = dict(tuple(kl.groupby("run_id", sort=False)))
    panels = run_panels(runs[runs["run_id"].isin(by_run)])
    fig, axes = _panel_axes(len(panels), sharex=True, sharey=True)
    for ax, (source, title, part) in zip(axes, panels):
        for i, (run_id, label) in enumerate(zip(part["run_id"], _panel_labels(part))):
            values = np.clip(np.sort(by_run[run_id]["value"].to_numpy()), 1e-12, None)  # no zeros on a log axis
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=label,
                    **_series_style(source, i, len(part)))
        ax.set_xscale("log")
        style_axes(ax, xlabel="per-token KL(p‖q) (nats)", ylabel="fraction of scored tokens ≤ x", legend=True)
        ax.set_title(title, fontsize=10)
    return fig


def _provenance(run: pd.Series) -> str:
    return (f"Provenance: mismatch {run.get('mismatch_version')}, torch {run.get('torch_version')}, "
            f"transformers {run.get('transformers_version')}, git {run.get('git_sha')}, {run.get('timestamp')}.")


def _slug(reference: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(reference)).strip("_")


def write_probe_report(rows: pd.DataFrame, out_dir: str | Path, *, title: str = "mismatch probe report"
                       ) -> list[Path]:
    """Write `summary.md`, `per_layer.png`, `kl_cdf.png` (and `layer_map.png` when isolation runs
    are present) for the probe runs in `rows` (tidy, kind `probe`). Returns the paths written.

    With runs of several reference models, the headline table lists them all; the per-layer,
    isolation-map sections and the figures are per reference (`per_layer_<reference>.png`, …).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_runs = summaries(rows)
    all_runs["run"] = all_runs.apply(probe_label, axis=1)
    isolated = all_runs[all_runs["layers"].map(is_isolation)] if "layers" in all_runs else all_runs.iloc[:0]
    runs = all_runs.drop(isolated.index)
    table = runs[["run", "reference", *[c for c in HEADLINE if c in runs.columns]]]
    md = [f"# {title}", "", "Divergence of each candidate from its reference over the scored tokens (nats; "
          "definitions in docs/design.md).", "", markdown_table(table), ""]
    references = list(dict.fromkeys(all_runs["reference"]))
    plots = []
    for reference in references:
        suffix = "" if len(references) == 1 else f"_{_slug(reference)}"
        heading = "" if len(references) == 1 else f" — {reference}"
        mine = runs[runs["reference"] == reference]
        mine_rows = rows[rows["run_id"].isin(mine["run_id"])]
        layers = per_layer(mine_rows)
        if not layers.empty:
            md += _sqnr_section(layers, mine, heading)
            plots.append(save_figure(per_layer_figure(layers, mine), out / f"per_layer{suffix}.png"))
        token_kl = mine_rows[(mine_rows["level"] == "token") & (mine_rows["metric"] == "kl_fwd")]
        if not token_kl.empty:
            plots.append(save_figure(kl_cdf_figure(token_kl, mine), out / f"kl_cdf{suffix}.png"))
        iso = isolated[isolated["reference"] == reference]
        if not iso.empty:
            kl, top1 = isolation_map(iso)
            md += _isolation_section(kl, top1, heading)
            plots.append(save_figure(layer_map_figure(kl), out / f"layer_map{suffix}.png"))
    md += [_provenance(all_runs.iloc[0]), ""]
    (out / "summary.md").write_text("\n".join(md), encoding="utf-8")
    return [out / "summary.md", *plots]


# ---------------------------------------------------------------- the students' probes, for the tolerance report


def student_models() -> dict[str, str]:
    """Model spec → pair, for each registered pair's student (`smollm2-135m` → `smollm2-concise`), so
    that a probe run on the student's model under its own name counts as that pair's student."""
    owners: dict[str, list[str]] = {}
    for pair in PAIRS:
        spec = member_spec(f"{pair}:student")
        if spec != f"{pair}:student":
            owners.setdefault(spec, []).append(pair)
    return {spec: pairs[0] for spec, pairs in owners.items() if len(pairs) == 1}  # a shared student stays unnamed


def student_probes(rows: pd.DataFrame) -> pd.DataFrame:
    """Probe summaries of runs whose reference is a pair's student (`PAIR:student`, or the student's
    own model spec: `student_models`), with `pair`."""
    probes = rows[rows["kind"] == "probe"]
    if probes.empty or "reference" not in probes:
        return pd.DataFrame()
    summ = summaries(probes)
    reference = summ["reference"].astype(str)
    named = reference.str.endswith(":student")
    models = student_models()
    pair = reference.map(models).where(~named, reference.str.rsplit(":", n=1).str[0])
    return summ[pair.notna()].assign(pair=pair[pair.notna()])


def block_figure(students: pd.DataFrame):
    """Per-block isolation maps: kl_fwd_mean (log colour) of block × pair, one panel per format."""
    iso = students[students["layers"].map(is_isolation)].assign(block=lambda f: f["layers"].astype(int))
    specs = sorted(iso["perturb"].unique())
    fig, axes = subplots(1, nrows=len(specs), figsize=(10, 2.3 * len(specs)))
    axes = np.atleast_1d(axes)
    for ax, spec in zip(axes, specs):
        grid = iso[iso["perturb"] == spec].pivot_table(index="pair", columns="block", values="kl_fwd_mean")
        image = ax.imshow(np.log10(grid.to_numpy()), aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(grid.index)), grid.index)
        ax.set_xticks(range(len(grid.columns)), [str(b) for b in grid.columns], fontsize=7)
        ax.set_xlabel("decoder block perturbed alone")
        ax.set_title(f"{spec}: log10 end-to-end KL(p‖q) per token (white: no such block)", fontsize=9)
        fig.colorbar(image, ax=ax)
    return fig
