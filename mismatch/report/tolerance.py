"""The tolerance report: tables and figures across pairs, sources, levels and seeds. Reads results only.

`write_tolerance_report(rows, out_dir)` writes, from OPD runs judged against their clean twins and pooled
over seeds (`mismatch.analysis.tolerance`):
  * `tolerance.md` / `tolerance.csv` — per pair × source × settings: the largest tolerated level
    (formats: the cheapest tolerated format), the first not tolerated, the uncertain ones; then
    every level with its seeds, Δ accuracy and KL ratio as mean ± the sequential design's interval, and its verdict;
  * `tolerance_levels.csv` — that per-level table;
  * `headline.md` — the study in a page, which the study page includes (`mismatch.report.headline`);
  * `noise_floor.csv` — per pair × settings, the clean finals' spread over seeds and the A/A level
    (`resample:S` against its clean twin: the spread any mismatch is judged against), also in
    `tolerance.md`;
  * `tolerance_levels.png` — Δ accuracy and KL ratio vs level per source, seed intervals as bars;
  * `tolerance_vs_mismatch.png` — Δ accuracy and the KL ratio vs the measured mismatch (mean `mismatch_kl` over the
    run, log axis) for every source and pair, one panel each;
  * `seed_curves.png` — held-out accuracy vs step per rollout, mean over seeds with a ±1 sd band;
and, when the dataset also holds probe runs on pair students (`PAIR:student`):
  * `block_sensitivity.png` — per-block isolation maps (block × pair, one panel per format: `report.probe`);
  * `static_vs_dynamic.png` — each format's static probe KL on a pair's student vs its dynamic Δ.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from mismatch.analysis.twins import accuracy_metric, opd_runs
from mismatch.report.headline import write_headline
from mismatch.report.common import (LEGEND_FONTSIZE, MAX_LEGEND, caption, family_color, markdown_table, save_figure,
                                    style_axes, subplots)
from mismatch.report.probe import block_figure, is_isolation, student_probes
from mismatch.analysis.tolerance import (CATEGORICAL_SOURCES, LEVEL_SOURCES, NOISE_FLOOR_SOURCE, Analysis, analyse, judge_level,
                                     noise_floor, settings_parts, settings_text, tolerance_table, weight_bits)
from mismatch.analysis.sequential import DEFAULT_DESIGN, WORST_SPREAD_RATIO, Design, next_seeds, simulate
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance

MARKERS = "osD^v<>P*X"


def _series_labels(part: pd.DataFrame) -> dict[tuple[str, str], str]:
    """Short labels of a panel's series (pair × settings): the pair alone when it has one series in the
    panel, else the settings parts that differ between that pair's series (the full settings are in
    tolerance.md, and the ones every series shares in the figure's caption)."""
    keys = list(dict.fromkeys(zip(part["pair"], part["settings"])))
    by_pair: dict[str, list[str]] = {}
    for pair, settings in keys:
        by_pair.setdefault(pair, []).append(settings)
    labels = {}
    for pair, all_settings in by_pair.items():
        common = set.intersection(*(set(settings_parts(s)) for s in all_settings))
        for settings in all_settings:
            own = settings_text([x for x in settings_parts(settings) if x not in common])
            labels[(pair, settings)] = (pair if len(all_settings) == 1 else
                                        f"{pair}: {own}" if len(by_pair) > 1 else own)
    return labels


def _shared_caption(levels: pd.DataFrame) -> str:
    """The settings every series of the figure shares, said once; each series' own are in tolerance.md."""
    parts = [set(settings_parts(s)) for s in levels["settings"].unique()]
    shared = sorted(set.intersection(*parts)) if parts else []
    return ("Settings of every series: " + (", ".join(shared) if shared else "none shared") +
            ". Each series' full settings: tolerance.md.")


LEVEL_AXIS = {"noise": "noise σ (× rms W)", "stale": "staleness K (steps)", "reuse": "reuse R (steps per batch)",
              "format": "format (stored bits per weight)", "engine": "llama.cpp weight type (stored bits)"}


