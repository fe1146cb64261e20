"""What every report shares: Markdown tables, number formatting, and the axes/legend/figure style.

Reports read result datasets only, never a model (docs/contributing.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

DPI = 120
LEGEND_FONTSIZE = 8
GRID_ALPHA = 0.3


def fmt(value: float) -> str:
    """A float in 4 significant digits, or scientific notation outside [1e-3, 1e5)."""
    if isinstance(value, float) and (np.isinf(value) or np.isnan(value)):
        return str(value)
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.3e}"


def plus_minus(mean: float | None, half: float | None, scale: float = 1.0, pattern: str = "{:+.1f}") -> str:
    """`mean ± half` for a Markdown cell, both × `scale` (100: points), the half-width to 1 decimal
    when scaled up and 3 otherwise; "—" without a mean, the mean alone without a half-width."""
    if mean is None or math.isnan(mean):
        return "—"
    text = pattern.format(mean * scale)
    return text if half is None or math.isnan(half) else f"{text} ± {abs(half * scale):.{1 if scale > 1 else 3}f}"


def markdown_table(frame: pd.DataFrame) -> str:
    """A Markdown table of `frame` (floats formatted compactly, everything else as text)."""
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(fmt(v) if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def style_axes(ax, *, xlabel: str | None = None, ylabel: str | None = None, legend: bool = False) -> None:
    """The house style of an axes: labels, a light grid, and a small legend when asked."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=GRID_ALPHA)
    if legend:
        ax.legend(fontsize=LEGEND_FONTSIZE)


def save_figure(fig, path: Path) -> Path:
    """Lay out, write as PNG at the house resolution, close; return the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def subplots(ncols: int = 1, *, nrows: int = 1, figsize: tuple[float, float]):
    """A new figure with `nrows` × `ncols` axes (one row: side by side)."""
    return plt.subplots(nrows, ncols, figsize=figsize)
