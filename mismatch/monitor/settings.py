"""`mismatch monitor`'s settings (stdlib only: the CLI reads its defaults at start-up)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MonitorSettings:
    """How a training log is judged. `patience`: consecutive logged steps with the gating statistic above
    its limit that make an alarm (a logged value is a point estimate of one step's tokens: one step above
    the limit may be noise). `trend_steps`: the last logged steps a straight line is fitted to (the trend);
    `total_steps`: the run's planned length, the horizon within which a rising trend that would reach the
    limit is flagged (default: the logged span once more)."""

    patience: int = 3
    trend_steps: int = 20  # the last logged steps the trend is fitted on (at least 5 finite values)
    total_steps: int | None = None  # the run's planned steps: the trend's horizon (default: as many again as logged)