def levels_figure(levels: pd.DataFrame, *, tolerance: Tolerance):
    """Δ accuracy (top) and KL ratio (bottom) vs level, one column per source (its family colour, in
    shades for several series), one line per pair × settings, bars = the design's intervals over seeds; dashed lines =
    the thresholds. Short titles and labels; the settings go to the caption and tolerance.md."""
    columns = []  # (source, its series): a source with more than MAX_LEGEND series spans several columns
    for source in (s for s in (*LEVEL_SOURCES, *CATEGORICAL_SOURCES) if s in set(levels["source"])):
        groups = list(levels[levels["source"] == source].groupby(["pair", "settings"], sort=False))
        columns += [(source, groups[i:i + MAX_LEGEND]) for i in range(0, len(groups), MAX_LEGEND)]
    fig, axes = subplots(len(columns), nrows=2, figsize=(4.6 * len(columns), 8.5))
    axes = np.asarray(axes).reshape(2, len(columns))
    for col, (source, groups) in enumerate(columns):
        part = levels[levels["source"] == source]
        categorical = source in CATEGORICAL_SOURCES
        formats = sorted(set(part["level"]), key=lambda lv: (weight_bits(lv), lv)) if categorical else []
        labels = _series_labels(part)
        for i, ((pair, settings), series) in enumerate(groups):
            if categorical:  # categories by stored bits, markers only, pairs side by side
                series = series.assign(x=[formats.index(lv) + 0.08 * i for lv in series["level"]])
            else:  # series side by side around each level (log axis: a small factor)
                series = series.assign(x=series["level"].astype(float) * 1.04 ** i)
            series = series.sort_values("x")
            color = family_color(source, i, len(groups))
            for row, (metric, scale) in enumerate((("acc_delta", 100), ("kl_ratio", 1))):
                axes[row, col].errorbar(series["x"], series[metric] * scale, yerr=series[f"{metric}_hw"] * scale,
                                        marker=MARKERS[i % len(MARKERS)], markersize=4, capsize=3, color=color,
                                        label=labels[(pair, settings)], linestyle="none" if categorical else "-")
        if formats:
            for row in range(2):
                axes[row, col].set_xticks(range(len(formats)), [f"{f} ({weight_bits(f):g} b)" for f in formats],
                                          rotation=30, ha="right", fontsize=7)
        for row, (limit, name) in enumerate(((-100 * tolerance.acc_tol, "Δ accuracy (points)"),
                                             (1 + tolerance.kl_tol, "KL ratio"))):
            ax = axes[row, col]
            ax.axhline(limit, color="grey", linestyle="--", linewidth=1)
            ax.axhline(0 if row == 0 else 1, color="black", linewidth=0.6)
            style_axes(ax, xlabel=LEVEL_AXIS[source], ylabel=name)
            measured = np.isfinite(part[("acc_delta", "kl_ratio")[row]].astype(float)).any()
            if not measured:  # the real pairs have no accuracy: an empty panel says so (and takes no log axis)
                ax.text(0.5, 0.5, "not measured on these pairs", transform=ax.transAxes, ha="center", fontsize=9)
            elif not categorical:
                ax.set_xscale("log", base=2 if source != "noise" else 10)
        axes[0, col].set_title(source, fontsize=10, color=family_color(source))
        axes[0, col].legend(fontsize=LEGEND_FONTSIZE - 1)
    fig.suptitle("OPD under rollout mismatch: final Δ against the clean twin, mean over seeds ± the design's interval",
                 fontsize=10)
    caption(fig, _shared_caption(levels))
    return fig


