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

from mismatch.files import atomic_write  # noqa: E402

DPI = 120
LEGEND_FONTSIZE = 8
GRID_ALPHA = 0.3
MAX_LEGEND = 8  # entries per legend; a figure with more series facets them
# one colour per level family (mismatch source), the same in every figure: the family's colour for a
# single series, shades of its colormap (light → dark with the level or series order) for several
FAMILY_COLORS = {"clean": "black", "format": "tab:blue", "noise": "tab:orange", "stale": "tab:green",
                 "reuse": "tab:red", "engine": "tab:purple", "A/A": "grey"}
FAMILY_COLORMAPS = {"format": "Blues", "noise": "Oranges", "stale": "Greens", "reuse": "Reds", "engine": "Purples"}


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


def family_color(source: str, index: int = 0, count: int = 1):
    """The colour of series `index` of `count` in level family `source` (`FAMILY_COLORS`)."""
    if count <= 1 or source not in FAMILY_COLORMAPS:
        return FAMILY_COLORS.get(source, "grey")
    return plt.get_cmap(FAMILY_COLORMAPS[source])(0.45 + 0.5 * index / (count - 1))


CAPTION_FONTSIZE = 7
CAPTION_WIDTH = 180  # characters per caption line


def caption(fig, text: str) -> None:
    """A caption under the figure's axes (wrapped): where settings go instead of into titles.
    `save_figure` leaves room for it."""
    import textwrap

    fig._mismatch_caption = "\n".join(textwrap.wrap(text, CAPTION_WIDTH))


def save_figure(fig, path: Path) -> Path:
    """Lay out (leaving room for a `caption`), write as PNG at the house resolution (atomically), close;
    return the path."""
    text = getattr(fig, "_mismatch_caption", None)
    if text:
        inches = (text.count("\n") + 1.6) * CAPTION_FONTSIZE / 72 * 1.35  # line height ≈ 1.35 × font size
        bottom = min(0.4, inches / fig.get_figheight())
        fig.text(0.01, 0.005, text, fontsize=CAPTION_FONTSIZE, ha="left", va="bottom")
        fig.tight_layout(rect=(0, bottom, 1, 1))
    else:
        fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png"))  # complete or not at all
    plt.close(fig)
    return Path(path)


def subplots(ncols: int = 1, *, nrows: int = 1, figsize: tuple[float, float], **shared):
    """A new figure with `nrows` × `ncols` axes (one row: side by side); `sharex` / `sharey` pass on."""
    return plt.subplots(nrows, ncols, figsize=figsize, **shared)
