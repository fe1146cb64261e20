"""Reports from result files: a Markdown summary and plots. Reads results only, never a model.

`write_report(rows, out_dir)` writes
  * `summary.md` — one line per run (reference vs candidate or perturbation) with the headline
    divergences, the per-layer SQNR table, and the per-layer isolation map when present;
  * `per_layer.png` — SQNR (dB) and relative L2 error of every captured layer, one line per run;
  * `kl_cdf.png` — the distribution of per-token KL(p‖q) over scored tokens, one line per run;
  * `layer_map.png` — end-to-end kl_fwd_mean with one decoder block perturbed at a time
    (runs whose layer scope is a single block index, from `mismatch probe --each-layer`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mismatch.results import per_layer, summaries  # noqa: E402

HEADLINE = ("tokens", "kl_fwd_mean", "kl_fwd_p50", "kl_fwd_p99", "kl_fwd_max", "kl_rev_mean",
            "tv_mean", "top1_agree", "logp_abs_diff_mean", "is_ratio_outside_frac", "chi2_token",
            "is_ess", "ppl_ratio")


def run_label(run: pd.Series) -> str:
    """Human label of a run: the candidate (unless it is the perturbed reference) and what
    differs from the reference."""
    perturb = run.get("perturb")
    perturbed = isinstance(perturb, str) and perturb not in ("", "none")
    parts = [] if perturbed and run.get("candidate") == run.get("reference") else [str(run.get("candidate"))]
    if run.get("cand_dtype") not in (None, "fp32", run.get("ref_dtype")):
        parts.append(str(run.get("cand_dtype")))
    if perturbed:
        parts.append(perturb)
        if run.get("layers") not in (None, "linear"):
            parts.append(f"[{run.get('layers')}]")
    return " · ".join(parts)


def _is_isolation(layers: object) -> bool:
    """A run whose scope is one decoder block index (CSV files read it back as a number)."""
    return isinstance(layers, (str, int, np.integer)) and str(layers).isdigit()


def _fmt(value: float) -> str:
    if isinstance(value, float) and (np.isinf(value) or np.isnan(value)):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.3e}"


def markdown_table(frame: pd.DataFrame) -> str:
    """A Markdown table of `frame` (floats formatted compactly, everything else as text)."""
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_fmt(v) if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def write_report(rows: pd.DataFrame, out_dir: str | Path, *, title: str = "mismatch probe report") -> list[Path]:
    """Write `summary.md`, `per_layer.png` and `kl_cdf.png` for the runs in `rows`.

    Returns:
        The paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_runs = summaries(rows)
    all_runs["run"] = all_runs.apply(run_label, axis=1)
    isolated = all_runs[all_runs["layers"].map(_is_isolation)] if "layers" in all_runs else all_runs.iloc[:0]
    runs = all_runs.drop(isolated.index)
    rows = rows[~rows["run_id"].isin(isolated["run_id"])]
    layers = per_layer(rows)
    written = []

    table = runs[["run", "reference", *[c for c in HEADLINE if c in runs.columns]]]
    md = [f"# {title}", "",
          "Divergence of each candidate from its reference over the scored tokens (nats; "
          "definitions in DESIGN.md).", "", markdown_table(table), ""]
    if not layers.empty:
        sq = layers.pivot_table(index=["index", "layer"], columns="run_id", values="sqnr_db")
        sq = sq[[r for r in runs["run_id"] if r in sq.columns]].reset_index()  # runs in recorded order
        sq = sq.rename(columns=dict(zip(runs["run_id"], runs["run"])))
        md += ["## Per-layer SQNR (dB) of the hidden states", "", markdown_table(sq.drop(columns="index")), ""]
    if not isolated.empty:
        iso = isolated.assign(block=isolated["layers"].astype(int))
        kl = iso.pivot_table(index="block", columns="perturb", values="kl_fwd_mean")
        top1 = iso.pivot_table(index="block", columns="perturb", values="top1_agree")
        table_iso = pd.DataFrame({"block": kl.index.astype(str)})
        for spec in kl.columns:
            table_iso[f"{spec} kl_fwd_mean"] = kl[spec].to_numpy()
            table_iso[f"{spec} top1_agree"] = top1[spec].to_numpy()
        md += ["## Per-layer isolation map: one decoder block perturbed at a time", "",
               "End-to-end divergence with only that block's linear layers perturbed.", "",
               markdown_table(table_iso), ""]
        for spec in kl.columns:
            ranked = kl[spec].sort_values(ascending=False)
            top = ", ".join(f"{b} ({v:.3g})" for b, v in ranked.head(3).items())
            md.append(f"- {spec}: most sensitive blocks {top}; least sensitive {ranked.index[-1]} "
                      f"({ranked.iloc[-1]:.3g}); max/median = {ranked.iloc[0] / ranked.median():.1f}×.")
        md.append("")
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for spec in kl.columns:
            ax.plot(kl.index, kl[spec], marker="o", ms=3, label=spec)
        ax.set_yscale("log")
        ax.set_xlabel("decoder block perturbed alone")
        ax.set_ylabel("kl_fwd_mean (nats)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Per-layer isolation map")
        fig.tight_layout()
        fig.savefig(out / "layer_map.png", dpi=120)
        plt.close(fig)
        written.append(out / "layer_map.png")
    first = all_runs.iloc[0]
    md += [f"Provenance: mismatch {first.get('mismatch_version')}, torch {first.get('torch_version')}, "
           f"transformers {first.get('transformers_version')}, git {first.get('git_sha')}, "
           f"{first.get('timestamp')}.", ""]
    (out / "summary.md").write_text("\n".join(md), encoding="utf-8")
    written.insert(0, out / "summary.md")

    if not layers.empty:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
        by_run = dict(tuple(layers.groupby("run_id", sort=False)))
        for run_id, label in zip(runs["run_id"], runs["run"]):
            if run_id not in by_run:
                continue
            group = by_run[run_id]
            ax1.plot(group["index"], group["sqnr_db"], marker="o", ms=3, label=label)
            ax2.plot(group["index"], group["rel_l2"], marker="o", ms=3, label=label)
        names = layers.drop_duplicates("index").sort_values("index")
        step = max(1, len(names) // 12)
        for ax, ylabel in ((ax1, "SQNR (dB)"), (ax2, "relative L2 error")):
            ax.set_xticks(names["index"][::step], names["layer"][::step], rotation=45, ha="right")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        ax2.set_yscale("log")
        ax1.legend(fontsize=8)
        fig.suptitle("Hidden-state error per layer (candidate vs reference, scored tokens)")
        fig.tight_layout()
        fig.savefig(out / "per_layer.png", dpi=120)
        plt.close(fig)
        written.append(out / "per_layer.png")

    kl = rows[(rows["level"] == "token") & (rows["metric"] == "kl_fwd")]
    if not kl.empty:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for run_id, group in kl.groupby("run_id", sort=False):
            values = np.sort(group["value"].to_numpy())
            values = np.clip(values, 1e-12, None)  # exact zeros cannot sit on a log axis
            ax.plot(values, np.arange(1, len(values) + 1) / len(values),
                    label=runs.set_index("run_id").loc[run_id, "run"])
        ax.set_xscale("log")
        ax.set_xlabel("per-token KL(p‖q) (nats)")
        ax.set_ylabel("fraction of scored tokens ≤ x")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "kl_cdf.png", dpi=120)
        plt.close(fig)
        written.append(out / "kl_cdf.png")
    return written