def mismatch_figure(levels: pd.DataFrame, *, tolerance: Tolerance):
    """Δ accuracy and the KL ratio vs the measured mismatch (mean mismatch_kl during the run, log axis): every
    level of every source and pair that has the measure (the real pairs have no accuracy), colour by source
    (its family colour), marker by pair."""
    fig, axes = subplots(2, figsize=(13, 5.5))
    pairs = sorted(levels["pair"].unique())
    for ax, (metric, scale, limit, base, name) in zip(axes, (
            ("acc_delta", 100, -100 * tolerance.acc_tol, 0, "Δ final held-out accuracy (points)"),
            ("kl_ratio", 1, 1 + tolerance.kl_tol, 1, "final held-out KL ratio (rollout copy ÷ clean twin)"))):
        shown = levels[(levels["mismatch_kl"] > 0) & np.isfinite(levels[metric].astype(float))]
        for (source, pair), part in shown.groupby(["source", "pair"]):
            ax.errorbar(part["mismatch_kl"], scale * part[metric], yerr=scale * part[f"{metric}_hw"], linestyle="none",
                        marker=MARKERS[pairs.index(pair) % len(MARKERS)], color=family_color(source), capsize=2,
                        label=f"{source} · {pair}")
        ax.axhline(limit, color="grey", linestyle="--", linewidth=1)
        ax.axhline(base, color="black", linewidth=0.6)
        if len(shown):
            ax.set_xscale("log")
        else:
            ax.text(0.5, 0.5, "no level has this measure", transform=ax.transAxes, ha="center", fontsize=9)
        style_axes(ax, xlabel="measured mismatch: mean KL(rollout ‖ student) per token during the run (nats)",
                   ylabel=name, legend=bool(len(shown)))
    fig.suptitle("Does one mismatch number predict tolerance across sources?", fontsize=10)
    return fig


def seed_curves_figure(rows: pd.DataFrame, runs: pd.DataFrame):
    """Held-out accuracy vs step, one panel per pair × level family (each pair's most common settings):
    the family's levels in shades of its colour, the clean run in black, mean over seeds with a ±1 sd
    band; at most `MAX_LEGEND` levels per panel (a larger family is split over panels)."""
    runs_rows = opd_runs(rows)
    metrics = {cfg["run_id"]: pd.DataFrame(m) for cfg, m in runs_rows}
    accuracy = {cfg["run_id"]: accuracy_metric(m) for cfg, m in runs_rows}  # the study's accuracy of each run
    panels, captions = [], []
    for pair in sorted(runs["pair"].unique()):
        mine = runs[runs["pair"] == pair]
        settings = mine["settings"].mode().iloc[0]
        mine = mine[mine["settings"] == settings]
        captions.append(f"{pair}: {settings}")
        clean = mine[mine["source"] == "clean"]
        for source in (*LEVEL_SOURCES, *CATEGORICAL_SOURCES):
            levels = list(dict.fromkeys(mine.loc[mine["source"] == source, "rollout"]))
            for start in range(0, len(levels), MAX_LEGEND - 1):  # one entry is the clean run
                panels.append((pair, source, levels[start:start + MAX_LEGEND - 1], clean, mine))
    pairs = list(dict.fromkeys(p[0] for p in panels)) or ["—"]
    ncols = max([sum(p[0] == pair for p in panels) for pair in pairs] + [1])
    fig, axes = subplots(ncols, nrows=len(pairs), figsize=(4.4 * ncols, 3.9 * len(pairs)))
    axes = np.asarray(axes).reshape(len(pairs), ncols)
    slots = {pair: iter(axes[r]) for r, pair in enumerate(pairs)}
    used = set()
    for pair, source, levels, clean, mine in panels:
        ax = next(slots[pair])
        used.add(id(ax))
        series = [("clean", clean, "black", 2.2)] + [
            (lv, mine[mine["rollout"] == lv], family_color(source, i, len(levels)), 1.3) for i, lv in enumerate(levels)]
        for label, group, color, width in series:
            if group.empty:
                continue
            curves = [metrics[rid][metrics[rid]["metric"] == accuracy[rid]].set_index("step")["value"]
                      for rid in group["run_id"]]
            frame = pd.concat(curves, axis=1).sort_index() * 100
            mean, sd = frame.mean(axis=1), frame.std(axis=1, ddof=1).fillna(0)
            ax.plot(mean.index, mean, color=color, linewidth=width, label=f"{label} (n={frame.shape[1]})")
            ax.fill_between(mean.index, mean - sd, mean + sd, alpha=0.12, color=color)
        style_axes(ax, xlabel="OPD step", ylabel="held-out accuracy (%)")
        ax.set_title(f"{pair} · {source}", fontsize=10, color=family_color(source))
        ax.legend(fontsize=LEGEND_FONTSIZE - 1)
    for ax in axes.flat:  # a pair with fewer families than the widest row
        if id(ax) not in used:
            ax.set_visible(False)
    caption(fig, "Mean over seeds ± 1 sd. Settings per pair — " + "; ".join(captions))
    return fig


