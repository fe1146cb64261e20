"""The admission limit applied to a training run's own log, step by step: `monitor(path)`.

A check before the run judges the first batch; mismatch can grow during training (a drifting engine, a
cache bug, weights that move into a region the rollout format handles worse). `monitor` reads the per-step
statistics the run logged (`mismatch.monitor.logs`), maps each framework's name onto the calibrated
statistic it is (`mismatch.monitor.names`), and judges the *gating* statistic — the thresholds file's
primary (`mismatch_kl`), else the first of its calibrated statistics the log has — against its limit: the
run is `crossed` when the statistic lies above the limit on `patience` consecutive logged steps, else
`within`. Each logged step's value is a point estimate (a log keeps no interval), hence the patience.
Every other calibrated statistic found is reported against its own limit, but does not decide.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mismatch.admission.thresholds import Thresholds, load_thresholds
from mismatch.errors import InputError
from mismatch.files import atomic_write_text, check_writable
from mismatch.monitor.logs import STEP, read_log
from mismatch.monitor.names import COMPARABLE, NOT_COMPARABLE
from mismatch.monitor.settings import MonitorSettings


@dataclass
class Statistic:
    """One calibrated statistic as the log has it: its values by step, where they come from, its limit."""

    name: str
    logged_as: str
    framework: str
    how: str
    values: pd.Series  # float, indexed by step (logged steps only)
    limit: float
    bracket: tuple[float, float]
    also_logged_as: list[str] = field(default_factory=list)

    @property
    def crossed_steps(self) -> list[int]:
        return [int(s) for s in self.values.index[self.values > self.limit]]

    def _runs_above(self):
        """`(step, n)` per logged step: n consecutive logged steps up to it lie above the limit (0 if it does not)."""
        run = 0
        for step, value in self.values.items():
            run = run + 1 if value > self.limit else 0
            yield int(step), run

    def first_alarm(self, patience: int) -> int | None:
        """The logged step at which `patience` consecutive logged steps above the limit are complete."""
        return next((step for step, run in self._runs_above() if run >= patience), None)

    def longest_run(self) -> int:
        return max((run for _, run in self._runs_above()), default=0)


@dataclass
class MonitorReport:
    """What `monitor` found. `status`: `crossed` (the gating statistic above its limit on `patience`
    consecutive logged steps) or `within`; `alarm_step`: where the patience ran out."""

    path: str
    format: str
    steps: int
    patience: int
    gating: Statistic
    others: list[Statistic]
    not_comparable: dict[str, tuple[str, str, pd.Series]]  # logged name → (framework, why, values)
    thresholds_source: str
    written: list[Path] = field(default_factory=list)

    @property
    def alarm_step(self) -> int | None:
        return self.gating.first_alarm(self.patience)

    @property
    def status(self) -> str:
        return "crossed" if self.alarm_step is not None else "within"

    def summary(self) -> dict:
        """A JSON-able summary: the gate, its verdict, every statistic's crossings."""
        def one(s: Statistic) -> dict:
            return {"statistic": s.name, "logged_as": s.logged_as, "framework": s.framework, "definition": s.how,
                    "limit": s.limit, "bracket": list(s.bracket), "steps": len(s.values),
                    "last": float(s.values.iloc[-1]), "max": float(s.values.max()),
                    "crossed_steps": s.crossed_steps, "longest_run_above": s.longest_run(),
                    "also_logged_as": s.also_logged_as}
        return {"log": self.path, "format": self.format, "logged_steps": self.steps, "patience": self.patience,
                "status": self.status, "alarm_step": self.alarm_step, "gating": one(self.gating),
                "others": [one(s) for s in self.others],
                "not_comparable": {k: {"framework": f, "why": why} for k, (f, why, _) in self.not_comparable.items()},
                "thresholds": self.thresholds_source}

    def long_table(self) -> pd.DataFrame:
        """Every value read, long: step, name (as logged), statistic (None where not comparable), value."""
        frames = [pd.DataFrame({STEP: s.values.index, "logged_as": s.logged_as, "statistic": s.name,
                                "value": s.values.to_numpy(), "limit": s.limit})
                  for s in (self.gating, *self.others)]
        frames += [pd.DataFrame({STEP: v.index, "logged_as": name, "statistic": None, "value": v.to_numpy(),
                                 "limit": math.nan}) for name, (_, _, v) in self.not_comparable.items()]
        return pd.concat(frames, ignore_index=True)


