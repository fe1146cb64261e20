"""OPD reports: training curves and the tolerance verdict table. Reads results only, never a model.

Every run is judged against the clean run that shares every `OPDConfig` field except the rollout
ones (`mismatch.analysis.twins.verdict_table`, the same table `mismatch opd` prints).

`write_opd_report(rows, out_dir)` writes
  * `opd_curves.png` — held-out teacher–student reverse KL and held-out accuracy vs step, one line
    per run (at most `MAX_CURVES` runs; a study's curves are drawn as seed means by `report.tolerance`);
  * `opd_verdicts.md` — per run: the mean training/rollout mismatch it trained under, final held-out
    KL and accuracy, ratio and difference to clean, and the verdict.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mismatch.analysis.twins import accuracy_metric, opd_runs
from mismatch.rollout.spec import rollout_label
from mismatch.report.common import LEGEND_FONTSIZE, markdown_table, save_figure, style_axes, subplots
from mismatch.analysis.tolerance import Analysis, analyse, run_verdicts
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance, final_value

CURVES = (("heldout_rkl", "held-out reverse KL (nats/token)"),
          ("accuracy", "held-out accuracy (expected exact match where exact, else of samples)"))
CONFIG_LINE = ("pair", "loss", "steps", "batch_size", "lr", "seed")
MAX_CURVES = 16  # runs drawn one line each in opd_curves.png; more is a study, drawn as seed means


def _value_at(metrics: list[dict], metric: str, step: int) -> float:
    values = [m["value"] for m in metrics if m["metric"] == metric and m["step"] == step]
    return values[0] if values else float("nan")


def curves_figure(rows: pd.DataFrame):
    """Held-out KL and accuracy vs step, one line per run (the clean run in bold black)."""
    fig, axes = subplots(2, figsize=(12, 4.5))
    several_seeds = rows["seed"].nunique() > 1
    for cfg, run in opd_runs(rows):
        frame = pd.DataFrame(run)
        label = rollout_label(cfg) + (f" (seed {cfg['seed']})" if several_seeds else "")
        style = dict(color="black", linewidth=2.5) if rollout_label(cfg) == "clean" else dict(linewidth=1.4)
        for ax, (metric, _) in zip(axes, CURVES):
            metric = accuracy_metric(run) if metric == "accuracy" else metric  # the study's accuracy
            curve = frame[frame["metric"] == metric].sort_values("step")
            if len(curve):
                ax.plot(curve["step"], curve["value"], marker="o", markersize=3, label=label, **style)
    for ax, (_, ylabel) in zip(axes, CURVES):
        style_axes(ax, xlabel="OPD step", ylabel=ylabel)
    axes[0].legend(fontsize=LEGEND_FONTSIZE)
    pairs = ", ".join(sorted({str(p) for p in rows["pair"].unique()}))
    fig.suptitle(f"on-policy distillation under rollout mismatch ({pairs})")
    return fig


def _config_value(value: object) -> object:
    """Integral floats (an int column that met a null when frames were joined) print as ints."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _verdicts_markdown(rows: pd.DataFrame, analysis: Analysis) -> list[str]:
    tolerance = analysis.tolerance
    table = run_verdicts(rows, analysis=analysis)  # verdict_table + source, level, verdict
    judged = table[~table["clean"] & (table["baseline"] != "")]
    settings = dict(zip(table["run_id"], table["settings"])) if table["settings"].nunique() > 1 else {}
    seeds = table["seed"].nunique() > 1
    lines = ["# OPD under rollout mismatch: tolerance verdicts", "",
             f"Tolerated: final held-out reverse KL ≤ {1 + tolerance.kl_tol:.2f} × clean and final held-out accuracy "
             f"≥ clean − {100 * tolerance.acc_tol:.0f} points (same seed, same prompts); the verdict is the level's, over "
             "its seeds by the sequential design's intervals (tolerance.md; before the first look: uncertain), and a run that did not reach its last step is "
             "marked unfinished, never judged. `mismatch_kl`: mean over steps of "
             "KL(rollout ‖ student) on each step's rollout tokens (k1 estimate on the sampled tokens, nats).", ""]
    configs = {k: " / ".join(str(_config_value(v)) for v in rows[k].drop_duplicates()) for k in CONFIG_LINE if k in rows}
    lines.append("Config: " + ", ".join(f"{k} {v}" for k, v in configs.items()) + ".")
    for cfg, metrics in opd_runs(rows):
        if rollout_label(cfg) == "clean":
            acc = accuracy_metric(metrics)
            where = ", ".join([str(cfg.get("pair")), *([settings[cfg["run_id"]]] if settings else []),
                               *([f"seed {_config_value(cfg.get('seed'))}"] if seeds else [])])
            lines.append(f"Clean run ({where}): final held-out reverse KL "
                         f"{final_value(metrics, 'heldout_rkl'):.3f} nats, accuracy "
                         f"{final_value(metrics, acc):.1%} (step 0: "
                         f"{_value_at(metrics, 'heldout_rkl', 0):.3f} nats, {_value_at(metrics, acc, 0):.1%}; {acc}).")
    lines.append("")
    if not len(judged):
        return lines + ["No run has a clean baseline in its group: no verdicts."]
    columns = ["pair", "rollout", *(["settings"] if settings else []),
               *(["seed"] if judged["seed"].nunique() > 1 else []), "mismatch_kl", "mismatch_logp_abs_diff_mean", "heldout_rkl", "kl_ratio", "heldout_accuracy", "acc_delta", "status"]
    shown = judged[columns].assign(
        mismatch_kl=judged["mismatch_kl"].map(lambda v: f"{v:.3g}"),
        mismatch_logp_abs_diff_mean=judged["mismatch_logp_abs_diff_mean"].map(lambda v: f"{v:.3g}"),
        heldout_rkl=judged["heldout_rkl"].map(lambda v: f"{v:.3f}"),
        kl_ratio=judged["kl_ratio"].map(lambda v: f"{v:.3f}"),
        heldout_accuracy=judged["heldout_accuracy"].map(lambda v: f"{v:.1%}"),
        acc_delta=judged["acc_delta"].map(lambda v: f"{100 * v:+.1f} pts"),
        status=judged["status"].map(lambda v: f"**{v}**" if v.startswith(("not", "unfinished")) else v))
    if "seed" in columns:
        shown = shown.assign(seed=judged["seed"].map(_config_value))
    return lines + [markdown_table(shown)]


def write_opd_report(rows: pd.DataFrame, out_dir: str | Path, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                     analysis: Analysis | None = None) -> list[Path]:
    """Write `opd_verdicts.md` and, for at most `MAX_CURVES` runs, `opd_curves.png` for the OPD runs
    in `rows` (tidy, kind `opd`); returns the paths written. `analysis`: the rows' `analyse` when the
    caller has it (`tolerance` is used only without one)."""
    analysis = analysis if analysis is not None else analyse(rows, tolerance)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    verdicts = out_dir / "opd_verdicts.md"
    verdicts.write_text("\n".join(_verdicts_markdown(rows, analysis)) + "\n")
    if rows["run_id"].nunique() > MAX_CURVES:  # a study: seed_curves.png (report.tolerance) shows seed means
        return [verdicts]
    return [save_figure(curves_figure(rows), out_dir / "opd_curves.png"), verdicts]