def static_dynamic_points(students: pd.DataFrame, levels: pd.DataFrame) -> pd.DataFrame:
    """The format levels that have a static probe of the same format on the pair's student (all linears):
    the level rows with that probe's `kl_fwd_mean` beside them (empty when none pairs up)."""
    whole = students[~students["layers"].map(is_isolation)]
    whole = whole.assign(first=whole["layers"] != "linear").sort_values("first", kind="stable").drop_duplicates(
        ["pair", "perturb"])  # one static point per format: its `linear` scope where it ran several
    formats = levels[levels["source"].isin(CATEGORICAL_SOURCES)]
    return formats.merge(whole[["pair", "perturb", "kl_fwd_mean"]], left_on=["pair", "level"],
                         right_on=["pair", "perturb"])


def static_dynamic_figure(joined: pd.DataFrame, levels: pd.DataFrame | None = None):
    """Left: each format's static probe kl_fwd_mean on a pair's student vs its dynamic Δ accuracy
    (`static_dynamic_points`). Right (when `levels` has in-run probes of the rollout copy,
    `copy_kl_fwd_mean`): every level — staleness and noise too — at its copy's probed KL during the run."""
    probed = levels[levels["copy_kl_fwd_mean"] > 0] if levels is not None and "copy_kl_fwd_mean" in levels else None
    fig, axes = subplots(2 if probed is not None and len(probed) else 1, figsize=(13 if probed is not None else 7, 5))
    ax = axes[0] if isinstance(axes, (list, tuple, np.ndarray)) else axes
    if probed is not None and len(probed):
        right = axes[1]
        pairs = sorted(probed["pair"].unique())
        for (source, pair), part in probed.groupby(["source", "pair"]):
            right.errorbar(part["copy_kl_fwd_mean"], 100 * part["acc_delta"], yerr=100 * part["acc_delta_hw"],
                           linestyle="none", marker=MARKERS[pairs.index(pair) % len(MARKERS)], color=family_color(source),
                           capsize=2, label=f"{source} · {pair}")
        right.axhline(0, color="black", linewidth=0.6)
        right.set_xscale("log")
        style_axes(right, xlabel="in-run probe of the rollout copy: mean KL(student ‖ copy) per token (nats)",
                   ylabel="Δ final held-out accuracy (points)", legend=True)
    for i, (pair, part) in enumerate(joined.groupby("pair")):
        ax.errorbar(part["kl_fwd_mean"], 100 * part["acc_delta"], yerr=100 * part["acc_delta_hw"], linestyle="none",
                    marker=MARKERS[i % len(MARKERS)], capsize=2, label=pair)
        for _, r in part.iterrows():
            ax.annotate(r["level"], (r["kl_fwd_mean"], 100 * r["acc_delta"]), fontsize=6)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xscale("log")
    style_axes(ax, xlabel="static probe: mean KL(p‖q) per token on the student's responses (nats)",
               ylabel="dynamic: Δ final held-out accuracy (points)", legend=True)
    return fig


def _floor_markdown(floor: pd.DataFrame) -> list[str]:
    if floor.empty:
        return []
    shown = pd.DataFrame({
        "pair": floor["pair"], "settings": floor["settings"], "clean seeds": floor["clean_seeds"],
        "clean accuracy (%)": [_pm(m, s, "{:.1f}").replace(" ± ", " sd ") for m, s in
                               zip(floor["clean_accuracy"], floor["clean_accuracy_sd"])],
        "clean KL (nats)": [_pm(m, s, "{:.3f}").replace(" ± ", " sd ") for m, s in
                            zip(floor["clean_heldout_rkl"], floor["clean_heldout_rkl_sd"])]})
    if "aa_seeds" in floor:
        shown["A/A seeds"] = floor["aa_seeds"].map(lambda v: "—" if v != v else f"{v:.0f}")
        shown["A/A Δ accuracy (pts)"] = [_pm(m, h, "{:+.1f}") for m, h in zip(floor["aa_acc_delta"], floor["aa_acc_delta_hw"])]
        shown["A/A Δ sd (pts)"] = floor["aa_acc_delta_sd"].map(lambda v: "—" if v != v else f"{v:.2f}")
        shown["A/A KL ratio"] = [_pm(m, h, "{:.3f}") for m, h in zip(floor["aa_kl_ratio"], floor["aa_kl_ratio_hw"])]
        shown["A/A verdict"] = floor["aa_verdict"].fillna("—")
    return ["## Noise floor: clean against clean", "",
            "Clean finals over seeds (mean and sd) and the A/A level — `resample:S`, the clean run with only "
            "its rollout samples changed, against its clean twin. The A/A interval is the spread every level "
            "is judged against: an effect within its half-width of a threshold needs more seeds.", "",
            markdown_table(shown), ""]


