"""Reports of OPD runs (`mismatch opd --out`): training curves and the tolerance verdict table.

Reads the tidy metric rows only (`step`, `metric`, `value` plus the run's config columns), never a
model. Within each `(pair, loss, seed, …)` group the clean run (rollout `none`, staleness 0) is the
baseline every other run is judged against (`mismatch.opd.verdict`).

`write_opd_report(rows, out_dir)` writes
  * `opd_curves.png` — held-out teacher–student reverse KL and held-out accuracy vs step, one line
    per rollout configuration;
  * `opd_verdicts.md` — per run: the mean training/rollout mismatch it trained under, final held-out
    KL and accuracy, ratio and difference to clean, and the verdict.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mismatch.opd.verdict import final_value, verdict  # noqa: E402
from mismatch.report import markdown_table  # noqa: E402

OPD_COLUMNS = {"step", "metric", "value", "run_id"}
# config columns that must agree for two runs to be compared (everything but the rollout)
_GROUP = ("pair", "loss", "seed", "steps", "batch_size", "lr", "temperature", "tis_cap")


def is_opd(rows: pd.DataFrame) -> bool:
    """Whether a result frame holds OPD metric rows (as opposed to probe results)."""
    return OPD_COLUMNS <= set(rows.columns) and "level" not in rows.columns


def rollout_label(rollout: str, staleness: int) -> str:
    """`clean`, the rollout spec, or `spec + stale:K`."""
    base = "clean" if rollout in ("", "none") else rollout
    if staleness:
        return f"stale:{staleness}" if base == "clean" else f"{base} + stale:{staleness}"
    return base


def _value_at(metrics: list[dict], metric: str, step: int) -> float:
    values = [m["value"] for m in metrics if m["metric"] == metric and m["step"] == step]
    return values[0] if values else math.nan


def _runs(rows: pd.DataFrame) -> list[tuple[dict, list[dict]]]:
    """`(config, metric rows)` per run, in order of first appearance."""
    out = []
    for _, frame in rows.groupby("run_id", sort=False):
        first = frame.iloc[0]
        config = {k: first[k] for k in frame.columns if k not in ("step", "metric", "value")}
        out.append((config, frame[["step", "metric", "value"]].to_dict("records")))
    return out


def opd_verdicts(rows: pd.DataFrame, *, kl_tol: float = 0.10, acc_tol: float = 0.02) -> pd.DataFrame:
    """One row per non-clean run: the mismatch it trained under and the verdict against its group's
    clean run (`mismatch.opd.verdict.verdict`). Runs without a clean run in their group are skipped.

    Columns: pair, rollout (label), mismatch_kl (mean over steps of the per-step rollout/training KL
    on the rollout tokens, nats), mismatch_logp_abs_diff_mean, heldout_rkl, kl_ratio,
    heldout_accuracy, acc_delta (fraction), tolerated.
    """
    runs = _runs(rows)
    key = lambda cfg: tuple(str(cfg.get(k)) for k in _GROUP)  # noqa: E731
    label_of = lambda cfg: rollout_label(str(cfg.get("rollout")), int(cfg.get("staleness", 0)))  # noqa: E731
    clean = {key(cfg): metrics for cfg, metrics in runs if label_of(cfg) == "clean"}
    table = []
    for cfg, metrics in runs:
        label = label_of(cfg)
        if label == "clean" or key(cfg) not in clean:
            continue
        v = verdict(clean[key(cfg)], metrics, kl_tol=kl_tol, acc_tol=acc_tol)

        def mean_of(metric: str) -> float:
            values = [m["value"] for m in metrics if m["metric"] == metric]
            return sum(values) / len(values) if values else math.nan

        table.append({"pair": cfg.get("pair"), "rollout": label, "mismatch_kl": mean_of("mismatch_kl"),
                      "mismatch_logp_abs_diff_mean": mean_of("mismatch_logp_abs_diff_mean"),
                      "heldout_rkl": v["run_heldout_rkl"], "kl_ratio": v["kl_ratio"],
                      "heldout_accuracy": v["run_heldout_accuracy"], "acc_delta": v["acc_delta"],
                      "tolerated": v["tolerated"]})
    return pd.DataFrame(table)


def _curves(rows: pd.DataFrame, path: Path) -> None:
    metrics = [("heldout_rkl", "held-out reverse KL (nats/token)"),
               ("heldout_accuracy", "held-out accuracy (temperature-1 samples)")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for cfg, run in _runs(rows):
        frame = pd.DataFrame(run)
        label = rollout_label(str(cfg.get("rollout")), int(cfg.get("staleness", 0)))
        style = dict(color="black", linewidth=2.5) if label == "clean" else dict(linewidth=1.4)
        for ax, (metric, _) in zip(axes, metrics):
            curve = frame[frame["metric"] == metric].sort_values("step")
            if len(curve):
                ax.plot(curve["step"], curve["value"], marker="o", markersize=3, label=label, **style)
    for ax, (_, ylabel) in zip(axes, metrics):
        ax.set_xlabel("OPD step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    pairs = ", ".join(sorted({str(p) for p in rows["pair"].unique()}))
    fig.suptitle(f"on-policy distillation under rollout mismatch ({pairs})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_opd_report(rows: pd.DataFrame, out_dir: str | Path, *, kl_tol: float = 0.10,
                     acc_tol: float = 0.02) -> list[Path]:
    """Write `opd_curves.png` and `opd_verdicts.md` for the OPD runs in `rows`; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = out_dir / "opd_curves.png"
    _curves(rows, curves)
    table = opd_verdicts(rows, kl_tol=kl_tol, acc_tol=acc_tol)
    lines = ["# OPD under rollout mismatch: tolerance verdicts", "",
             f"Tolerated: final held-out reverse KL ≤ {1 + kl_tol:.2f} × clean and final held-out accuracy "
             f"≥ clean − {100 * acc_tol:.0f} points (same seed, same prompts). `mismatch_kl`: mean over steps of "
             "KL(rollout ‖ student) on each step's rollout tokens (k1 estimate on the sampled tokens, nats).", ""]
    configs = {k: rows[k].iloc[0] for k in ("pair", "loss", "steps", "batch_size", "lr", "seed") if k in rows}
    lines.append("Config: " + ", ".join(f"{k} {v}" for k, v in configs.items()) + ".")
    for cfg, metrics in _runs(rows):
        if rollout_label(str(cfg.get("rollout")), int(cfg.get("staleness", 0))) == "clean":
            lines.append(f"Clean run ({cfg.get('pair')}): final held-out reverse KL "
                         f"{final_value(metrics, 'heldout_rkl'):.3f} nats, accuracy "
                         f"{final_value(metrics, 'heldout_accuracy'):.1%} (step 0: "
                         f"{_value_at(metrics, 'heldout_rkl', 0):.3f} nats, {_value_at(metrics, 'heldout_accuracy', 0):.1%}).")
    lines.append("")
    if len(table):
        shown = table.assign(
            mismatch_kl=table["mismatch_kl"].map(lambda v: f"{v:.3g}"),
            mismatch_logp_abs_diff_mean=table["mismatch_logp_abs_diff_mean"].map(lambda v: f"{v:.3g}"),
            heldout_rkl=table["heldout_rkl"].map(lambda v: f"{v:.3f}"),
            kl_ratio=table["kl_ratio"].map(lambda v: f"{v:.3f}"),
            heldout_accuracy=table["heldout_accuracy"].map(lambda v: f"{v:.1%}"),
            acc_delta=table["acc_delta"].map(lambda v: f"{100 * v:+.1f} pts"),
            tolerated=table["tolerated"].map(lambda v: "yes" if v else "**no**"))
        lines.append(markdown_table(shown))
    else:
        lines.append("No run has a clean baseline in its group: no verdicts.")
    verdicts = out_dir / "opd_verdicts.md"
    verdicts.write_text("\n".join(lines) + "\n")
    return [curves, verdicts]
