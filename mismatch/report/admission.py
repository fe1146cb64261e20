"""Admission-check validation from a study's results alone: the fitted limits, the points they rest on,
and leave-one-pair-out predictions against "always admit" (`mismatch.admission.thresholds`); which
candidate statistic predicts tolerance across sources (`mismatch.admission.transfer`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from mismatch.admission.limits import held_out_predictions
from mismatch.admission.thresholds import NotEnoughDataError, Thresholds, thresholds_from_rows
from mismatch.errors import InputError
from mismatch.admission.transfer import level_points, transfer_markdown, transfer_table
from mismatch.analysis.tolerance import Analysis, analyse
from mismatch.report.common import plus_minus
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance


def admission_markdown(t: Thresholds) -> str:
    """The validation as Markdown: limits, points, leave-one-pair-out confusion per statistic."""
    prov = t.provenance
    lines = ["# Admission check: thresholds and their validation", "",
             "Statistic of a rollout configuration: what the first step of each of its OPD runs measured on its own "
             "rollout tokens, before any update (the perturbed initial student against the initial student; "
             "mean over seeds). Label: " + prov.get("label", "") + ". A limit sits at the geometric midpoint of the "
             "split that best separates the labels; *pinned to* is the interval any limit separating them as well "
             "could take: the check's gate without a teacher. Staleness and reuse measure 0 before training and are "
             "not fitted here (without a teacher the check carries their study verdicts over). With a teacher the "
             "check measures any pipeline — a format, a lag, or both — by the window statistic against the window "
             "limit (admission_transfer.md), and that decides.", "",
             f"Fitted on {', '.join(prov.get('results', []))}: {prov.get('opd_runs', '?')} OPD runs, "
             f"{len(t.points)} levels, {sum(p.get('decided', True) for p in t.points)} decided "
             f"({sum(p.get('decided', True) and not p['tolerated'] for p in t.points)} not tolerated; undecided levels "
             "are listed but place no limit), "
             f"{prov.get('fitted_with', '')}.", "",
             "## Limits (admit when the statistic ≤ limit)", "",
             "| statistic | limit | pinned to | width |", "|---|---|---|---|"]
    for s, limit in t.limits.items():
        lo, hi = t.brackets.get(s, [math.nan, math.nan])
        width = f"×{hi / lo:.2g}" if lo > 0 and hi == hi else "—"  # how far apart the decided levels around it lie
        lines.append(f"| {s}{' (default gate)' if s == t.primary else ''} | {limit:.3g} | [{lo:.3g}, {hi:.3g}] | {width} |")
    lines += _loss_lines(t)
    if t.window_limits:
        lines += ["", "## Window limits (with a teacher: the check's deciding gate, `mismatch monitor`'s, the trainer's "
                  "after its first batch)", "",
                  f"Each statistic's mean over the {t.window_steps} update steps after the rollout lag is full, fitted "
                  "on the decided levels of every source, lags included, outside the length ladder's rungs "
                  "(admission_transfer.md compares them across sources).", "",
                  "| statistic | window limit | pinned to |", "|---|---|---|"]
        for s, limit in t.window_limits.items():
            lo, hi = t.window_brackets.get(s, [math.nan, math.nan])
            lines.append(f"| {s}{' (deciding gate)' if s == t.primary else ''} | {limit:.3g} | [{lo:.3g}, {hi:.3g}] |")
    lines += ["", "## Levels", "",
              f"| pair | source | level | seeds | {t.primary} | Δ accuracy (pts) | KL ratio | verdict | label |",
              "|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(t.points, key=lambda p: (p["pair"], p.get(t.primary, math.nan))):
        lines.append(f"| {p['pair']} | {p['source']} | {p['level']} | {p['seeds']} | {p.get(t.primary, math.nan):.3g} | "
                     f"{plus_minus(p['acc_delta'], p['acc_delta_hw'], 100)} | "
                     f"{plus_minus(p['kl_ratio'], p['kl_ratio_hw'], 1, '{:.3f}')} | "
                     f"{p['verdict']} | {_label(p)} |")
    lines += ["", "## Leave one pair out", "",
              "Each pair's levels predicted by the limit fitted on the other pairs.", "",
              "| statistic | held-out pair | limit without it | levels | admit ∧ tolerated | admit ∧ not | "
              "reject ∧ tolerated | reject ∧ not | accuracy | always admit |", "|---|---|---|---|---|---|---|---|---|---|"]
    for v in t.validation:
        lines.append(f"| {v['statistic']} | {v['held_out']} | {v['limit']:.3g} | {v['levels']} | {v['admit_tolerated']} | "
                     f"{v['admit_not']} | {v['reject_tolerated']} | {v['reject_not']} | {v['accuracy']:.2f} | "
                     f"{v['always_admit_accuracy']:.2f} |")
    primary = [v for v in t.validation if v["statistic"] == t.primary]
    right = sum(v["admit_tolerated"] + v["reject_not"] for v in primary)
    n = sum(v["levels"] for v in primary)
    always = sum(round(v["always_admit_accuracy"] * v["levels"]) for v in primary)
    lines += ["", f"With {t.primary}: {right} of {n} held-out levels predicted right; always admitting gets {always} of "
              f"{n}. " + ("No better than always admitting." if right <= always else
                          f"The check differs from always admitting on {n - always} not-tolerated level(s).")]
    lines += _held_out_by(t)
    lines += _held_out_on_kl(t)
    lines += _drift_lines(t)
    return "\n".join(lines) + "\n"


def _loss_lines(t: Thresholds) -> list[str]:
    """The primary statistic's limits per loss — first-step (`Thresholds.loss_limits`) and window
    (`loss_window_limits`) — each with its leave-one-pair-out record within the loss beside the pooled limit's."""
    tables = [(False, f"`{t.primary}`, first step", t.loss_limits, "the pooled limit above",
               "each loss's decided levels"),
              (True, f"`window:{t.primary}`", t.loss_window_limits, "the pooled window limit (admission_transfer.md)",
               "each loss's decided levels of every source (lags included)")]
    lines: list[str] = []
    for window, name, per_loss, pooled, levels in tables:
        if not per_loss:
            continue
        lines += ["", f"## {name}: limit per loss (`mismatch check --loss`)", "",
                  f"Fitted on {levels} alone, as {pooled}. *Held out*: each pair's levels of the loss predicted by the "
                  "limit fitted on the other pairs' levels of it; *pooled, held out*: the same levels predicted by the "
                  "pooled limit fitted on the other pairs' levels of every loss. The check judges a loss by its own "
                  "limit where that record is at least the pooled one's, else by the pooled limit (*used*), as it "
                  "does a loss whose decided levels all fall on one side.", "",
                  "| loss | levels | not tolerated | limit | pinned to | response tokens | held out: right | "
                  "pooled, held out: right | always admit | used |", "|---|---|---|---|---|---|---|---|---|---|"]
        for loss, v in sorted(per_loss.items()):
            lo, hi = v["bracket"]
            span = "–".join(f"{x:.0f}" for x in v["response_tokens"]) or "—"
            lines.append(f"| {loss} | {v['levels']} | {v['not_tolerated']} | {v['limit']:.3g} | [{lo:.3g}, {hi:.3g}] | "
                         f"{span} | {v['held_out_right']} of {v['held_out_levels']} | "
                         f"{v['pooled_held_out_right']} of {v['pooled_held_out_levels']} | {v['always_admit_right']} | "
                         f"{'own' if t.own_limit(loss, window=window) else 'pooled'} |")
    return lines