def realised_alpha(levels: pd.DataFrame, runs: pd.DataFrame, *, tolerance: Tolerance, design: Design,
                   simulated: int = 10_000) -> pd.DataFrame:
    """Per pair × settings with an A/A level of ≥ 3 seeds: the design's realised two-sided error at each
    threshold, simulated (`mismatch.analysis.sequential.simulate`, `simulated` levels) with the study's own rule and
    planner at the spreads the A/A level measured (sds of Δ accuracy and KL ratio over its seeds, their
    correlation), a reference of as many seeds, up to the design's last look — for a level as variable as its
    A/A level and for one `WORST_SPREAD_RATIO` times as variable (`spread_ratio`), near where the error of the
    A/A floor under a level's sd peaks (`Design.spent_alpha`)."""
    out = []
    plan = lambda n, v, cap: next_seeds(n, v, cap, design)  # noqa: E731
    twins = runs[(runs["source"] == NOISE_FLOOR_SOURCE) & runs["complete"] & (runs["baseline"] != "")]
    aa = levels[levels["source"] == NOISE_FLOOR_SOURCE] if "judged_on" in levels else levels.iloc[:0]
    kl_only = {(r.pair, r.settings) for r in aa.itertuples() if r.judged_on == "KL ratio"}
    for (pair, settings), group in twins.groupby(["pair", "settings"], sort=True):
        per_seed = group.groupby("seed")[["acc_delta", "kl_ratio"]].mean()
        if len(per_seed) < 3:
            continue
        on_acc = (pair, settings) not in kl_only  # a sampled accuracy is not judged: the rule simulated is the KL's

        def judge(a, k, ra, rk, on_acc=on_acc):
            return judge_level(a, k, ra, rk, tolerance=tolerance, design=design, judge_accuracy=on_acc)["verdict"]

        has_acc = on_acc and per_seed["acc_delta"].notna().all()
        acc_sd = float(per_seed["acc_delta"].std(ddof=1)) if has_acc else 0.0
        kl_sd = float(per_seed["kl_ratio"].std(ddof=1))
        corr = float(per_seed["acc_delta"].corr(per_seed["kl_ratio"])) if has_acc and acc_sd > 0 and kl_sd > 0 else 0.0
        cases = [("KL ratio", 0.0 if has_acc else math.nan, 1 + tolerance.kl_tol)]
        if has_acc and acc_sd > 0:
            cases.insert(0, ("Δ accuracy", -tolerance.acc_tol, 1.0))
        for (threshold, acc, kl), ratio in itertools.product(cases, (1.0, WORST_SPREAD_RATIO)):
            sim = simulate(judge, plan, true_acc=acc, true_kl=kl, acc_sd=max(acc_sd, 1e-12), kl_sd=max(kl_sd, 1e-12),
                           corr=corr if math.isfinite(corr) else 0.0, reference_seeds=len(per_seed),
                           cap=design.looks[-1], levels=simulated, seed=0, sd_scale=ratio)
            out.append({"pair": pair, "settings": settings, "threshold": threshold, "aa_seeds": len(per_seed),
                        "spread_ratio": ratio, "simulated": sim.levels, "realised_alpha": sim.decided,
                        "mc_se": sim.decided_se, "mean_seeds": sim.mean_seeds})
    return pd.DataFrame(out)


