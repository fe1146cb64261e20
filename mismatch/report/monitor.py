"""`monitor.png`: a training log's mismatch statistics against the step, with the calibrated limits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mismatch.report.common import caption, save_figure, style_axes, subplots

PANEL = (5.0, 3.4)  # inches per panel
COLUMNS = 3


def plot_monitor(report, path: Path) -> Path:
    """One panel per calibrated statistic the log has (its values by step, with the trailing window's mean
    and interval where it is judged by windows; the limit as a line, the bracket the limit was fitted in as a
    band, steps judged above the limit marked; the gating statistic first), and one
    of the known statistics that are not comparable (no limit). `report`: a `mismatch.monitor.MonitorReport`."""
    stats = [report.gating, *report.others]
    panels = len(stats) + (1 if report.not_comparable else 0)
    ncols = min(COLUMNS, panels)
    nrows = -(-panels // ncols)
    fig, axes = subplots(ncols, nrows=nrows, figsize=(PANEL[0] * ncols, PANEL[1] * nrows))
    axes = np.atleast_1d(axes).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    for ax, stat in zip(axes, stats):
        steps, values = stat.values.index.to_numpy(), stat.values.to_numpy()
        judged = values
        if stat.window is None:
            ax.plot(steps, values, marker=".", color="tab:blue", label=f"{stat.logged_as} ({stat.framework})")
        else:  # the logged values faint, the trailing window's mean and interval judged
            w = stat.windows
            judged = w["mean"].to_numpy(dtype=float)
            ax.plot(steps, values, marker=".", color="tab:blue", alpha=0.35, lw=0.8,
                    label=f"{stat.logged_as} ({stat.framework})")
            ax.plot(steps, judged, color="tab:blue", lw=1.6, label=f"mean over the last {stat.window} steps")
            ax.fill_between(steps, w["low"].to_numpy(dtype=float), w["high"].to_numpy(dtype=float),
                            color="tab:blue", alpha=0.15, lw=0, label="its 95% t-interval")
        kind = "window limit" if stat.window is not None else "limit"
        ax.axhline(stat.limit, color="tab:red", lw=1.2, label=f"{kind} {stat.limit:.3g}")
        lo, hi = stat.bracket
        if not (math.isnan(lo) or math.isnan(hi)):
            ax.axhspan(lo, hi, color="tab:red", alpha=0.12, label=f"fitted in [{lo:.3g}, {hi:.3g}]")
        above = stat.above.to_numpy() & np.isfinite(judged)
        if above.any():
            ax.scatter(steps[above], judged[above], color="tab:red", zorder=3, s=18,
                       label="above the limit" if stat.window is None else "window above the limit")
        bad = ~np.isfinite(values)  # matplotlib draws nothing for NaN or ±inf: a vertical band marks each such step
        for step in steps[bad]:
            ax.axvspan(step - 0.5, step + 0.5, color="tab:purple", alpha=0.25, lw=0)
        if bad.any():
            ax.plot([], [], color="tab:purple", alpha=0.5, lw=6, label=f"not finite ({int(bad.sum())} steps: counted "
                                                                      "above the limit)")
        title = stat.name + (" — gates" if stat is report.gating else "")
        if stat is report.gating and report.alarm_step is not None:
            ax.axvline(report.alarm_step, color="tab:red", ls="--", lw=1)
            title += f": crossed at step {report.alarm_step}"
        ax.set_title(title, fontsize=10)
        style_axes(ax, xlabel="step", ylabel=stat.name, legend=True)
    if report.not_comparable:
        ax = axes[panels - 1]
        for name, (framework, _, values) in report.not_comparable.items():
            ax.plot(values.index.to_numpy(), values.to_numpy(), marker=".", label=f"{name} ({framework})")
        ax.set_yscale("symlog", linthresh=1e-2)  # their scales differ by decades (shares, ratios, χ²)
        ax.set_title("not comparable to a calibrated limit", fontsize=10)
        style_axes(ax, xlabel="step", ylabel="value", legend=True)
    judged = (f"its trailing {report.gating.window}-step window" if report.gating.window is not None
              else "its value")
    caption(fig, f"{report.path} ({report.format}): {report.steps} logged steps; alarm after {report.patience} "
                 f"consecutive logged steps with {judged} above the gating limit; limits {report.thresholds_source}")
    return save_figure(fig, path)