def statistics_of(table: pd.DataFrame, thresholds: Thresholds) -> tuple[list[Statistic], dict]:
    """The calibrated statistics `table` has (one reading each: the first of `COMPARABLE` present, the
    others noted as `also_logged_as`), in the thresholds' order, and the known names that are not comparable."""
    found: dict[str, Statistic] = {}
    indexed = table.set_index(STEP)
    for reading in COMPARABLE:
        if reading.statistic not in thresholds.limits or not all(n in indexed for n in reading.needs):
            continue
        parts = indexed[list(reading.needs)].dropna()
        if parts.empty:
            continue
        if reading.statistic in found:
            found[reading.statistic].also_logged_as.append(reading.logged_as)
            continue
        values = pd.Series([reading.convert(*row) for row in parts.itertuples(index=False)], index=parts.index,
                           dtype=float)
        lo, hi = thresholds.brackets.get(reading.statistic, [math.nan, math.nan])
        found[reading.statistic] = Statistic(reading.statistic, reading.logged_as, reading.framework, reading.how,
                                             values, float(thresholds.limits[reading.statistic]), (lo, hi))
    ordered = [found[name] for name in dict.fromkeys([thresholds.primary, *thresholds.limits]) if name in found]
    others = {name: (fw, why, indexed[name].dropna()) for name, (fw, why) in NOT_COMPARABLE.items()
              if name in indexed and indexed[name].notna().any()}
    return ordered, others


def monitor(path: str | Path, *, thresholds: str | Path | Thresholds | None = None,
            settings: MonitorSettings = MonitorSettings(), run: str | None = None,
            out_dir: str | Path | None = None) -> MonitorReport:
    """Judge a training log against the calibrated limits.

    Args:
        path: a `trainer_state.json`, TensorBoard events, a JSON-lines metrics log, or a results dataset
            (`mismatch.monitor.logs.read_log`).
        thresholds: a thresholds file or `Thresholds` (default: the shipped, fitted ones).
        settings: `patience` (consecutive logged steps above the limit that make an alarm).
        run: with a results dataset of several OPD runs, the run id.
        out_dir: also write the plot, the values and the summary there (`write_monitor`); checked
            before the log is read.

    Returns:
        The `MonitorReport` (`written`: the files written).

    Raises:
        InputError: an unreadable log (`read_log`), or one with no statistic a calibrated limit applies to
            (the known names it has are listed with why they are not comparable).
    """
    if settings.patience < 1:
        raise InputError(f"patience must be ≥ 1, got {settings.patience}")
    if out_dir is not None:
        check_writable(out_dir, "monitor output", folder=True)
    table_of_thresholds = thresholds if isinstance(thresholds, Thresholds) else load_thresholds(thresholds)
    table, kind = read_log(path, run=run)
    found, others = statistics_of(table, table_of_thresholds)
    if not found:
        known = "; ".join(f"{name} ({fw}: {why})" for name, (fw, why, _) in others.items())
        raise InputError(f"{path}: no statistic a calibrated limit applies to"
                         + (f"; known but not comparable: {known}" if known else
                            f" (looked for {', '.join(sorted({n for r in COMPARABLE for n in r.needs}))})"))
    source = f"{thresholds}" if isinstance(thresholds, (str, Path)) else table_of_thresholds.fitted_on
    report = MonitorReport(str(path), kind, len(table), settings.patience, found[0], found[1:], others, source)
    if out_dir is not None:
        report.written = write_monitor(report, out_dir)
    return report


def write_monitor(report: MonitorReport, out_dir: str | Path) -> list[Path]:
    """`monitor.png` (each statistic against the step, with its limit and bracket), `monitor.csv` (every value
    read) and `monitor.json` (`MonitorReport.summary`) in `out_dir`, each written atomically."""
    from mismatch.report.monitor import plot_monitor

    out = Path(out_dir)
    check_writable(out, "monitor output", folder=True)
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_monitor(report, out / "monitor.png"),
               atomic_write_text(out / "monitor.csv", report.long_table().to_csv(index=False)),
               atomic_write_text(out / "monitor.json", json.dumps(report.summary(), indent=1) + "\n")]
    return written