def _design_markdown(levels: pd.DataFrame, alpha: pd.DataFrame, design: Design) -> list[str]:
    judged = levels[levels["source"] != NOISE_FLOOR_SOURCE]
    decided = int((judged["verdict"] != "uncertain").sum())
    lines = ["## The design and its error", "",
             f"Sequential design: {design.describe()}. A level is judged at the look its seeds have reached with a "
             "repeated confidence interval mean ± c·sd/√n; its sd is pooled with the pair's A/A level unless it is "
             "larger than that (`mismatch.analysis.sequential.pooled_sd`); undecided levels get the next look's seeds, whatever "
             "their data (docs/sweeps.md).", "",
             f"{len(judged)} levels judged, {decided} decided. A level on a threshold is called either way with "
             f"chance at most α = {design.alpha:g}, and one off it on the wrong side with at most α/2, so at most "
             f"≈ {design.alpha * len(judged):.1f} wrong verdicts are expected among them were every level on a "
             "threshold, far fewer as levels lie away from theirs."]
    if "marginal" in judged and judged["marginal"].any():
        lines += ["", "Marginal (an interval clears its threshold by less than the evaluation's own Monte-Carlo "
                  "error): " + ", ".join(f"{r.pair} {r.source} {r.level}" for r in judged[judged["marginal"]].itertuples())
                  + "."]
    if "same_as" in judged and (judged["same_as"] != "").any():
        lines += ["", "Identical levels (the same runs bit for bit, reported once): " + "; ".join(
            f"{r.pair} {r.level} ≡ {r.same_as}" for r in judged[judged["same_as"] != ""].itertuples()) + "."]
    if len(alpha):
        shown = alpha.assign(realised_alpha=[f"{100 * a:.2f}% ± {100 * s:.2f}" for a, s in
                                             zip(alpha["realised_alpha"], alpha["mc_se"])],
                             mean_seeds=alpha["mean_seeds"].map(lambda v: f"{v:.1f}")).drop(columns="mc_se")
        lines += ["", "Realised two-sided error at each threshold, simulated (`simulated` levels on the threshold "
                  "each, the study's own rule and planner, the A/A level's spreads and seeds; `spread_ratio`: the "
                  "level's sd over the A/A level's; designed for at most "
                  f"{100 * design.alpha:g}% at any spread ratio, its boundaries spending {100 * design.spent_alpha:g}%):",
                  "", markdown_table(shown)]
    return [*lines, ""]


def _markdown(summary: pd.DataFrame, levels: pd.DataFrame, *, tolerance: Tolerance,
              floor: pd.DataFrame | None = None, design: Design = DEFAULT_DESIGN,
              alpha: pd.DataFrame | None = None) -> str:
    shown = levels.assign(
        level=levels["level"].map(str),
        mismatch_kl=levels["mismatch_kl"].map(lambda v: f"{v:.3g}"),
        acc_delta=[_pm(100 * m, 100 * h, "{:+.1f}") for m, h in zip(levels["acc_delta"], levels["acc_delta_hw"])],
        kl_ratio=[_pm(m, h, "{:.3f}") for m, h in zip(levels["kl_ratio"], levels["kl_ratio_hw"])],
        sd=[_basis_text(a, k, on) for a, k, on in zip(levels.get("acc_delta_basis", [""] * len(levels)),
                                                        levels.get("kl_ratio_basis", [""] * len(levels)),
                                                        levels.get("judged_on", [""] * len(levels)))],
    )
    if "response_tokens" in shown:
        shown["response_tokens"] = shown["response_tokens"].map(lambda v: "—" if v != v else f"{v:.0f}")
    if "kl_auc_ratio" in shown:
        shown["kl_auc_ratio"] = [_pm(m, h, "{:.3f}") for m, h in zip(levels["kl_auc_ratio"], levels["kl_auc_ratio_hw"])]
    if "seeds_run" in shown:  # a look partly run: its seeds wait for the look ("6 (8 run)")
        shown["seeds"] = [f"{n} ({r} run)" if r != n else str(n) for n, r in zip(shown["seeds"], shown["seeds_run"])]
    kept = ["pair", "source", "loss", "response_tokens", "settings", "level", "seeds", "look", "mismatch_kl",
            "copy_kl_fwd_mean", "acc_delta", "kl_ratio", "kl_auc_ratio", "sd", "verdict", "judged_on", "marginal",
            "same_as", "accuracy_metric"]
    shown = shown[[c for c in kept if c in shown]].rename(columns={"acc_delta": "Δ accuracy (pts)"})
    return "\n".join([
        "# Tolerance of OPD to rollout mismatch", "",
        f"Each run is compared with its clean twin (same configuration and seed, clean rollouts). A level is "
        f"*tolerated* when the design's intervals over seeds of both Δ final held-out accuracy (≥ −{100 * tolerance.acc_tol:g} "
        f"points) and the final held-out KL ratio (≤ {1 + tolerance.kl_tol:g}) lie within the thresholds, *not tolerated* "
        "when either lies wholly beyond, *uncertain* otherwise (before the first look: no interval, always uncertain). "
        "`mismatch_kl`: mean over the run's steps of KL(rollout ‖ student) on the rollout tokens (nats).", "",
        "## Tolerance per pair × source", "", markdown_table(summary), "",
        *_design_markdown(levels, alpha if alpha is not None else pd.DataFrame(), design),
        *_floor_markdown(floor if floor is not None else pd.DataFrame()),
        "## Every level (mean over seeds ± the design's interval)", "", markdown_table(shown), ""])