LENGTH_BUCKETS = (16, 64, 256, 1024)  # response tokens: the bucket edges the leave-one-pair-out table uses


def _length_bucket(tokens: float) -> str:
    edges = [0, *LENGTH_BUCKETS, math.inf]
    for lo, hi in zip(edges, edges[1:]):
        if lo <= tokens < hi:
            return f"{lo}–{hi}" if hi != math.inf else f"≥ {lo}"
    return "unknown"


def _held_out_by(t: Thresholds) -> list[str]:
    """The primary statistic's leave-one-pair-out predictions per source and per response length, against
    always admitting and always rejecting the same levels."""
    points = pd.DataFrame(t.points)
    if points.empty or t.primary not in points:
        return []
    decided = points[points["decided"].astype(bool)]
    if decided["pair"].nunique() < 2:
        return []
    return ["", f"### {t.primary} leaving one pair out, per source and per response length", "",
            f"Decided levels only; pairs: {', '.join(sorted(decided['pair'].unique()))}.", "",
            *_breakdown(decided, t.primary, ("source", "length"))]


def _breakdown(decided: pd.DataFrame, statistic: str, by: tuple[str, ...]) -> list[str]:
    """Leave one pair out on `decided` levels (`held_out_predictions`, levels where `statistic` exists), as a
    table of levels right per group of each of `by` (`pair`, `source`, `length`: the response-length bucket),
    beside always admitting and always rejecting the same levels."""
    decided = decided[np.isfinite(decided[statistic].to_numpy(dtype=float))]
    pred = held_out_predictions(decided, statistic)
    pred = pred.assign(length=pred["response_tokens"].map(_length_bucket))
    lines = ["| by | group | levels | right | always admit | always reject |", "|---|---|---|---|---|---|"]
    for column in by:
        for group, g in pred.groupby(column, sort=True):
            tol = int(g["tolerated"].astype(bool).sum())
            lines.append(f"| {column} | {group} | {len(g)} | {int(g['right'].sum())} | {tol} | {len(g) - tol} |")
    return lines


