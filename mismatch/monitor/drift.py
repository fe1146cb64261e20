"""The admission limit applied to a training run's own log, step by step: `monitor(path)`.

A check before the run judges the pipeline's first steps; mismatch can grow during training (a drifting engine, a
cache bug, weights that move into a region the rollout format handles worse). `monitor` reads the per-step
statistics the run logged (`mismatch.monitor.logs`), maps each framework's name onto the calibrated statistic it
is in the run's mode (`mismatch.monitor.names`: the mode from a framework config given, the config the log
carries, or the toolkit's own), and judges the *gating* statistic — the thresholds file's primary (`mismatch_kl`),
else the first of its calibrated statistics the log has — the way `check --teacher` judges a pipeline: the *window
statistic*, the mean of the per-step values over a window of `Thresholds.window_steps` optimizer steps (the
study's `window:` statistics, `mismatch.admission.transfer`), with its 95% t-interval over the window's logged
values, against the window limit fitted on every source (`Thresholds.window_limits`; with the trainer's `loss`
given, the primary statistic's limit for that loss as the check picks it, `Thresholds.for_loss`; else the one
pooled over losses: a log does not say its loss). Here the window trails: at
each logged step s, the steps `(s − W, s]` (from the log's first step while fewer have been logged: a short run is
judged on what it has). A window is *above* when the check would reject it (its interval wholly above the limit);
a window with one logged value (a log written every W steps or more sparsely) has no interval and is above when
its value is. The run is `crossed` when its windows are above on `patience` consecutive logged steps, else
`within`. A logged value that is not finite (NaN, ±inf) makes its windows above: it is the loudest signal a log
can give, and the count of such steps is reported. Every other calibrated statistic found is judged the same way
against its own window limit, but does not decide; a limit the framework applied itself (NeMo RL's sequence gate)
is judged as that framework does, value by value. A thresholds file without window limits (written before they
were fitted) judges each logged value against the first-step limit instead, and says so.

The window limit was fitted on the first window after a lag is full; a run's later windows are judged against
it too, so drift since the start counts against the run (what a monitor is for).

A run below its limit can still be heading for it (mismatch grows during training: verl PR #7519's per-tensor
FP8 `rollout_corr/kl` rose 0.010 → 0.031 over 32 steps). So the gating statistic's last `trend_steps` logged
values get a least-squares line (`Trend`: slope with its 95% t interval); a run not crossed is `rising` when
the slope's interval lies above 0 and the line reaches the limit within the run's planned steps
(`total_steps`; default: the logged span once more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from mismatch.admission.decision import decide
from mismatch.admission.thresholds import Thresholds, load_thresholds
from mismatch.analysis.tolerance import t_interval
from mismatch.errors import InputError
from mismatch.files import atomic_write_text, check_writable, json_text
from mismatch.metrics import ROLLOUT_STATS_CONFIG
from mismatch.monitor.logs import STEP, Log, read_config, read_log
from mismatch.monitor.names import GATES, NAMES, TOOLKIT, comparable_names, flat_config, meaning, resolve_settings
from mismatch.monitor.settings import MonitorSettings
from mismatch.verdict import ADMISSION_WORDS, Verdict


@dataclass(frozen=True)
class Trend:
    """A least-squares line through a statistic's last logged values: `slope` per step with its 95% t
    interval (`low`, `high`), over `points` values ending at `last_step`, where the line stands at `fitted`;
    `reaches_limit_at`: the step where the line meets the limit (None unless the slope is positive)."""

    slope: float
    low: float
    high: float
    points: int
    last_step: int
    fitted: float
    reaches_limit_at: float | None

    def summary(self) -> dict:
        return {"slope": self.slope, "interval": [self.low, self.high], "points": self.points,
                "last_step": self.last_step, "fitted_at_last_step": self.fitted,
                "reaches_limit_at": self.reaches_limit_at}


def fit_trend(values: pd.Series, limit: float, last: int) -> Trend | None:
    """The `Trend` of the last `last` finite values of `values` (indexed by step); None with fewer than 5."""
    from scipy import stats

    finite = values[np.isfinite(values.to_numpy(dtype=float))].iloc[-last:]
    if len(finite) < 5:
        return None
    x, y = finite.index.to_numpy(dtype=float), finite.to_numpy(dtype=float)
    fit = stats.linregress(x, y)
    half = float(stats.t.ppf(0.975, len(x) - 2)) * fit.stderr
    fitted = fit.intercept + fit.slope * x[-1]
    reaches = x[-1] + (limit - fitted) / fit.slope if fit.slope > 0 else None
    return Trend(float(fit.slope), float(fit.slope - half), float(fit.slope + half), len(x), int(x[-1]),
                 float(fitted), None if reaches is None else float(reaches))


@dataclass
class Statistic:
    """One statistic as the log has it: its values by step (logged steps only, non-finite values kept),
    where they come from (`how`: its definition in the run's mode; `mode`: that mode), its limit, and
    `caveat`: what a judge of it must know. `window`: the optimizer steps whose mean is judged against the
    limit (module docstring); None: each logged value is judged alone (a framework's own gate, or a limit
    fitted on first steps). `limit_levels`: the levels its limit was fitted on, where a loss chose the limit
    (`Thresholds.for_loss`; not the table's own `Thresholds.fitted_on`). A value above the limit or not finite
    counts as above."""

    name: str
    logged_as: str
    framework: str
    how: str
    values: pd.Series  # float, indexed by step
    limit: float
    bracket: tuple[float, float]
    also_logged_as: list[str] = field(default_factory=list)
    mode: str = ""
    caveat: str | None = None
    window: int | None = None
    limit_levels: str = ""

    @cached_property
    def windows(self) -> pd.DataFrame:
        """Per logged step `s`, its trailing window `(s − window, s]` (shorter at the start of the log): the
        number of logged values in it, their mean and 95% t-interval (`low`, `high`; the mean itself with one
        value), and the check's verdict of it (`decision`: PASS, FAIL or UNCERTAIN). Empty without a window."""
        cols = ["n", "mean", "low", "high", "decision"]
        if self.window is None:
            return pd.DataFrame(columns=cols)
        steps, v = self.values.index.to_numpy(), self.values.to_numpy(dtype=float)  # logged steps, increasing
        rows, index = [], []
        for i, step in enumerate(steps):
            inside = v[np.searchsorted(steps, step - self.window, side="right"):i + 1]
            if not np.isfinite(inside).all():
                rows.append((len(inside), math.nan, math.nan, math.nan, Verdict.FAIL))
            else:
                mean, half = t_interval(inside)
                low, high = (mean, mean) if len(inside) < 2 else (mean - half, mean + half)
                rows.append((len(inside), mean, low, high, decide(mean, low, high, self.limit)))
            index.append(step)
        return pd.DataFrame(rows, columns=cols, index=pd.Index(index, name=STEP))

    @property
    def last_window(self) -> pd.Series | None:
        """The last row of `windows` (its step as the row's `name`; shorter than `window` steps on a log that
        is): what the summary and the table show; None without a window."""
        return None if self.windows.empty else self.windows.iloc[-1]

    @property
    def above(self) -> pd.Series:
        """Per logged step: the value judged there (the trailing window's, or the value itself) lies above
        the limit, or is not finite."""
        if self.window is None:
            v = self.values.to_numpy(dtype=float)
            return pd.Series(~np.isfinite(v) | (v > self.limit), index=self.values.index)
        failed = self.windows["decision"] == Verdict.FAIL
        return failed.reindex(self.values.index, fill_value=False).astype(bool)

    @property
    def crossed_steps(self) -> list[int]:
        return [int(s) for s in self.values.index[self.above.to_numpy()]]

    @property
    def nonfinite_steps(self) -> list[int]:
        return [int(s) for s in self.values.index[~np.isfinite(self.values.to_numpy(dtype=float))]]

    def _runs_above(self):
        """`(step, n)` per logged step: n consecutive logged steps up to it are above (0 if it is not)."""
        run = 0
        for step, above in self.above.items():
            run = run + 1 if above else 0
            yield int(step), run

    def first_alarm(self, patience: int) -> int | None:
        """The logged step at which `patience` consecutive logged steps above are complete."""
        return next((step for step, run in self._runs_above() if run >= patience), None)

    def longest_run(self) -> int:
        return max((run for _, run in self._runs_above()), default=0)


@dataclass
class MonitorReport:
    """What `monitor` found. `status`: `crossed` (the gating statistic above its limit on `patience`
    consecutive logged steps), `rising` (not crossed, but its `trend` rises and reaches the limit by
    `horizon`) or `within`; `alarm_step`: where the patience ran out. `framework_gates`: the
    framework's own limits on what it logged (not deciding); `framework_settings`: each setting read to
    decide a name's mode, `key → (value, where it came from)`; `notes`: what the reading left out."""

    path: str
    format: str
    steps: int
    patience: int
    gating: Statistic
    others: list[Statistic]
    not_comparable: dict[str, tuple[str, str, pd.Series]]  # logged name → (framework, why, values)
    thresholds_source: str
    written: list[Path] = field(default_factory=list)
    framework_gates: list[Statistic] = field(default_factory=list)
    framework_settings: dict[str, tuple[object, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    trend: Trend | None = None
    horizon: int | None = None  # the step by which a rising trend must reach the limit to be flagged

    @property
    def alarm_step(self) -> int | None:
        return self.gating.first_alarm(self.patience)

    @property
    def rising(self) -> bool:
        """The gating statistic's slope is positive at 95% and its line reaches the limit by `horizon`."""
        t = self.trend
        return (t is not None and self.horizon is not None and t.low > 0 and t.reaches_limit_at is not None
                and t.reaches_limit_at <= self.horizon)

    @property
    def status(self) -> str:
        return "crossed" if self.alarm_step is not None else "rising" if self.rising else "within"

    def summary(self) -> dict:
        """A JSON-able summary (strict JSON: a non-finite value is the string `nan`, `inf` or `-inf`): the
        gate, its verdict, every statistic's crossings, the framework's own gates, the settings read."""
        def one(s: Statistic) -> dict:
            return {"statistic": s.name, "logged_as": s.logged_as, "framework": s.framework, "definition": s.how,
                    "mode": s.mode, "caveat": s.caveat, "limit": s.limit,
                    "bracket": [_json_float(b) for b in s.bracket], "steps": len(s.values),
                    "last": _json_float(s.values.iloc[-1]),
                    "max": _json_float(s.values.max()),  # NaN skipped, ±inf kept
                    "crossed_steps": s.crossed_steps, "nonfinite_steps": s.nonfinite_steps,
                    "longest_run_above": s.longest_run(), "also_logged_as": s.also_logged_as,
                    "window": s.window, "last_window": _last_window(s)}
        return {"log": self.path, "format": self.format, "logged_steps": self.steps, "patience": self.patience,
                "status": self.status, "alarm_step": self.alarm_step, "gating": one(self.gating),
                "trend": None if self.trend is None else self.trend.summary(), "horizon": self.horizon,
                "others": [one(s) for s in self.others],
                "framework_gates": [one(s) for s in self.framework_gates],
                "not_comparable": {k: {"framework": f, "why": why} for k, (f, why, _) in self.not_comparable.items()},
                "framework_settings": {k: {"value": _json_value(v), "from": where}
                                       for k, (v, where) in self.framework_settings.items()},
                "notes": self.notes, "thresholds": self.thresholds_source}

    def long_table(self) -> pd.DataFrame:
        """Every value read, long: step, name (as logged), statistic (None where not comparable), value."""
        frames = [pd.DataFrame({STEP: s.values.index, "logged_as": s.logged_as, "statistic": s.name,
                                "value": s.values.to_numpy(), "limit": s.limit})
                  for s in (self.gating, *self.others)]
        frames += [pd.DataFrame({STEP: v.index, "logged_as": name, "statistic": None, "value": v.to_numpy(),
                                 "limit": math.nan}) for name, (_, _, v) in self.not_comparable.items()]
        return pd.concat(frames, ignore_index=True)


def _last_window(s: Statistic) -> dict | None:
    """`s.last_window` as JSON: its step, logged values, mean, interval and the check's verdict of it."""
    last = s.last_window
    if last is None:
        return None
    return {"step": int(last.name), "values": int(last["n"]), "mean": _json_float(last["mean"]),
            "interval": [_json_float(last["low"]), _json_float(last["high"])],
            "decision": Verdict(last["decision"]).word(ADMISSION_WORDS)}


def _json_float(x: float) -> float | str:
    x = float(x)
    return x if math.isfinite(x) else str(x)


def _json_value(v: object) -> object:
    return _json_float(v) if isinstance(v, float) else v if isinstance(v, (str, int, bool, type(None))) else str(v)


def statistics_of(log: Log, thresholds: Thresholds, settings: dict[str, tuple[object, str]], loss: str | None = None
                  ) -> tuple[list[Statistic], dict, dict[str, tuple[object, str]]]:
    """The calibrated statistics `log` has in the mode `settings` give (`mismatch.monitor.names.meaning`; one
    reading each: the first of `NAMES` present, the others noted as `also_logged_as`), in the thresholds'
    order; the known names that are not comparable (or whose mode is unknown), with why; the settings read.
    The primary statistic's limit is the trainer's `loss`'s (`Thresholds.for_loss`; None: pooled over losses)."""
    found: dict[str, Statistic] = {}
    others: dict[str, tuple[str, str, pd.Series]] = {}
    read: dict[str, tuple[object, str]] = {}
    for name in NAMES:
        needs = list(name.needs)
        if not all(n in log.values for n in needs):
            continue
        steps = log.logged[needs].all(axis=1).to_numpy()
        if not steps.any():
            continue
        m = meaning(name, settings)
        read.update(m.read)
        if not m.comparable:
            others.update({n: (name.framework, m.why, log.values.loc[log.logged[n].to_numpy(), n]) for n in needs})
            continue
        stat = m.case.statistic
        if stat not in thresholds.limits:
            continue
        if stat in found:
            found[stat].also_logged_as.append(name.logged_as)
            continue
        parts = log.values.loc[steps, needs]
        values = pd.Series([m.case.convert(*row) for row in parts.itertuples(index=False)], index=parts.index,
                           dtype=float)
        windowed = stat in thresholds.window_limits
        limits, brackets = ((thresholds.window_limits, thresholds.window_brackets) if windowed
                            else (thresholds.limits, thresholds.brackets))
        limit, (lo, hi) = limits[stat], brackets.get(stat, [math.nan, math.nan])
        limit_levels = ""
        if stat == thresholds.primary:
            limit, (lo, hi), _, levels = thresholds.for_loss(loss, window=windowed)
            limit_levels = levels if loss is not None else ""
        found[stat] = Statistic(stat, name.logged_as, name.framework, m.why, values, float(limit),
                                (lo, hi), mode=m.case.mode, caveat=m.caveat,
                                window=thresholds.window_steps if windowed else None, limit_levels=limit_levels)
    ordered = [found[name] for name in dict.fromkeys([thresholds.primary, *thresholds.limits]) if name in found]
    return ordered, others, read


def framework_gates(log: Log, settings: dict[str, tuple[object, str]]) -> tuple[list[Statistic], list[str]]:
    """The framework's own limits the log's run applied (`mismatch.monitor.names.GATES`) to what it logged,
    and a note for each whose threshold is off or unknown."""
    gates, notes = [], []
    for gate in GATES:
        if gate.logged_as not in log.values or not log.logged[gate.logged_as].any():
            continue
        key = gate.setting.key
        if key not in settings:
            notes.append(f"{gate.framework}'s own gate {key} on {gate.logged_as}: its threshold is in no config read")
            continue
        threshold, where = settings[key]
        if threshold is None:
            notes.append(f"{gate.framework}'s own gate {key} is off ({where})")
            continue
        try:
            limit = float(threshold)
        except (TypeError, ValueError):
            raise InputError(f"{key} is a number or null, got {threshold!r} ({where})") from None
        values = log.values.loc[log.logged[gate.logged_as].to_numpy(), gate.logged_as]
        gates.append(Statistic(key, gate.logged_as, gate.framework, gate.how, values, limit, (math.nan, math.nan),
                               mode=f"{key} = {limit:g} ({where})"))
    return gates, notes


def run_settings(log: Log, path: str | Path, given: dict[str, object], given_as: str) -> dict[str, tuple[object, str]]:
    """The framework settings of the log's run: the config given, then the config the log carries, then —
    for a log of the toolkit's own statistics — the mode `rollout_stats` writes the frameworks' names in."""
    layers = [(given, given_as)] if given else []
    if log.config:
        layers.append((log.config, f"{path}'s logged config"))
    if any(name in log.values for name in TOOLKIT):
        layers.append((flat_config(ROLLOUT_STATS_CONFIG),
                       "the toolkit's own log: mismatch.metrics.ROLLOUT_STATS_CONFIG"))
    return resolve_settings(layers)


def monitor(path: str | Path, *, thresholds: str | Path | Thresholds | None = None,
            settings: MonitorSettings = MonitorSettings(), run: str | None = None,
            out_dir: str | Path | None = None, framework_config: str | Path | dict | None = None,
            loss: str | None = None) -> MonitorReport:
    """Judge a training log against the calibrated limits.

    Args:
        path: a `trainer_state.json`, TensorBoard events, a JSON-lines metrics log, or a results dataset
            (`mismatch.monitor.logs.read_log`).
        thresholds: a thresholds file or `Thresholds` (default: the shipped, fitted ones).
        settings: `patience` (consecutive logged steps above the limit that make an alarm), `trend_steps`
            and `total_steps` (the trend's fit and horizon).
        run: with a results dataset of several OPD runs, the run id.
        out_dir: also write the plot, the values and the summary there (`write_monitor`); checked
            before the log is read.
        framework_config: the run's framework configuration (a YAML / JSON / TOML file or a mapping,
            `mismatch.monitor.logs.read_config`): the mode its names are read in, before any config the
            log carries. A name whose meaning depends on a setting no config shows is not judged.
        loss: the trainer's loss (`opd`'s names; `full-rkl` for TRL's default, `pg-rkl-is` for the sampled-token
            loss with the sampler's log-probs in the ratio): the primary statistic is judged by that loss's own
            limit where the check uses one (`Thresholds.for_loss`); None: the limit pooled over losses.

    Returns:
        The `MonitorReport` (`written`: the files written).

    Raises:
        InputError: an unreadable log (`read_log`) or config (`read_config`), or a log with no statistic a
            calibrated limit applies to (the known names it has are listed with why they are not comparable).
    """
    if settings.patience < 1:
        raise InputError(f"patience must be ≥ 1, got {settings.patience}")
    if loss is not None:
        from mismatch.opd.losses import get_loss

        get_loss(loss)  # an unknown loss: the registry's one-line InputError, naming the registered ones
    if settings.trend_steps < 5:
        raise InputError(f"trend steps must be ≥ 5 (a line through fewer says nothing), got {settings.trend_steps}")
    if settings.total_steps is not None and settings.total_steps < 1:
        raise InputError(f"total steps must be ≥ 1, got {settings.total_steps}")
    if out_dir is not None:
        check_writable(out_dir, "monitor output", folder=True)
    table_of_thresholds = thresholds if isinstance(thresholds, Thresholds) else load_thresholds(thresholds)
    given = {} if framework_config is None else read_config(framework_config)
    log = read_log(path, run=run)
    given_as = str(framework_config) if isinstance(framework_config, (str, Path)) else "the framework config given"
    resolved = run_settings(log, path, given, given_as)
    found, others, read = statistics_of(log, table_of_thresholds, resolved, loss)
    if not found:
        known = "; ".join(f"{name} ({fw}: {why})" for name, (fw, why, _) in others.items())
        raise InputError(f"{path}: no statistic a calibrated limit applies to"
                         + (f"; known but not comparable: {known}" if known else
                            f" (looked for {', '.join(sorted(comparable_names()))})"))
    gates, gate_notes = framework_gates(log, resolved)
    read.update({g.name: resolved[g.name] for g in gates})
    source = f"{thresholds}" if isinstance(thresholds, (str, Path)) else table_of_thresholds.fitted_on
    gating, steps = found[0], found[0].values.index
    horizon = settings.total_steps if settings.total_steps is not None else int(2 * steps[-1] - steps[0])
    if gating.limit_levels:
        gate_notes.append(f"{gating.name}'s limit for the loss {loss}: fitted on {gating.limit_levels}")
    if gating.window is None:
        gate_notes.append(f"{source} has no window limit for {gating.name}: each logged value is judged against "
                          "its first-step limit")
    report = MonitorReport(str(path), log.format, len(log.values), settings.patience, gating, found[1:], others,
                           source, framework_gates=gates, framework_settings=read, notes=log.notes + gate_notes,
                           trend=fit_trend(gating.values, gating.limit, settings.trend_steps), horizon=horizon)
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
               atomic_write_text(out / "monitor.csv", report.long_table().to_csv(index=False, na_rep="nan")),
               atomic_write_text(out / "monitor.json", json_text(report.summary()) + "\n")]
    return written