def _basis_text(acc: object, kl: object, judged_on: object) -> str:
    """The sd basis of the statistics a level is judged on: "pooled" or "own" (with the A/A level), per
    statistic where they differ ("Δ own, KL pooled"); a statistic not judged is left out."""
    word = lambda b: "pooled" if str(b).startswith("pooled") else "own"  # noqa: E731
    if judged_on == "KL ratio":
        return word(kl)
    return word(kl) if word(acc) == word(kl) else f"Δ {word(acc)}, KL {word(kl)}"


def _pm(mean: float, half: float, pattern: str) -> str:
    if math.isnan(mean):
        return "—"
    return pattern.format(mean) + ("" if math.isnan(half) else f" ± {half:.3g}" if half < 1 else f" ± {half:.1f}")


def write_tolerance_report(rows: pd.DataFrame, out_dir: str | Path, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                       analysis: Analysis | None = None) -> list[Path]:
    """Write the tolerance tables and figures (module docstring) for a dataset's OPD (and probe) rows;
    `analysis`: the rows' `analyse` when the caller has it (`tolerance` is used only without one)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    opd = rows[rows["kind"] == "opd"]
    analysis = analysis if analysis is not None else analyse(rows, tolerance)
    runs, levels, tolerance = analysis.runs, analysis.levels, analysis.tolerance
    if levels.empty:
        return []
    summary = tolerance_table(levels)
    floor = noise_floor(runs, levels)
    written = [out_dir / "tolerance.md", out_dir / "tolerance.csv", out_dir / "tolerance_levels.csv",
               out_dir / "noise_floor.csv"]
    alpha = realised_alpha(levels, runs, tolerance=tolerance, design=analysis.design)
    written.append(write_headline(levels, runs, floor, alpha, out_dir, tolerance=tolerance, design=analysis.design))
    written[0].write_text(_markdown(summary, levels, tolerance=tolerance, floor=floor, design=analysis.design,
                                    alpha=alpha))
    summary.to_csv(written[1], index=False)
    levels.to_csv(written[2], index=False)
    floor.to_csv(written[3], index=False)
    written.append(save_figure(levels_figure(levels, tolerance=tolerance), out_dir / "tolerance_levels.png"))
    written.append(save_figure(mismatch_figure(levels, tolerance=tolerance), out_dir / "tolerance_vs_mismatch.png"))
    written.append(save_figure(seed_curves_figure(opd, runs), out_dir / "seed_curves.png"))
    students = student_probes(rows)
    if len(students) and students["layers"].map(is_isolation).any():
        written.append(save_figure(block_figure(students), out_dir / "block_sensitivity.png"))
    joined = static_dynamic_points(students, levels) if len(students) else pd.DataFrame()
    if len(joined):
        written.append(save_figure(static_dynamic_figure(joined, levels), out_dir / "static_vs_dynamic.png"))
    elif levels["source"].isin(CATEGORICAL_SOURCES).any():  # nothing to plot: said in the report, no empty figure
        with written[0].open("a") as md:
            md.write("\nNo `static_vs_dynamic.png`: no static probe of a pair's student shares a format with a "
                     "dynamic level here (probe `PAIR:student` with the same specs to draw it).\n")
    return written