KL_LABELS = ("tolerated", "not tolerated")  # a level's verdict on the KL ratio alone, where it is decided


def _held_out_on_kl(t: Thresholds) -> list[str]:
    """Leave one pair out again, every level labelled by its KL-ratio verdict alone (`kl_verdict`): the
    criterion every pair is judged on — a pair without a task accuracy has no other — so a pair's levels
    are not predicted from labels set by a criterion it lacks."""
    points = pd.DataFrame(t.points)
    if points.empty or t.primary not in points or "kl_verdict" not in points:
        return []
    kl = points[points["kl_verdict"].isin(KL_LABELS)]
    kl = kl.assign(tolerated=kl["kl_verdict"] == "tolerated")
    if kl["pair"].nunique() < 2:
        return []
    held = held_out_predictions(kl, t.primary)
    per_pair = held.groupby("held_out", sort=True).agg(limit=("limit", "first"), levels=("right", "size"),
                                                        right=("right", "sum"), tolerated=("tolerated", "sum"))
    lines = ["", f"### {t.primary} leaving one pair out, labelled by the KL ratio alone", "",
             "A level's label above is its verdict on both criteria where its pair has a task accuracy (the synthetic "
             "pairs), on the KL ratio alone where it has none. Here every level is labelled by its KL-ratio verdict "
             "alone (the criterion every pair has; levels it decides), each pair's levels predicted by the limit "
             "fitted on the other pairs' so labelled.", "",
             "| held-out pair | limit without it | levels | right | always admit | always reject |",
             "|---|---|---|---|---|---|"]
    for v in per_pair.itertuples():  # keeps each column's dtype (counts stay integers)
        lines.append(f"| {v.Index} | {v.limit:.3g} | {v.levels} | {v.right} | {v.tolerated} | "
                     f"{v.levels - v.tolerated} |")
    right, tol, n = int(held["right"].sum()), int(held["tolerated"].sum()), len(held)
    lines += ["", f"On the KL ratio alone: {right} of {n} held-out levels predicted right; always admitting "
              f"gets {tol}, always rejecting {n - tol}." + (" No better than always admitting." if right <= tol else "")]
    return lines


def _drift_lines(t: Thresholds) -> list[str]:
    """The drift margin per static source, the limit it lowers the fitted one to, and the decided levels
    of that source it would move from admit to uncertain (their first-step value between the two)."""
    if not t.drift:
        return []
    limit = t.limits[t.primary]
    lines = ["", "## Drift margin", "",
             f"Per static source, the in-training peak of {t.primary} over its first-step value across the study's "
             "levels outside the length ladder's rungs (admission_transfer.md's drift table counts them too): the "
             "fitted limit absorbed the median drift; a run drifting as the "
             "largest did meets it from limit × margin, where the check answers uncertain. *Moved* counts the "
             "decided levels of the source whose first-step value lies between the two.", "",
             "| source | levels | median | largest | margin | lowered limit | moved: tolerated | moved: not |",
             "|---|---|---|---|---|---|---|---|"]
    for source, d in sorted(t.drift.items()):
        low = limit * d["margin"]
        moved = [p for p in t.points if p["source"] == source and p.get("decided", True)
                 and low < p.get(t.primary, math.nan) <= limit]
        tol = sum(bool(p["tolerated"]) for p in moved)
        lines.append(f"| {source} | {d['levels']} | {d['median']:.3g} | {d['largest']:.3g} | {d['margin']:.3g} | "
                     f"{low:.3g} | {tol} | {len(moved) - tol} |")
    return lines + _lowered_per_loss(t)


