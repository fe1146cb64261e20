"""Admission thresholds fitted from a study's results: which mismatch statistic, measured before any
training, separates rollout configurations OPD tolerated from those it did not.

The statistic of a configuration is what the first OPD step of each of its runs measured on its own
rollout tokens, before any update: the rollout copy is then the perturbed initial student and the
trained policy the initial student itself, so it is a static property of the configuration
(`mismatch_kl`, `mismatch_k3`, … of `mismatch.metrics.sampled_token_metrics`, the functions the
check computes too). Staleness and reuse measure 0 there by construction (no update yet to lag
behind), so they are not fitted: their verdicts are carried over as the study measured them
(`Thresholds.lagged`).

Labels come from the study's tolerance analysis (`mismatch.analysis.tolerance`): the level's interval
verdict over seeds. Only *decided* levels — tolerated or not tolerated — are fitted on; an uncertain
level is kept among the points (`decided` false) but places no limit, since its label would be a
coin flip of the seeds (a threshold fitted on means of undecided levels moves with every reseed). Each
statistic gets a one-sided limit (admit when the statistic ≤ limit) at the geometric midpoint of the
split that best separates the labels (balanced accuracy; ties: the widest gap in log space). With no
not-tolerated point the limit is the largest tolerated value: beyond it nothing was measured.
Leave-one-pair-out validation refits without each pair and predicts its levels, against the
baseline "always admit".
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mismatch.admission.limits import (LAGGED_SOURCES, STATIC_SOURCES, STATISTICS, bracket, confusion, fit_limit,
                                       held_out_predictions)
from mismatch.admission.transfer import WINDOW, drift_table, first_step_statistics, level_points
from mismatch.errors import InputError
from mismatch.files import atomic_write_text
from mismatch.analysis.length import family, firm_verdicts, is_rung, length_tables, setting_value
from mismatch.analysis.tolerance import Analysis, analyse
from mismatch.results import read_results
from mismatch.version import __version__
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance

PRIMARY = "mismatch_kl"
DEFAULT_FILE = Path(__file__).resolve().parent.parent / "data" / "admission_thresholds.json"


@dataclass
class Thresholds:
    """Fitted limits (`limits[statistic]`) and the interval the data pin each to, the points they were fitted on, their leave-one-pair-out
    validation, the lagged sources' measured verdicts, and provenance."""

    primary: str
    limits: dict[str, float]
    brackets: dict[str, list[float]]  # [largest tolerated ≤ limit, smallest not tolerated > limit]: the
    # data pin the limit only to that interval
    points: list[dict]
    validation: list[dict]
    lagged: list[dict]
    provenance: dict = field(default_factory=dict)
    # the window statistics (`mismatch.admission.transfer`: the mean over the WINDOW update steps after the
    # rollout lag is full) fitted on every decided level, lagged sources too: what a lag measured on the
    # user's checkpoint (`mismatch.admission.lagged`) is judged against; `window_brackets` as `brackets`
    window_limits: dict[str, float] = field(default_factory=dict)
    window_brackets: dict[str, list[float]] = field(default_factory=dict)
    window_steps: int = WINDOW
    # the mean response lengths (tokens) of the decided levels the first-step limits rest on, [shortest, longest]:
    # the limits are per token at those lengths (how they scale with length: `length_law`);
    # `window_response_tokens` the same for the window limits' levels (lagged sources too; empty in a file
    # written before it, where the check falls back to `response_tokens`)
    response_tokens: list[float] = field(default_factory=list)
    window_response_tokens: list[float] = field(default_factory=list)
    # per static source, how the primary statistic moved in the study's runs (`transfer.drift_table`: the
    # in-training peak over the first step's value, `levels`, `median`, `largest`) and the `margin` the
    # check lowers the fitted limit by (median / largest): the limit absorbed the median drift, not the worst
    drift: dict[str, dict[str, float]] = field(default_factory=dict)
    # how the tolerated per-token limit scales with response length (`mismatch.analysis.length`: the study's length
    # ladders): `b_low`, `b_high` (the exponents of limit ∝ T^b every ladder's brackets allow, the most cautious
    # ends over ladders; NaN, JSON null: open), `lengths`, `ladders` (family · loss · settings); empty while no ladder bounds
    # the exponent on either side (`LengthLaw.informative`; the check then assumes per sequence)
    length_law: dict = field(default_factory=dict)
    # the same per loss (`opd`'s names), over that loss's ladders alone: what the check scales a trainer's limit
    # by where the study ran a ladder under its loss (`length_law_for`), with `tis_caps` (the TIS caps its ladders
    # ran with, as the settings write them: "off", "2"); empty in a file written before it
    loss_length_laws: dict[str, dict] = field(default_factory=dict)
    # per loss whose ladders ran but bound no exponent, why: "fits no power law" (brackets no power law passes
    # through) or "bounds no exponent" (open on both sides, e.g. tolerated to its top at every length)
    loss_open_ladders: dict[str, str] = field(default_factory=dict)
    # per loss (`opd`'s names), the primary statistic's first-step limit fitted on that loss's decided levels alone,
    # where they lie on both sides of it (`loss_limits_from`): `limit`, `bracket`, `levels`, `not_tolerated`,
    # `response_tokens` and its leave-one-pair-out record (`held_out_levels`, `held_out_right`, `always_admit_right`,
    # and the pooled limit's on the same levels, `pooled_held_out_levels`, `pooled_held_out_right`);
    # the check judges a trainer's loss by its own where that predicts the held-out levels at least as well as the
    # pooled limit (`own_limit`, `for_loss`), else by the pooled limit
    loss_limits: dict[str, dict] = field(default_factory=dict)
    # the same per loss for the primary statistic's window limit, fitted on the loss's decided levels of every
    # source (`window_limits`' levels, split by loss); the check's gate with a teacher for a trainer's loss
    loss_window_limits: dict[str, dict] = field(default_factory=dict)

    def for_loss(self, loss: str | None, *, window: bool = False) -> tuple[float, list[float], list[float], str]:
        """The primary statistic's limit for a trainer's `loss` — the first-step one, or with `window` the
        window one (NaN where the table has none) — the interval the data pin it to, the response lengths it was
        fitted at, and which levels it was fitted on: the loss's own (`loss_limits`, `loss_window_limits`) where
        the study decided levels of it on both sides and, leaving one pair out, it predicts the loss's levels at
        least as well as the limit pooled over losses does; else the pooled one (also for `loss` None)."""
        per_loss = self.loss_window_limits if window else self.loss_limits
        fitted = per_loss.get(loss) if loss is not None else None
        own = self.own_limit(loss, window=window) if fitted is not None else None
        if own is None:
            why = (f" ({loss}'s own limit predicts {fitted['held_out_right']} of its {fitted['held_out_levels']} "
                   f"held-out levels right, the pooled one {fitted['pooled_held_out_right']})" if fitted is not None
                   else f" (no limit of {loss}'s own)" if loss is not None and per_loss else "")
            pooled = "every loss's levels" + why
            if window:
                return (self.window_limits.get(self.primary, math.nan),
                        self.window_brackets.get(self.primary, [math.nan, math.nan]),
                        self.window_response_tokens or self.response_tokens, pooled)
            return (self.limits[self.primary], self.brackets.get(self.primary, [math.nan, math.nan]),
                    self.response_tokens, pooled)
        return own["limit"], own["bracket"], own["response_tokens"], f"{loss}'s levels alone"

    def own_limit(self, loss: str, *, window: bool = False) -> dict | None:
        """`loss`'s own limit (its `loss_limits` / `loss_window_limits` entry) where the check uses it: where,
        leaving one pair out, it predicts the loss's levels at least as well as the pooled limit does (a loss whose
        levels come from one pair has no held-out record of its own to compare: its own limit is used)."""
        own = (self.loss_window_limits if window else self.loss_limits).get(loss)
        compared = own is not None and own["held_out_levels"] == own.get("pooled_held_out_levels")  # the same levels
        if own is None or (compared and own["held_out_right"] < own["pooled_held_out_right"]):
            return None
        return own

    def length_law_for(self, loss: str | None) -> tuple[dict, str]:
        """The length law a trainer's `loss`'s limit is scaled by, and whose ladders it comes from: the loss's own
        (`loss_length_laws`) where a ladder run under it bounds the exponent, else the envelope of every ladder
        (`length_law`, also for `loss` None; empty where no ladder bounds it), saying why the loss has none of
        its own (no ladder ran under it, or its ladders bound no exponent: `loss_open_ladders`)."""
        own = self.loss_length_laws.get(loss) if loss is not None else None
        if own:
            return own, f"{loss}'s ladder{'s' if len(own['ladders']) > 1 else ''}"
        losses = sorted({k for k in self.loss_length_laws if k != loss})
        why = (f"{loss}'s {self.loss_open_ladders[loss]}" if loss in self.loss_open_ladders
               else f"none ran {loss}" if loss else "")
        return self.length_law, ("every ladder" if not losses else
                                 f"the ladders of {', '.join(losses)}" + (f"; {why}" if why else ""))

    @property
    def fitted_on(self) -> str:
        """Where the limits come from, as gates and reports name it: `fitted on RESULTS (mismatch V)`."""
        prov = self.provenance
        return f"fitted on {', '.join(prov.get('results', []))} ({prov.get('fitted_with', '?')})"

    def to_json(self, path: str | Path) -> Path:
        return atomic_write_text(path, json.dumps(_strict(asdict(self)), indent=1, default=_jsonable,
                                                  allow_nan=False) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> Thresholds:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"thresholds file not found: {path}")
        try:
            table = cls(**_unstrict(json.loads(path.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, TypeError) as exc:
            raise InputError(f"{path} is not a thresholds file ({exc})") from None
        if table.primary not in table.limits:
            raise InputError(f"{path}: its primary statistic {table.primary!r} has no limit (limits: "
                             f"{', '.join(table.limits) or 'none'})")
        return table


class NotEnoughDataError(InputError):
    """A study whose judged levels cannot place a limit (all on one side of any limit)."""


def _strict(value):
    """`value` with every NaN float as None: strict JSON (a bracket's missing side is null)."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, (float, np.floating)) and math.isnan(value):
        return None
    return value


def _unstrict(value):
    """`_strict` undone: null back to NaN (the file's only nulls are missing numbers)."""
    if isinstance(value, dict):
        return {k: _unstrict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unstrict(v) for v in value]
    return math.nan if value is None else value


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """The thresholds in `path`, or the ones shipped with the package (fitted on `sweeps/paper.toml`)."""
    return Thresholds.from_json(DEFAULT_FILE if path is None else path)


def labelled_points(rows: pd.DataFrame, runs: pd.DataFrame, levels: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """One row per pair × source × settings × level of the static sources: the mean over seeds of
    each first-step statistic, the level's tolerance numbers and verdict, `decided` (the verdict is
    tolerated or not tolerated) and `tolerated` (the label: the verdict is tolerated; meaningful only
    where decided). `runs` / `levels`: the rows' `run_table` and `level_table` (`mismatch.analysis.tolerance`)."""
    if levels.empty:
        raise InputError("no judged OPD levels in these results: run a study with clean twins first")
    stats = first_step_statistics(rows)
    runs = runs.drop(columns=[c for c in stats.columns if c in runs]).join(stats, on="run_id")
    keys = ["pair", "source", "settings", "level"]
    means = runs[~runs["clean"]].groupby(keys, sort=False)[list(stats.columns)].mean()
    # the level table's mean over the whole run kept apart; its first_mismatch_kl is the points' mismatch_kl
    levels = levels.rename(columns={"mismatch_kl": "run_mismatch_kl"}).drop(columns="first_mismatch_kl", errors="ignore")
    points = levels[levels["source"].isin(STATIC_SOURCES)].join(means, on=keys)
    points = points.assign(level=points["level"].map(str), decided=points["verdict"] != "uncertain",
                           tolerated=points["verdict"] == "tolerated",
                           **{c: points[c].astype(float) for c in points if c.endswith("_df")})  # 2.0 whatever the rows
    return points.reset_index(drop=True)


def validate(points: pd.DataFrame, statistic: str) -> list[dict]:
    """Leave one pair out (`held_out_predictions`): per held-out pair the limit fitted on the other pairs,
    its confusion counts on the held-out pair's levels, its accuracy and that of always admitting."""
    out = []
    for pair, test in held_out_predictions(points, statistic).groupby("held_out", sort=True):
        x, y = test[statistic].to_numpy(dtype=float), test["tolerated"].to_numpy(dtype=bool)
        limit = float(test["limit"].iloc[0])
        conf = confusion(x, y, limit)
        out.append({"statistic": statistic, "held_out": pair, "limit": limit,
                    "levels": len(test), **conf,
                    "accuracy": (conf["admit_tolerated"] + conf["reject_not"]) / max(len(test), 1),
                    "always_admit_accuracy": float(y.mean()) if len(y) else math.nan})
    return out


def loss_limits_from(decided: pd.DataFrame, statistic: str = PRIMARY) -> dict[str, dict]:
    """Per loss, `statistic`'s limit fitted on that loss's `decided` levels alone (`Thresholds.loss_limits`,
    `loss_window_limits`): only for a loss whose levels lie on both sides (tolerated and not), with its bracket,
    the response lengths it rests on and its leave-one-pair-out record on the loss's levels — predicted by the
    loss's own limit fitted on the other pairs (`held_out_right`), by the limit pooled over losses fitted on the
    other pairs (`pooled_held_out_right`), and by always admitting (`always_admit_right`)."""
    out: dict[str, dict] = {}
    if "loss" not in decided or statistic not in decided:
        return out
    finite = decided[np.isfinite(decided[statistic].to_numpy(dtype=float))]
    pooled = _held_out(finite, statistic)
    for loss, levels in finite.groupby("loss", sort=True):
        x, tolerated = levels[statistic].to_numpy(dtype=float), levels["tolerated"].to_numpy(dtype=bool)
        if tolerated.all() or not tolerated.any():
            continue
        limit = fit_limit(x, tolerated)
        held, theirs = _held_out(levels, statistic), pooled[pooled["loss"] == loss]
        out[str(loss)] = {"limit": limit, "bracket": bracket(x, tolerated, limit), "levels": len(levels),
                          "not_tolerated": int((~tolerated).sum()), "response_tokens": _span(levels["response_tokens"]),
                          "held_out_levels": len(held), "held_out_right": int(held["right"].sum()),
                          "pooled_held_out_levels": len(theirs), "pooled_held_out_right": int(theirs["right"].sum()),
                          "always_admit_right": int(held["tolerated"].astype(bool).sum())}
    return out


def _held_out(levels: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """`held_out_predictions` of `levels`; with one pair (no other to fit on) an empty frame with its columns."""
    return held_out_predictions(levels if levels["pair"].nunique() > 1 else levels.iloc[:0], statistic)


def lagged_verdicts(levels: pd.DataFrame) -> list[dict]:
    """The study's measured verdicts of staleness and reuse levels (what the check carries over)."""
    return _records(levels[levels["source"].isin(LAGGED_SOURCES)])


def _records(frame: pd.DataFrame) -> list[dict]:
    """A frame's rows as plain-Python dicts (numpy scalars unwrapped), for JSON."""
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in frame.to_dict("records")]


def fit_thresholds(results: str | Path | list[str | Path], *, tolerance: Tolerance = DEFAULT_TOLERANCE) -> Thresholds:
    """Fit admission limits from a results dataset (a study with clean twins; `mismatch sweep`).

    Returns:
        `Thresholds`: a limit per first-step statistic (`STATISTICS`, nats or shares as defined in
        `mismatch.metrics.sampled_token_metrics`), the labelled points, leave-one-pair-out validation
        of every statistic, the staleness / reuse verdicts, and provenance (results, runs, version).
    """
    paths = [results] if isinstance(results, (str, Path)) else list(results)
    rows = pd.concat([read_results(p) for p in paths], ignore_index=True)
    return thresholds_from_rows(rows, sources=[str(p) for p in paths], tolerance=tolerance)


def thresholds_from_rows(rows: pd.DataFrame, *, sources: list[str], tolerance: Tolerance = DEFAULT_TOLERANCE,
                         analysis: Analysis | None = None) -> Thresholds:
    """`fit_thresholds` on results rows already read (`sources` names them in the provenance);
    `analysis`: their `analyse` when the caller has it (`tolerance` is used only without one)."""
    rows = rows[rows["kind"] == "opd"].dropna(axis=1, how="all")
    if rows.empty:
        raise InputError(f"no OPD runs in {', '.join(sources)}")
    analysis = analysis if analysis is not None else analyse(rows, tolerance)
    runs, levels, tolerance = analysis.runs, analysis.levels, analysis.tolerance
    points = labelled_points(rows, runs, levels, tolerance=tolerance)
    points = points[~is_rung(points["settings"])]  # a length ladder's rungs give the length law, not the limits
    decided = points[points["decided"]]
    labels = decided["tolerated"].astype(bool)
    undecided = f" ({len(points) - len(decided)} undecided levels not fitted)" if len(decided) < len(points) else ""
    if labels.all() or not labels.any():
        state = "none is decided" if decided.empty else (
            f"all {len(decided)} decided levels are {'tolerated' if labels.all() else 'not tolerated'}")
        raise NotEnoughDataError(f"not enough data to fit a limit: {state}{undecided}, and a limit needs decided "
                                 "levels on both sides of it (add levels that break, e.g. a weight-noise ladder, "
                                 "or seeds: mismatch sweep --decide)")
    stats = [s for s in STATISTICS if s in points and points[s].notna().any()]
    if PRIMARY not in stats:
        raise InputError("these results hold no first-step mismatch statistics (OPD runs record them per step)")
    limits = {s: fit_limit(decided[s].to_numpy(), decided["tolerated"].to_numpy()) for s in stats}
    brackets = {s: bracket(decided[s].to_numpy(), decided["tolerated"].to_numpy(), limits[s]) for s in stats}
    validation = [v for s in stats for v in validate(decided, s)]
    every = level_points(rows, runs, levels)  # all sources, with the window statistics
    every = every[~is_rung(every["settings"])]
    drift = {r["source"]: {"levels": int(r["peak_over_first_n"]), "median": r["peak_over_first_median"],
                           "largest": r["peak_over_first_max"], "margin": r["margin"]}
             for r in drift_table(every).to_dict("records") if r["source"] in STATIC_SOURCES}
    every = every[every["decided"]]
    window = {s: fit_limit(every[f"window:{s}"].to_numpy(), every["tolerated"].to_numpy()) for s in stats
              if f"window:{s}" in every and every[f"window:{s}"].notna().any()}
    window_brackets = {s: bracket(every[f"window:{s}"].to_numpy(), every["tolerated"].to_numpy(), v)
                       for s, v in window.items()}
    # the law a limit is carried to other lengths by rests on the firm verdicts: a marginal one (its interval clears
    # 1.1 by less than the evaluation's Monte-Carlo error) bounds no exponent here (reports/length_law.md gives both)
    ladders = length_tables(firm_verdicts(levels), family)[1]
    laws = [(key, law) for key, law in ladders if law.informative]  # an open one: no law
    loss_length = {loss: _envelope([(key, law) for key, law in laws if key[1] == loss])  # key: family, loss, settings
                   for loss in sorted({key[1] for key, _ in laws})}
    open_ladders = {loss: "ladder fits no power law" if any(not law.consistent for key, law in ladders if key[1] == loss)
                    else "ladder bounds no exponent" for loss in sorted({key[1] for key, _ in ladders} - set(loss_length))}
    opd_ids = sorted(rows["run_id"].unique())
    provenance = {"results": sources, "opd_runs": len(opd_ids),
                  "opd_run_ids_sha": _digest(opd_ids), "kl_tol": tolerance.kl_tol, "acc_tol": tolerance.acc_tol,
                  "fitted_with": f"mismatch {__version__}",
                  "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "label": (f"the level's verdict over seeds (the sequential design's intervals of Δ accuracy against −{100 * tolerance.acc_tol:g} "
                            f"points and of the KL ratio against {1 + tolerance.kl_tol:g}); fitted on decided levels "
                            f"only: {len(decided)} of {len(points)}")}
    return Thresholds(primary=PRIMARY, limits=limits, brackets=brackets, points=_records(points),
                      validation=validation, lagged=lagged_verdicts(levels), provenance=provenance,
                      window_limits=window, window_brackets=window_brackets, drift=drift,
                      response_tokens=_span(decided["response_tokens"]),
                      window_response_tokens=_span(every.loc[every[f"window:{PRIMARY}"].notna(), "response_tokens"]
                                                   if f"window:{PRIMARY}" in every else every["response_tokens"][:0]),
                      length_law=_envelope(laws), loss_length_laws=loss_length,
                      loss_open_ladders=open_ladders, loss_limits=loss_limits_from(decided),
                      loss_window_limits=loss_limits_from(every, f"window:{PRIMARY}") if f"window:{PRIMARY}" in every
                      else {})


def _envelope(laws: list[tuple[tuple, object]]) -> dict:
    """The length law of several ladders' (`(key, LengthLaw)`): the most cautious exponent on each side — the
    lowest b for longer responses, the highest for shorter — the lengths they ran at and the ladders' names
    (family · loss · settings) and the TIS caps they ran with (`tis_caps`: "off", "2", …; none where the
    dataset never varied the cap); empty without a ladder."""
    if not laws:
        return {}
    return {"b_low": _finite(min(law.b_low for _, law in laws)), "b_high": _finite(max(law.b_high for _, law in laws)),
            "lengths": sorted({t for _, law in laws for t in law.lengths}),
            "ladders": [" · ".join(map(str, key)) for key, _ in laws],
            "tis_caps": sorted({cap for key, _ in laws if (cap := setting_value(key[2], "tis_cap")) is not None})}


def _span(tokens: pd.Series) -> list[float]:
    """[shortest, longest] mean response length of the levels a limit rests on; empty without any."""
    tokens = tokens.dropna()
    return [float(tokens.min()), float(tokens.max())] if len(tokens) else []


def _finite(x: float) -> float:
    """A law's exponent: NaN where the brackets leave it open (±∞) or undetermined — written `null` to JSON and
    read back as NaN (`_strict` / `_unstrict`), so a fit and its shipped file compare equal."""
    return float(x) if math.isfinite(x) else math.nan


def _digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
