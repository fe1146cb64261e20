"""`mismatch monitor`'s settings (stdlib only: the CLI reads its defaults at start-up)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MonitorSettings:
    """How a training log is judged. `patience`: consecutive logged steps whose trailing window of the gating
    statistic is judged above its limit that make an alarm (each step is a new look at overlapping data: one
    may be chance). `trend_steps`: the last logged steps a straight line is fitted to (the trend);
    `total_steps`: the run's planned length, the horizon within which a rising trend that would reach the
    limit is flagged (default: the logged span once more)."""

    patience: int = 3
    trend_steps: int = 20  # the last logged steps the trend is fitted on (at least 5 finite values)
    total_steps: int | None = None  # the run's planned steps: the trend's horizon (default: as many again as logged)
