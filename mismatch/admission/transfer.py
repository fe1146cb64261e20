"""Which mismatch statistic predicts tolerance across sources (issue 34 §1)?

The fitted limits (`mismatch.admission.thresholds`) rest on the first OPD step's statistics, which a stale
or reused rollout copy cannot have: it equals the student until the first update, so it measures 0. The
candidates here are measured where every source has its mismatch:

* `first:S` — statistic S (`thresholds.STATISTICS`) at step 1, before any update: what the check measures
  for a format today (0 for staleness and reuse by construction);
* `window:S` — the mean of S over the `WINDOW` update steps after the rollout lag is full (steps K+1 … K+W
  for `stale:K`, 1 … W otherwise): the same sampled-token estimator on the run's own rollouts, once a
  stale copy is as old as it will be;
* `window:seq_kl` — `window:mismatch_kl` × the level's mean response length: the per-sequence mismatch
  (the bias bound of token-level importance sampling grows with it);
* `copy:kl_fwd_mean`, `copy:tv_mean` — the rollout copy probed against the student over the full vocabulary
  at the run's first evaluation after step 0 (`mismatch.opd.evaluate.probe_copy`; none for reuse, whose
  copy is not kept);
* `gap:heldout_rkl` — the teacher's side: how much worse the rollout copy is than the student at the task,
  in held-out reverse KL to the teacher. A static copy is measured at step 0 (`copy_heldout_rkl` minus the
  student's `heldout_rkl`, `mismatch.opd.evaluate.copy_heldout_rkl`). A lagged copy is the student some
  updates back, so its gap is the progress those updates make: the lag (K for `stale:K`, the mean batch
  age (R−1)/2 for `reuse:R`) times the held-out KL decrease per step of the level's clean twins between
  step 0 and their first evaluation (a linear reading of their curve: what the lag would cost where
  training goes as it should; the lagged run's own curve would put its outcome into its statistic).

Each candidate is scored by how well a one-sided limit fitted on some levels (`thresholds.fit_limit`) predicts
decided levels it never saw: fitted on the static sources (formats, noise, engines) and applied to the lagged
ones (staleness, reuse), the reverse, and leave one pair out — each against always admitting and always
rejecting. Only decided levels count (`thresholds.labelled_points`' rule).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mismatch.admission.limits import LAGGED_SOURCES, STATIC_SOURCES, STATISTICS, fit_limit, held_out_predictions
from mismatch.rollout.spec import RolloutSpec

WINDOW = 10  # update steps after the lag is full that the window statistics average
COPY_STATISTICS = ("copy_kl_fwd_mean", "copy_tv_mean")
GAP = "gap:heldout_rkl"
LEVEL_KEYS = ["pair", "source", "settings", "level"]


def window_steps(staleness: int, window: int = WINDOW) -> tuple[int, int]:
    """The first and last update step (1-based, inclusive) the window statistics average: the `window`
    steps after a lag of `staleness` steps is full (a `stale:K` copy serves the initial weights until step
    K+1). Reuse has no lag of its own here: its window starts at step 1, fresh and reused batches alike."""
    return staleness + 1, staleness + window


def candidates() -> list[str]:
    """The candidate statistics, in the order the tables list them."""
    return [*(f"first:{s}" for s in STATISTICS), *(f"window:{s}" for s in STATISTICS), "window:seq_kl",
            *(f"copy:{s.removeprefix('copy_')}" for s in COPY_STATISTICS), GAP]


def first_step_statistics(rows: pd.DataFrame) -> pd.DataFrame:
    """Per OPD run (`run_id` index): each `STATISTICS` metric at step 1, before any update (what the check
    measures; the level table's `first_mismatch_kl` is this `mismatch_kl`'s mean over a level's seeds)."""
    first = rows[(rows["kind"] == "opd") & (rows["level"] == "step") & (rows["step"] == 1)
                 & rows["metric"].isin(STATISTICS)]
    return first.pivot_table(index="run_id", columns="metric", values="value", aggfunc="last")


def run_statistics(rows: pd.DataFrame, *, window: int = WINDOW) -> pd.DataFrame:
    """Per OPD run (`run_id` index) the candidates measurable on its own rows (all but `window:seq_kl`,
    which needs the level's response length): `first:S`, `window:S`, `copy:…` and `gap:heldout_rkl`; and,
    for the drift table, `end:mismatch_kl` (its mean over the run's last `window` steps)."""
    opd = rows[(rows["kind"] == "opd") & (rows["level"] == "step")]
    steps = opd[opd["metric"].isin([*STATISTICS, *COPY_STATISTICS])]
    wide = steps.pivot_table(index=["run_id", "step"], columns="metric", values="value", aggfunc="last").reset_index()
    configs = opd.groupby("run_id")[["rollout", "staleness"]].first()
    specs = {r: RolloutSpec.parse(str(c["rollout"]), 0 if pd.isna(c["staleness"]) else int(c["staleness"]))
             for r, c in configs.iterrows()}  # `stale:K` as a spec or as the staleness field
    lag = {r: spec.staleness for r, spec in specs.items()}
    wide["lag"] = wide["run_id"].map(lag).astype(int)
    out = pd.DataFrame(index=pd.Index(sorted(wide["run_id"].unique()), name="run_id"))
    stats = [s for s in STATISTICS if s in wide]
    first = first_step_statistics(rows).reindex(index=out.index, columns=stats)
    bounds = wide["lag"].map(lambda k: window_steps(k, window))
    in_window = wide[(wide["step"] >= bounds.str[0]) & (wide["step"] <= bounds.str[1])]
    means = in_window.groupby("run_id")[stats].mean()
    last = wide.groupby("run_id")["step"].transform("max")
    ends = wide[(wide["step"] > 0) & (wide["step"] > last - window)].groupby("run_id")[stats].mean()
    for s in stats:
        out[f"first:{s}"] = first[s]
        out[f"window:{s}"] = means[s].reindex(out.index)
    if "mismatch_kl" in ends:  # drift: where the statistic ends, not a candidate
        out["end:mismatch_kl"] = ends["mismatch_kl"].reindex(out.index)
    evaluated = wide[wide["step"] > 0]
    for s in COPY_STATISTICS:
        if s in evaluated:
            seen = evaluated.dropna(subset=[s]).sort_values("step").groupby("run_id")[s].first()
            out[f"copy:{s.removeprefix('copy_')}"] = seen.reindex(out.index)
    gap, progress = teacher_gap(opd)
    if gap.notna().any():
        out[GAP] = gap.reindex(out.index)
    out["progress:heldout_rkl"] = progress.reindex(out.index)  # for the lagged levels' gap (`level_points`)
    return out


def lag_steps(spec: RolloutSpec) -> float:
    """How many updates a lagged copy is behind the student on average: K for `stale:K`, (R−1)/2 for
    `reuse:R` (a batch trained on R times is 0, 1, …, R−1 updates old), their sum when both."""
    return spec.staleness + (spec.reuse - 1) / 2


def teacher_gap(opd: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per run (`run_id` index): the static copy's step-0 gap `copy_heldout_rkl − heldout_rkl` (NaN where
    not measured) and the run's held-out KL decrease per step from step 0 to its first evaluation (what a
    clean run's update is worth at the task: the lagged levels' gap is their lag times their twins')."""
    held = opd[opd["metric"].isin(["heldout_rkl", "copy_heldout_rkl"])].pivot_table(
        index=["run_id", "step"], columns="metric", values="value", aggfunc="last")
    gap, progress = {}, {}
    for run_id, curve in held.groupby(level="run_id"):
        curve = curve.droplevel("run_id").sort_index()
        rkl = curve["heldout_rkl"].dropna() if "heldout_rkl" in curve else pd.Series(dtype=float)
        if 0 in rkl.index and (rkl.index > 0).any():
            first = int(rkl.index[rkl.index > 0][0])
            progress[run_id] = (rkl[0] - rkl[first]) / first
        if "copy_heldout_rkl" in curve and 0 in rkl.index and pd.notna(curve.loc[0, "copy_heldout_rkl"]):
            gap[run_id] = curve.loc[0, "copy_heldout_rkl"] - rkl[0]
    return pd.Series(gap, dtype=float), pd.Series(progress, dtype=float)


def level_points(rows: pd.DataFrame, runs: pd.DataFrame, levels: pd.DataFrame, *, window: int = WINDOW) -> pd.DataFrame:
    """One row per level of a static or lagged source: its verdict, `decided`, `tolerated`, `group`
    (`static` / `lagged`), `response_tokens` and the mean over its seeds of every candidate.
    `runs` / `levels`: the rows' `run_table` / `level_table` (`mismatch.analysis.tolerance.analyse`)."""
    stats = run_statistics(rows, window=window)
    mine = runs[~runs["clean"] & runs["source"].isin([*STATIC_SOURCES, *LAGGED_SOURCES])]
    mine = mine[LEVEL_KEYS + ["run_id"]].join(stats, on="run_id")
    lagged = mine["source"].isin(LAGGED_SOURCES)
    if lagged.any():  # a lag's gap: its worth of the twins' progress (`teacher_gap`)
        twins = runs[runs["clean"]][["pair", "settings", "run_id"]].join(stats["progress:heldout_rkl"], on="run_id")
        per_step = twins.groupby(["pair", "settings"])["progress:heldout_rkl"].mean()
        mine.loc[lagged, GAP] = [lag_steps(RolloutSpec.parse(f"{r.source}:{r.level}"))
                                 * per_step.get((r.pair, r.settings), math.nan)
                                 for r in mine[lagged].itertuples(index=False)]
    columns = [c for c in stats.columns if c != "progress:heldout_rkl"]
    columns += [GAP] if GAP in mine and GAP not in columns else []
    means = mine.groupby(LEVEL_KEYS, sort=False)[columns].mean()
    points = levels[levels["source"].isin([*STATIC_SOURCES, *LAGGED_SOURCES])]
    points = points[LEVEL_KEYS + ["loss", "verdict", "response_tokens"]].join(means, on=LEVEL_KEYS)
    if "window:mismatch_kl" in points:
        points["window:seq_kl"] = points["window:mismatch_kl"] * points["response_tokens"]
    return points.assign(level=points["level"].map(str), decided=points["verdict"] != "uncertain",
                         tolerated=points["verdict"] == "tolerated",
                         group=np.where(points["source"].isin(LAGGED_SOURCES), "lagged", "static")).reset_index(drop=True)


def _record(admit: np.ndarray, tolerated: np.ndarray) -> dict[str, int]:
    """How admitting `admit` scores against the labels, beside always admitting and always rejecting."""
    return {"levels": len(admit), "right": int((admit == tolerated).sum()),
            "wrong_admits": int((admit & ~tolerated).sum()), "wrong_rejects": int((~admit & tolerated).sum()),
            "always_admit": int(tolerated.sum()), "always_reject": int((~tolerated).sum())}


def _predict(train: pd.DataFrame, test: pd.DataFrame, statistic: str) -> dict[str, float]:
    """The limit fitted on `train`'s decided levels and its record on `test`'s (levels where the
    statistic exists)."""
    limit = fit_limit(train[statistic].to_numpy(dtype=float), train["tolerated"].to_numpy(dtype=bool))
    test = test[np.isfinite(test[statistic].to_numpy(dtype=float))]
    x, y = test[statistic].to_numpy(dtype=float), test["tolerated"].to_numpy(dtype=bool)
    return {"limit": limit, **_record(x <= limit, y)}


def transfer_table(points: pd.DataFrame, statistics: list[str] | None = None) -> pd.DataFrame:
    """Per candidate and scheme, the record of a limit on levels it was not fitted on: `static → lagged`,
    `lagged → static`, `leave one pair out` (`limits.held_out_predictions`, the thresholds' validation:
    summed over the held-out pairs; `limit` NaN there) and, for reference, `in sample` (fitted and scored on
    every decided level)."""
    decided = points[points["decided"]]
    out = []
    for s in statistics or [c for c in candidates() if c in decided and decided[c].notna().any()]:
        schemes = [("static → lagged", decided[decided["group"] == "static"], decided[decided["group"] == "lagged"]),
                   ("lagged → static", decided[decided["group"] == "lagged"], decided[decided["group"] == "static"]),
                   ("in sample", decided, decided)]
        for name, train, test in schemes:
            out.append({"statistic": s, "scheme": name, **_predict(train, test, s)})
        held = held_out_predictions(decided, s)
        held = held[np.isfinite(held[s].to_numpy(dtype=float))]
        out.append({"statistic": s, "scheme": "leave one pair out", "limit": math.nan,
                    **_record(held["admitted"].to_numpy(dtype=bool), held["tolerated"].to_numpy(dtype=bool))})
    return pd.DataFrame(out)


def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """Candidates ordered by levels right across sources (both directions of `static ↔ lagged` summed),
    then leave one pair out, ties in the table's order (`candidates()`: the check's own statistics first):
    `across_sources`, `across_sources_levels`, `lopo`, `lopo_levels`."""
    table = table if "statistic" in table.columns else table.reset_index()  # indexed by (statistic, scheme) too
    wide = table.pivot_table(index="statistic", columns="scheme", values=["right", "levels"], aggfunc="sum")
    wide = wide.reindex(table["statistic"].unique())  # pivot_table sorts by name: back to the table's order
    both = ["static → lagged", "lagged → static"]
    frame = pd.DataFrame({"across_sources": wide["right"][both].sum(axis=1),
                          "across_sources_levels": wide["levels"][both].sum(axis=1),
                          "lopo": wide["right"]["leave one pair out"], "lopo_levels": wide["levels"]["leave one pair out"]})
    return frame.sort_values(["across_sources", "lopo"], ascending=False, kind="stable")


DRIFT_FLOOR = 0.01  # nats: a ratio's denominator below this is the estimator's noise, a tenth of the limits' scale


def drift_table(points: pd.DataFrame, *, floor: float = DRIFT_FLOOR) -> pd.DataFrame:
    """How `mismatch_kl` moves during training, per source (decided levels or not), as median and max over
    the levels whose denominator is at least `floor` nats: the window's value over the first step's
    (`window_over_first`: what a check before training misses), the last steps' over the window's
    (`end_over_window`: every source) and the in-training peak — the larger of the window's and the last
    steps' — over the first step's (`peak_over_first`). `margin` (static sources) = the peak ratio's median
    over its max: the factor a limit fitted on first-step values, whose levels drifted as the median did,
    is lowered by for a run that drifts as much as the study's worst (1 with fewer than two levels)."""
    out = []
    for source, group in points.groupby("source", sort=True):
        row = {"source": source, "levels": len(group)}
        peak = group[["window:mismatch_kl", "end:mismatch_kl"]].max(axis=1) if {
            "window:mismatch_kl", "end:mismatch_kl"} <= set(group) else pd.Series(math.nan, index=group.index)
        for name, num, den in (("window_over_first", group.get("window:mismatch_kl"), "first:mismatch_kl"),
                               ("end_over_window", group.get("end:mismatch_kl"), "window:mismatch_kl"),
                               ("peak_over_first", peak, "first:mismatch_kl")):
            keep = (group[den] >= floor) if den in group and num is not None else pd.Series(False, index=group.index)
            ratio = (num[keep] / group.loc[keep, den]).dropna() if keep.any() else pd.Series(dtype=float)
            row.update({f"{name}_n": len(ratio), f"{name}_median": float(ratio.median()) if len(ratio) else math.nan,
                        f"{name}_max": float(ratio.max()) if len(ratio) else math.nan})
        n, med, top = row["peak_over_first_n"], row["peak_over_first_median"], row["peak_over_first_max"]
        row["margin"] = (min(1.0, med / top) if n >= 2 and top > 0 else 1.0) if source in STATIC_SOURCES else math.nan
        out.append(row)
    return pd.DataFrame(out)


def transfer_markdown(points: pd.DataFrame, table: pd.DataFrame, *, window: int = WINDOW) -> str:
    """The comparison as Markdown: the decided levels per group, each candidate's record per scheme."""
    decided = points[points["decided"]]
    counts = decided.groupby(["group", "tolerated"]).size()

    def n(group: str, tol: bool) -> int:
        return int(counts.get((group, tol), 0))

    lines = ["# Which statistic predicts tolerance across sources", "",
             f"Decided levels: static sources (formats, noise, engines) {n('static', True)} tolerated, "
             f"{n('static', False)} not; lagged sources (staleness, reuse) {n('lagged', True)} tolerated, "
             f"{n('lagged', False)} not; {len(points) - len(decided)} undecided levels not used. `first:` is the "
             f"statistic at step 1 (before any update: 0 for a lagged copy); `window:` its mean over the {window} "
             "update steps after the lag is full; `seq_kl` the window's `mismatch_kl` × the level's mean response "
             "length; `copy:` the full-vocabulary probe of the copy at the first evaluation after step 0. Each "
             "cell: levels right / levels, the limit fitted on the training side, and (in brackets) always "
             "admitting / always rejecting on the same levels.", "",
             "| statistic | static → lagged | lagged → static | leave one pair out | in sample |", "|---|---|---|---|---|"]
    for s, group in table.groupby("statistic", sort=False):
        cells = []
        for scheme in ("static → lagged", "lagged → static", "leave one pair out", "in sample"):
            r = group[group["scheme"] == scheme].iloc[0]
            limit = "" if math.isnan(r["limit"]) else f" at ≤ {r['limit']:.3g}"
            cells.append(f"{r['right']}/{r['levels']}{limit} ({r['always_admit']} / {r['always_reject']})")
        lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    best = ranking(table)
    top = best.index[0]
    tied = best.index[(best["across_sources"] == best.loc[top, "across_sources"])
                      & (best["lopo"] == best.loc[top, "lopo"])]
    named = " and ".join(f"`{s}`" for s in tied) + (", tied" if len(tied) > 1 else "")
    lines += ["", f"Best across sources: {named} ({best.loc[top, 'across_sources']} of "
              f"{best.loc[top, 'across_sources_levels']} levels right when fitted on the other group; "
              f"{best.loc[top, 'lopo']} of {best.loc[top, 'lopo_levels']} leaving one pair out)."]
    drift = drift_table(points)
    lines += ["", "## Drift: how `mismatch_kl` moves during training", "",
              f"Per source, over every level (decided or not) whose denominator is at least {DRIFT_FLOOR:g} nats: the "
              f"window's value over the first step's (what a check before training misses), the mean over the last "
              f"{window} steps over the window's, and the in-training peak (the larger of the two) over the first "
              "step's. Median and largest ratio, and how many levels. The margin (static sources: the peak ratio's "
              "median over its largest) is the factor `mismatch check` lowers the fitted limit by for a run that "
              "drifts as much as the study's worst; between the lowered limit and the fitted one it answers uncertain.",
              "", "| source | window / first: n, median, max | end / window: n, median, max | "
              "peak / first: n, median, max | margin |", "|---|---|---|---|---|"]
    for r in drift.to_dict("records"):
        cells = [f"{r[f'{k}_n']}, {r[f'{k}_median']:.3g}, {r[f'{k}_max']:.3g}" if r[f"{k}_n"] else "—"
                 for k in ("window_over_first", "end_over_window", "peak_over_first")]
        cells.append("—" if math.isnan(r["margin"]) else f"{r['margin']:.3g}")
        lines.append(f"| {r['source']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
