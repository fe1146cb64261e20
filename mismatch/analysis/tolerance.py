"""Tolerance across seeds: per pair × mismatch source, which levels of mismatch OPD tolerates.

Reads results only. Every OPD run is first judged against its clean twin — the clean run that shares
every other field, the seed included (`mismatch.analysis.twins.verdict_table`) — giving Δ final held-out
accuracy and the final held-out KL ratio. Runs that differ only in their seed are then pooled: the
mean over seeds of each, with the sequential design's repeated confidence interval at the look its
seeds have reached (`judge_level`, `mismatch.analysis.sequential`: α-spending over looks at 3, 6, 10, 16
seeds, the sd pooled with the pair's A/A level as a floor). A level is
  * `tolerated` when both intervals lie within the thresholds (Δ accuracy ≥ −acc_tol, KL ratio ≤
    1 + kl_tol),
  * `not tolerated` when either interval lies wholly beyond its threshold,
  * `uncertain` otherwise: an interval straddles a threshold (before the first look: no interval).
`t_interval` (the plain 95% Student-t interval) remains for descriptive spreads.
The tolerance table names, per pair × source × settings, the largest level tolerated with every
smaller level tolerated too (noise σ, staleness K, reuse R), and for formats the cheapest tolerated
format (fewest stored bits per weight, `weight_bits`).

`settings` lists the configuration fields that vary across the dataset besides pair, seed and the
rollout (loss, learning rate, TIS cap, momentum, …), so each grid cell is its own row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mismatch.opd.config import COMPARISON_FIELDS
from mismatch.analysis.twins import judges_accuracy, opd_runs, verdict_table
from mismatch.rollout.spec import RolloutSpec
from mismatch.analysis.sequential import DEFAULT_DESIGN, Design, pooled_sd
from mismatch.verdict import DEFAULT_TOLERANCE, DIVERGED_FACTOR, TOLERANCE_WORDS, Tolerance

# two-sided 95% quantiles t_{0.975, df} of Student's t, df = 1 … 30 (any statistics table)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
LEVEL_SOURCES = ("noise", "stale", "reuse")  # sources with a numeric level
NOISE_FLOOR_SOURCE = "A/A"  # `resample:S`: clean against clean, only the rollout samples changed
CATEGORICAL_SOURCES = ("format", "engine")  # levels are specs, ordered by stored bits per weight
VERDICTS = tuple(TOLERANCE_WORDS.values())  # tolerated, uncertain, not tolerated: `mismatch.verdict`'s words
NOT_SETTINGS = {"pair", "seed", "pair_sha256", "eval_every", "chunk_tokens", "clip"}  # never a grid axis


def t975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` ≥ 1 degrees of freedom (1.96 beyond 30)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96


def t_interval(values: list[float] | np.ndarray) -> tuple[float, float]:
    """Mean and half-width of the two-sided 95% Student-t interval of the mean (NaN half-width for
    fewer than two values; the normal 1.96 beyond 30 degrees of freedom)."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return math.nan, math.nan
    if len(x) < 2:
        return float(x.mean()), math.nan
    return float(x.mean()), float(t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def source_level(rollout: str, staleness: int = 0) -> tuple[str, object]:
    """`(source, level)` of a rollout (`RolloutSpec.source`, `.level`): `("clean", 0)`, `("noise", σ)`,
    `("stale", K)`, `("reuse", R)`, `("engine", spec)`, or `("format", spec)` for every other spec (with
    `+ stale:K` when a spec is lagged too)."""
    spec = RolloutSpec.parse(rollout, staleness)
    return spec.source, spec.level


def weight_bits(spec: str) -> float:
    """Stored bits per weight of a format spec (`weight_bits` of its config; NaN if it has none)."""
    return RolloutSpec.parse(spec.split(" + ")[0]).weight_bits


def run_table(rows: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """`verdict_table` of every OPD run plus its source, level, settings (the varying fields, and the rollout's
    scope "layers …" where it is not the default) and `training` (the settings without that scope: what the run
    trains under, which a scoped level shares with its pair's A/A level — the level's reference)."""
    table = verdict_table(rows, tolerance=tolerance)
    configs = pd.DataFrame([cfg for cfg, _ in opd_runs(rows)]).set_index("run_id")
    fields = [f for f in COMPARISON_FIELDS if f in configs.columns and f not in NOT_SETTINGS]
    varying = [f for f in fields if configs[f].map(short_text).nunique() > 1]  # None and NaN alike: "off"

    def settings(run_id: str) -> tuple[str, str]:
        cfg = configs.loc[run_id]
        training = [f"{f} {short_text(cfg[f])}" for f in varying]
        layers = cfg.get("layers")  # a rollout field: runs with other scopes are other levels
        scope = [f"layers {layers}"] if isinstance(layers, str) and layers != "linear" else []
        return settings_text([*training, *scope]), settings_text(training)

    sources = [source_level(str(configs.loc[r, "rollout"]), int(configs.loc[r, "staleness"])) for r in table["run_id"]]
    texts = [settings(r) for r in table["run_id"]]
    return table.assign(source=[s for s, _ in sources],
                        level=pd.Series([lv for _, lv in sources], index=table.index, dtype=object),  # no 1 → 1.0
                        settings=[s for s, _ in texts], training=[t for _, t in texts])


SETTINGS_SEP = ", "  # between the parts of a level's settings text ("lr 0.0003, tis_cap off")


def settings_text(parts) -> str:
    """A level's settings text from its parts ("lr 0.0003", "tis_cap off"); `default` when there are none.
    The one writer of the text `run_table` gives each level; `settings_parts` reads it back."""
    return SETTINGS_SEP.join(parts) or "default"


def settings_parts(settings: str) -> list[str]:
    """The parts of a level's settings text (`settings_text`), in its order: `"lr 0.0003, tis_cap off"` →
    `["lr 0.0003", "tis_cap off"]`."""
    return settings.split(SETTINGS_SEP)


def short_text(value: object) -> str:
    """A setting or level as the tables write it: `off` for None/NaN/`pd.NA` (a nullable integer column's unset
    value, as a dataset directory reads back), floats in `%g`."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def judge_level(acc: np.ndarray | list[float], kl: np.ndarray | list[float], acc_reference=None, kl_reference=None, *,
                tolerance: Tolerance = DEFAULT_TOLERANCE, design: Design = DEFAULT_DESIGN,
                judge_accuracy: bool = True) -> dict[str, object]:
    """The rule that judges one level from its per-seed values: the study's analysis (`level_table`) and
    the simulation of its error (`mismatch.analysis.sequential.simulate`, tested) both call it.

    Each statistic (Δ accuracy, KL ratio) gets its mean, an sd (`pooled_sd`: the A/A level's values
    `*_reference` as a floor under its own), and the repeated confidence interval of the
    design at the look its seed count has reached (`Design.half_width`); the verdict is the one interval
    rule (`Tolerance.judge`) on those intervals — on the KL ratio's alone when not `judge_accuracy` (a
    sampled accuracy, `mismatch.analysis.twins.judges_accuracy`: its statistics are still returned).

    Returns:
        `seeds`, `look`, per statistic `X`, `X_hw`, `X_sd`, `X_df`, `X_basis`, `verdict` (a word),
        `judged_on`, and `kl_verdict` (the KL ratio's interval alone: the length law's criterion, one
        statistic at every length).
    """
    out: dict[str, object] = {}
    seeds = 0
    for name, values, reference in (("acc_delta", acc, acc_reference), ("kl_ratio", kl, kl_reference)):
        x = np.asarray(values, dtype=float)
        x = x[np.isfinite(x)]
        seeds = max(seeds, len(x))
        spread = pooled_sd(x, reference)
        out[name] = float(x.mean()) if len(x) else math.nan
        out[f"{name}_hw"] = design.half_width(spread.sd, len(x), spread.df) if len(x) >= 2 else math.nan
        out[f"{name}_sd"], out[f"{name}_df"], out[f"{name}_basis"] = spread.sd, spread.df, spread.basis
    out["seeds"], out["look"] = seeds, design.look(seeds)
    acc_judged = (out["acc_delta"], out["acc_delta_hw"]) if judge_accuracy else (math.nan, math.nan)
    out["verdict"] = tolerance.judge(out["kl_ratio"], out["kl_ratio_hw"], *acc_judged).word(TOLERANCE_WORDS)
    out["judged_on"] = "Δ accuracy, KL ratio" if judge_accuracy else "KL ratio"
    out["kl_verdict"] = tolerance.judge(out["kl_ratio"], out["kl_ratio_hw"]).word(TOLERANCE_WORDS)  # the KL's alone
    return out


# a level's runs, per seed, as far as the tables see them: equal in all of these, two levels are one run set
FINGERPRINT = ["acc_delta", "kl_ratio", "mismatch_kl", "copy_kl_fwd_mean", "heldout_accuracy", "heldout_rkl",
               "response_tokens"]


def _settings_apart(settings: str, other: str) -> str:
    """The parts of a settings text that differ from `other`'s ("tis_cap 2" against "tis_cap off")."""
    theirs = set(settings_parts(other))
    return SETTINGS_SEP.join(part for part in settings_parts(settings) if part not in theirs) or settings


def _clearance(mean: float, half: float, limit: float) -> float:
    """How far the interval `mean ± half` stays off `limit` (positive: it clears it; NaN without one)."""
    return abs(mean - limit) - half


def level_table(runs: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                design: Design = DEFAULT_DESIGN) -> pd.DataFrame:
    """One row per pair × source × settings × level (finished runs with a finished clean twin, pooled
    over seeds; runs sharing a seed are averaged into one value first), judged by `judge_level` under
    the sequential `design` on the seeds of the last look reached (`seeds`, its lowest seed numbers: `Design.judged_seeds`; `seeds_run`: all distinct seeds on disk; the A/A level, the reference and not a verdict, on all), the look reached, mean mismatch_kl (each run's mean over its steps)
    and first_mismatch_kl (each run's first step, before any update: the length law's statistic), Δ accuracy and KL
    ratio with their half-widths, sds, degrees of freedom and the sd's basis (own or pooled with the
    pair's A/A level), the verdict, each mean's distance from its threshold on the allowed side
    (`acc_margin` = Δ + acc_tol, `kl_margin` = 1 + kl_tol − ratio: negative beyond it), the evaluation's
    Monte-Carlo standard error of each mean (`acc_delta_mc_se`, `kl_ratio_mc_se`: from the runs'
    `heldout_*_se`; 0 for the exact expected accuracy), `marginal` (an interval clears its threshold by
    less than that Monte-Carlo error), `same_as` (other levels whose runs are identical bit for bit —
    the same rollout weights, e.g. int4:group128 ≡ int4:channel when every row is 128 wide: reported
    once, under the first), the accuracy metric compared (`accuracy_metric`) and what the verdict rests on
    (`judged_on`: both statistics, or the KL ratio alone where the accuracy is sampled, `judges_accuracy`),
    the loss, the mean response length in tokens (`response_tokens`), and learning speed: the mean ratio of
    the held-out KL curve's area to the clean twin's (`kl_auc_ratio` ± its plain 95% t half-width
    `kl_auc_ratio_hw`: descriptive, not judged)."""
    judged = runs[~runs["clean"] & (runs["baseline"] != "") & runs["complete"]]  # unfinished runs are not judged
    # grouped by the level's repr: pandas factorizes 1 and 1.0 (stale:1, noise:1.0) as one value
    judged = judged.assign(level_key=judged["level"].map(repr))
    columns = ["acc_delta", "kl_ratio", "mismatch_kl", "first_mismatch_kl", "copy_kl_fwd_mean", "acc_delta_mc_se",
               "kl_ratio_mc_se", "kl_auc_ratio", "heldout_accuracy", "heldout_rkl", "response_tokens"]
    groups = []
    for (pair, source, settings, _), runs_of in judged.groupby(["pair", "source", "settings", "level_key"], sort=False):
        # one value per seed: two runs of one seed (a spec spelt two ways) are one observation, not two
        groups.append((pair, source, settings, runs_of,
                       runs_of.groupby("seed", sort=True, dropna=False)[[c for c in columns if c in runs_of]].mean()))
    # each level's reference: its pair's A/A level under the same training settings (`run_table`'s `training`), which
    # a level scoped to part of the model shares — its rollouts differ only in where the copy is applied
    references = {(pair, runs_of["training"].iloc[0]): group for pair, source, settings, runs_of, group in groups
                  if source == NOISE_FLOOR_SOURCE and settings == runs_of["training"].iloc[0]}
    out, seen = [], {}
    for pair, source, settings, runs_of, group in groups:
        level = runs_of["level"].iloc[0]
        is_aa = source == NOISE_FLOOR_SOURCE  # the A/A level: every level's reference, not one of the verdicts
        # the same runs bit for bit, whatever the level's name or its settings (a TIS cap that never binds), under
        # one loss (another loss's runs are other runs, however alike their finals): one level
        loss = "/".join(sorted(set(runs_of["loss"].dropna().astype(str)))) if "loss" in runs_of else ""
        fingerprint = (pair, source, loss, tuple(map(tuple, group.reindex(columns=FINGERPRINT)
                                                .reset_index().fillna(-1.0).to_numpy().tolist())))
        if not is_aa and fingerprint in seen:
            first = seen[fingerprint]
            first["same_as"].append(short_text(level) if first["settings"] == settings
                                    else f"{short_text(level)} ({_settings_apart(settings, first['settings'])})")
            continue
        seeds_run = len(group)
        if not is_aa:  # a look partly run waits for its look; the A/A level keeps all its seeds
            group = group.iloc[:design.judged_seeds(seeds_run)]
        ref = None if is_aa else references.get((pair, runs_of["training"].iloc[0]))
        metrics = set(runs_of["accuracy_metric"].dropna())
        row = {"pair": pair, "source": source, "settings": settings, "level": level, "loss": loss}
        row.update(judge_level(group["acc_delta"], group["kl_ratio"],
                               None if ref is None else ref["acc_delta"], None if ref is None else ref["kl_ratio"],
                               tolerance=tolerance, design=design,
                               judge_accuracy=bool(metrics) and all(judges_accuracy(m) for m in metrics)))
        row.update({"seeds": len(group), "seeds_run": seeds_run,
                    "mismatch_kl": float(group["mismatch_kl"].mean()),
                    "first_mismatch_kl": float(group["first_mismatch_kl"].mean()) if "first_mismatch_kl" in group else math.nan,
                    "copy_kl_fwd_mean": float(group["copy_kl_fwd_mean"].mean()),
                    "response_tokens": float(runs_of["response_tokens"].mean()) if "response_tokens" in runs_of else math.nan,
                    **dict(zip(("kl_auc_ratio", "kl_auc_ratio_hw"), t_interval(group["kl_auc_ratio"].dropna())
                               if "kl_auc_ratio" in group else (math.nan, math.nan))),
                    "acc_margin": row["acc_delta"] + tolerance.acc_tol, "kl_margin": 1 + tolerance.kl_tol - row["kl_ratio"],
                    "accuracy_metric": "/".join(sorted(set(runs_of["accuracy_metric"].dropna()))), "same_as": []})
        marginal = False
        for name, limit in (("acc_delta", -tolerance.acc_tol), ("kl_ratio", 1 + tolerance.kl_tol)):
            se = group.get(f"{name}_mc_se")
            mc = float(np.sqrt((se.dropna() ** 2).sum()) / len(se.dropna())) if se is not None and se.notna().any() else math.nan
            row[f"{name}_mc_se"] = mc
            clear = _clearance(row[name], row[f"{name}_hw"], limit)
            judged = name == "kl_ratio" or row["judged_on"] != "KL ratio"
            marginal |= bool(judged and clear > 0 and mc == mc and clear < mc)
        row["marginal"] = marginal
        if not is_aa:
            seen[fingerprint] = row
        out.append(row)
    for row in out:
        row["same_as"] = ", ".join(row["same_as"])
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    frame["level"] = pd.Series([r["level"] for r in out], dtype=object)  # 1 (stale:1) stays 1 beside σ 0.1
    frame["order"] = [weight_bits(lv) if s in CATEGORICAL_SOURCES else float(lv) if not isinstance(lv, str) else math.inf
                      for s, lv in zip(frame["source"], frame["level"])]
    frame = frame.sort_values(["pair", "source", "settings", "order"], ascending=[True, True, True, True],
                              kind="stable")
    return frame.drop(columns="order").reset_index(drop=True)


def noise_floor(runs: pd.DataFrame, levels: pd.DataFrame) -> pd.DataFrame:
    """Per pair × settings, the spread any mismatch is judged against: the clean runs' finals over seeds
    (mean and sd of the study's accuracy, in points, and of the held-out KL) and the A/A level
    (`resample:S` against its clean twin: Δ accuracy and KL ratio, mean ± 95% half-width, the sd of Δ
    over seeds, the verdict). The A/A half-width is the smallest accuracy effect the study resolves from 0
    at that many seeds; a level whose Δ lies within it of a threshold needs more seeds to be decided."""
    out = []
    clean = runs[runs["clean"] & runs["complete"]]
    aa = levels[levels["source"] == NOISE_FLOOR_SOURCE].set_index(["pair", "settings"]) if len(levels) else None
    for (pair, settings), group in clean.groupby(["pair", "settings"], sort=True):
        acc, kl = 100 * group["heldout_accuracy"].astype(float), group["heldout_rkl"].astype(float)
        row = {"pair": pair, "settings": settings, "clean_seeds": int(group["seed"].nunique()),
               "clean_accuracy": float(acc.mean()), "clean_accuracy_sd": float(acc.std(ddof=1)),
               "clean_heldout_rkl": float(kl.mean()), "clean_heldout_rkl_sd": float(kl.std(ddof=1))}
        twins = runs[(runs["pair"] == pair) & (runs["settings"] == settings) & (runs["source"] == NOISE_FLOOR_SOURCE)
                     & runs["complete"] & (runs["baseline"] != "")]
        if aa is not None and (pair, settings) in aa.index:
            level = aa.loc[(pair, settings)]
            level = level.iloc[0] if isinstance(level, pd.DataFrame) else level
            deltas = 100 * twins.groupby("seed")["acc_delta"].mean()
            sd = float(deltas.std(ddof=1)) if len(deltas) > 1 else math.nan
            row.update({"aa_seeds": int(level["seeds"]), "aa_acc_delta": 100 * float(level["acc_delta"]),
                        "aa_acc_delta_hw": 100 * float(level["acc_delta_hw"]), "aa_acc_delta_sd": sd,
                        "aa_kl_ratio": float(level["kl_ratio"]), "aa_kl_ratio_hw": float(level["kl_ratio_hw"]),
                        "aa_verdict": level["verdict"]})
        out.append(row)
    return pd.DataFrame(out)


@dataclass(frozen=True)
class Analysis:
    """The OPD analysis every report reads, computed once (`analyse`): each run against its clean twin
    (`runs`: `run_table`), the levels pooled over seeds (`levels`: `level_table`), under `tolerance`."""

    tolerance: Tolerance
    runs: pd.DataFrame
    levels: pd.DataFrame
    design: Design = DEFAULT_DESIGN


def analyse(rows: pd.DataFrame, tolerance: Tolerance = DEFAULT_TOLERANCE, design: Design = DEFAULT_DESIGN) -> Analysis:
    """`Analysis` of the OPD rows among `rows` (tidy results; other kinds are ignored)."""
    runs = run_table(rows[rows["kind"] == "opd"], tolerance=tolerance)
    return Analysis(tolerance, runs, level_table(runs, tolerance=tolerance, design=design), design)


def run_verdicts(rows: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                 analysis: Analysis | None = None) -> pd.DataFrame:
    """`run_table` with each run's verdict as the one rule gives it — its level's, pooled over every seed
    of the level in `rows` (so one seed is `uncertain`, never a verdict) — in `verdict`, the level's
    `seeds`, and `status`: the verdict, `baseline` for a clean run, `no baseline`, or `unfinished at step
    k of N` for a run (or its clean twin) that did not reach its last step (never read as final)."""
    analysis = analysis if analysis is not None else analyse(rows, tolerance)  # `tolerance` only without one
    runs, levels = analysis.runs, analysis.levels
    keys = ["pair", "source", "settings", "level"]
    by_level = {tuple(r[k] for k in keys): (r["verdict"], r["seeds"]) for r in levels.to_dict("records")}
    found = [by_level.get(tuple(r[k] for k in keys), ("uncertain", 0)) for r in runs.to_dict("records")]
    status = []
    for r, (v, n) in zip(runs.to_dict("records"), found):
        if not r["complete"]:
            last = r["last_step"]
            at = "before its first evaluation" if last != last else f"at step {int(last)}"  # NaN: none
            status.append(f"unfinished {at} of {int(r['steps'])}")
        elif r["clean"]:
            status.append("baseline")
        elif r["baseline"] == "":
            status.append("no baseline")
        else:
            status.append(f"{v} ({n} seed{'s' if n != 1 else ''})")
        if r.get("diverged"):
            status[-1] = f"diverged (held-out KL ended > {DIVERGED_FACTOR:g}× its start); {status[-1]}"
    return runs.assign(verdict=[v for v, _ in found], seeds=[n for _, n in found], status=status)


def kept_up(levels: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE) -> pd.Series:
    """Per level, whether its *means* over seeds lie within the thresholds (Δ accuracy ≥ −acc_tol,
    no accuracy, or one not judged (`judged_on`), counting as within; KL ratio ≤ 1 + kl_tol): kept up with clean on average, which
    the interval verdict may still call uncertain."""
    judged = levels["judged_on"] if "judged_on" in levels else pd.Series("", index=levels.index)
    return pd.Series([tolerance.kept_up(float(kl), float(acc) if on != "KL ratio" else math.nan)
                      for kl, acc, on in zip(levels["kl_ratio"], levels["acc_delta"], judged)],
                     index=levels.index, dtype=bool)  # the one rule, `Tolerance.kept_up`


def tolerance_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Per pair × source × settings: the levels tested, the largest tolerated with every smaller level
    tolerated too (formats: the cheapest tolerated, by stored bits per weight), the first level not
    tolerated, and the uncertain ones with their seeds (`undecided at N seeds`). The A/A level is not a
    rung of any ladder: it is reported with the noise floor (`noise_floor`)."""
    out = []
    ladders = levels[levels["source"] != NOISE_FLOOR_SOURCE]  # the A/A level is the noise floor's (`noise_floor`)
    for (pair, source, settings), group in ladders.groupby(["pair", "source", "settings"], sort=False):
        verdict = dict(zip(group["level"], group["verdict"]))
        tested = list(group["level"])
        if source in CATEGORICAL_SOURCES:  # an engine's bits hold only where its export could use the type
            ok = sorted((lv for lv in tested if verdict[lv] == "tolerated"), key=weight_bits)
            largest = "none" if not ok else f"{ok[0]} ({weight_bits(ok[0]):g} bits)" if source == "format" else ok[0]
        else:
            largest = "none"
            for lv in tested:  # ascending
                if verdict[lv] != "tolerated":
                    break
                largest = short_text(lv)
        first_bad = next((short_text(lv) for lv in tested if verdict[lv] == "not tolerated"), "—")
        seeds = dict(zip(group["level"], group["seeds"]))
        uncertain = ", ".join(f"{short_text(lv)} (undecided at {seeds[lv]} seed{'s' if seeds[lv] != 1 else ''})"
                              for lv in tested if verdict[lv] == "uncertain") or "—"
        out.append({"pair": pair, "source": source, "loss": group["loss"].iloc[0] if "loss" in group else "",
                    "settings": settings,
                    "levels": ", ".join(short_text(lv) for lv in tested),
                    "tolerated up to": largest,
                    "first not tolerated": first_bad, "uncertain": uncertain})
    return pd.DataFrame(out)