def _lowered_per_loss(t: Thresholds) -> list[str]:
    """The first-step limit `mismatch check` judges each loss's trainer by (`Thresholds.for_loss`: the loss's
    own, or the pooled one) and that limit lowered by each static source's drift margin, as the check lowers it."""
    if not t.loss_limits:
        return []
    sources = sorted(t.drift)
    lines = ["", "The first-step limit the check judges each loss's trainer by (its own, or the pooled one where its "
             "own does not predict its held-out levels as well), lowered by each source's margin as the check "
             "lowers it:", "",
             "| loss | limit | fitted on | " + " | ".join(f"lowered: {s}" for s in sources) + " |",
             "|---|---|---|" + "---|" * len(sources)]
    for loss in sorted(t.loss_limits):
        limit = t.for_loss(loss)[0]
        fitted_on = "its own levels" if t.own_limit(loss) is not None else "every loss's levels"
        lines.append(f"| {loss} | {limit:.4g} | {fitted_on} | "
                     + " | ".join(f"{limit * t.drift[s]['margin']:.4g}" for s in sources) + " |")
    return lines


def _label(point: dict) -> str:
    if not point.get("decided", True):
        return "not fitted (undecided)"
    return "tolerated" if point["tolerated"] else "not tolerated"


def write_admission_report(rows: pd.DataFrame, out_dir: str | Path, *, sources: list[str],
                           tolerance: Tolerance = DEFAULT_TOLERANCE, analysis: Analysis | None = None
                           ) -> list[Path]:
    """Write `admission.md`, `admission_points.csv` and `admission_validation.csv` when the rows hold
    judged OPD levels of static sources with first-step statistics, and `admission_transfer.md` /
    `admission_transfer.csv` (each candidate statistic's record across sources and pairs) when they hold
    decided levels of both static and lagged sources; nothing otherwise. `analysis`: the rows' `analyse`
    when the caller has it (`tolerance` is used only without one)."""
    out_dir = Path(out_dir)
    opd = rows[rows["kind"] == "opd"].dropna(axis=1, how="all") if "kind" in rows else rows.iloc[:0]
    if opd.empty:
        return []
    analysis = analysis if analysis is not None else analyse(opd, tolerance)
    written = _transfer(opd, analysis, out_dir)
    try:
        t = thresholds_from_rows(rows, sources=sources, tolerance=tolerance, analysis=analysis)
    except NotEnoughDataError as exc:  # judged levels, but all on one side: say so, fit nothing
        (out_dir / "admission.md").write_text(f"# Admission check\n\nNo limit fitted: {exc}.\n", encoding="utf-8")
        return [out_dir / "admission.md", *written]
    except InputError:
        return written
    files = [out_dir / "admission.md", out_dir / "admission_points.csv", out_dir / "admission_validation.csv"]
    files[0].write_text(admission_markdown(t), encoding="utf-8")
    pd.DataFrame(t.points).to_csv(files[1], index=False)
    pd.DataFrame(t.validation).to_csv(files[2], index=False)
    return files + written


def _transfer(rows: pd.DataFrame, analysis: Analysis, out_dir: Path) -> list[Path]:
    """`admission_transfer.md` / `.csv` when both groups of sources have tolerated and not-tolerated
    decided levels between them (else no limit can be fitted on one group and scored on the other)."""
    if analysis.levels.empty:
        return []
    points = level_points(rows, analysis.runs, analysis.levels)
    decided = points[points["decided"]]
    if decided["group"].nunique() < 2 or decided["tolerated"].nunique() < 2:
        return []
    table = transfer_table(points)
    files = [out_dir / "admission_transfer.md", out_dir / "admission_transfer.csv"]
    gate = "window:mismatch_kl"  # what `check --teacher` measures and decides by (`mismatch.admission.checker`)
    lines = [] if gate not in points or decided["pair"].nunique() < 2 else [
        "", f"## The check's gate with a teacher: `{gate}` leaving one pair out", "",
        "Each pair's decided levels predicted by the limit fitted on the other pairs' (the thresholds' window limit "
        "leaves the length ladder's rungs out; here, as in the table above, every decided level counts), per "
        "held-out pair, source and response length (tokens), beside always admitting and always rejecting.", "",
        *_breakdown(decided, gate, ("pair", "source", "length"))]
    files[0].write_text(transfer_markdown(points, table) + "\n".join(lines) + ("\n" if lines else ""),
                        encoding="utf-8")
    table.to_csv(files[1], index=False)
    return files
