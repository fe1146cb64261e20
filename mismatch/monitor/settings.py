"""`mismatch monitor`'s settings (stdlib only: the CLI reads its defaults at start-up)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MonitorSettings:
    """How a training log is judged. `patience`: consecutive logged steps with the gating statistic above
    its limit that make an alarm (a logged value is a point estimate of one step's tokens: one step above
    the limit may be noise)."""

    patience: int = 3
