"""Tolerance verdicts: does OPD under a mismatch end where the clean run ends?

`verdict` compares two runs' final held-out metrics; `verdict_table` finds, for every OPD run in a
results frame, its clean baseline — the clean run that agrees on every `OPDConfig` field except
the rollout ones (`mismatch.opd.config.comparison_key`) — and builds the one table that the CLI
prints and the report writes.
"""

from __future__ import annotations

import math

import pandas as pd

from mismatch.opd.config import comparison_key
from mismatch.rollout.spec import rollout_label
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance, diverged, final_value

METRIC_COLUMNS = ("step", "metric", "value")
# The study's accuracy, best first: the expected exact match computed exactly (tasks with one correct
# response: no sampling noise) where both runs recorded it, else the exact match of temperature-1 samples.
ACCURACY_METRICS = ("heldout_expected_accuracy", "heldout_accuracy")
EXACT_ACCURACY = ACCURACY_METRICS[0]


def accuracy_metric(*runs: list[dict]) -> str:
    """The study's accuracy metric for comparing `runs` (metric rows each): the first of
    `ACCURACY_METRICS` that every run recorded (`heldout_accuracy` when none recorded either)."""
    recorded = [{r["metric"] for r in run} for run in runs]
    return next((m for m in ACCURACY_METRICS if all(m in names for names in recorded)), ACCURACY_METRICS[-1])


def judges_accuracy(metric: str) -> bool:
    """Whether a verdict rests on the accuracy `metric` as well as on the KL ratio: only when it is exact
    (`EXACT_ACCURACY`, the expected exact match). A sampled accuracy carries the evaluation's binomial noise
    — on smollm2-concise 4–6 points at 64–200 questions, more than the 2-point threshold — so it is
    reported beside the verdict, not judged: such a pair is judged by its held-out reverse KL to the
    teacher, the objective OPD minimises."""
    return metric == EXACT_ACCURACY


def last_step(rows: list[dict], metric: str = "heldout_rkl") -> float:
    """The last step that recorded `metric` (the last evaluation); NaN if none did."""
    return max((r["step"] for r in rows if r["metric"] == metric), default=math.nan)


def mean_value(rows: list[dict], metric: str) -> float:
    """The metric's mean over the steps that recorded it (NaN if none did)."""
    values = [r["value"] for r in rows if r["metric"] == metric]
    return sum(values) / len(values) if values else math.nan


def first_value(rows: list[dict], metric: str) -> float:
    """The metric at the earliest step that recorded it (NaN if none did): for `mismatch_kl`, the first step's
    value, before any update — what `mismatch check` measures."""
    values = [(r["step"], r["value"]) for r in rows if r["metric"] == metric]
    return min(values, key=lambda sv: sv[0])[1] if values else math.nan


def kl_curve_area(rows: list[dict], steps: list[int]) -> float:
    """Area under the held-out reverse-KL curve over `steps` (trapezoids between the evaluations), ÷ the
    steps' span: the curve's mean height. NaN unless every step of `steps` (≥ 2) recorded `heldout_rkl`."""
    by_step = {r["step"]: r["value"] for r in rows if r["metric"] == "heldout_rkl"}
    if len(steps) < 2 or any(s not in by_step for s in steps):
        return math.nan
    area = sum((b - a) * (by_step[a] + by_step[b]) / 2 for a, b in zip(steps, steps[1:]))
    return area / (steps[-1] - steps[0])


def verdict(clean_rows: list[dict], run_rows: list[dict], *, tolerance: Tolerance = DEFAULT_TOLERANCE) -> dict[str, float | bool]:
    """Compare a run's final held-out metrics with the clean run's (same seed, same prompts), at the
    last evaluation step both recorded (the final one once both runs have ended).

    It kept up when the final held-out reverse KL is at most `(1 + kl_tol)` × clean and (pairs
    with a task) the final held-out accuracy at least clean − `acc_tol` (absolute, 0.02 = 2 points).
    The accuracy is the study's (`accuracy_metric`): the expected exact match, computed exactly,
    where both runs recorded it, else the exact match of the student's temperature-1 samples.

    Returns:
        clean / run held-out KL (nats) and accuracy, `kl_ratio` = run / clean, `acc_delta` =
        run − clean, `accuracy_metric` (the metric compared), the evaluation's Monte-Carlo standard error
        of each (`kl_ratio_mc_se`, `acc_delta_mc_se`: from the runs' `heldout_rkl_se` and
        `heldout_accuracy_se`, 0 for the exact expected accuracy, NaN without them), `kl_auc_ratio`
        (the run's held-out KL curve's area ÷ the clean run's, over the evaluations both recorded up to the
        common last step, `kl_curve_area`: learning speed — a level that lags and catches up has a final
        ratio near 1 and an area ratio above it), and `kept_up`: whether the means lie within the
        thresholds (`Tolerance.kept_up`) — one run's numbers, not a verdict: verdicts are a level's, across
        seeds, with their interval (`mismatch.analysis.tolerance`).
    """
    common = min(last_step(clean_rows), last_step(run_rows))  # runs still going: compare at the same step
    metric = accuracy_metric(clean_rows, run_rows)
    out: dict[str, float | bool | str] = {
        "clean_heldout_rkl": final_value(clean_rows, "heldout_rkl", at_most=common),
        "run_heldout_rkl": final_value(run_rows, "heldout_rkl", at_most=common),
        "clean_heldout_accuracy": final_value(clean_rows, metric, at_most=common),
        "run_heldout_accuracy": final_value(run_rows, metric, at_most=common),
        "accuracy_metric": metric,
    }
    clean_kl = out["clean_heldout_rkl"]
    out["kl_ratio"] = out["run_heldout_rkl"] / clean_kl if clean_kl != 0 else (  # a clean run at KL 0
        1.0 if out["run_heldout_rkl"] == 0 else math.inf)
    out["acc_delta"] = out["run_heldout_accuracy"] - out["clean_heldout_accuracy"]
    # the evaluation's Monte-Carlo error of each comparison (the two runs' standard errors combined; NaN
    # where a run recorded none; the expected accuracy is exact: 0)
    rkl_se = [final_value(rows, "heldout_rkl_se", at_most=common) for rows in (clean_rows, run_rows)]
    out["kl_ratio_mc_se"] = abs(out["kl_ratio"]) * math.hypot(rkl_se[0] / clean_kl, rkl_se[1] / out["run_heldout_rkl"]) \
        if clean_kl and out["run_heldout_rkl"] else math.nan
    out["acc_delta_mc_se"] = 0.0 if metric == EXACT_ACCURACY else math.hypot(
        *(final_value(rows, "heldout_accuracy_se", at_most=common) for rows in (clean_rows, run_rows)))
    shared = sorted({r["step"] for r in clean_rows if r["metric"] == "heldout_rkl" and r["step"] <= common}
                    & {r["step"] for r in run_rows if r["metric"] == "heldout_rkl"})
    clean_area = kl_curve_area(clean_rows, shared)
    out["kl_auc_ratio"] = kl_curve_area(run_rows, shared) / clean_area if clean_area else math.nan
    out["kept_up"] = tolerance.kept_up(out["kl_ratio"], out["acc_delta"] if judges_accuracy(metric) else math.nan)
    return out


def opd_runs(rows: pd.DataFrame) -> list[tuple[dict, list[dict]]]:
    """`(config columns, metric rows)` of every OPD run in a tidy frame, in order of first appearance."""
    out = []
    for _, frame in rows.groupby("run_id", sort=False):
        first = frame.iloc[0]
        config = {k: first[k] for k in frame.columns if k not in ("level", "metric", "value", "step")}
        out.append((config, frame[list(METRIC_COLUMNS)].to_dict("records")))
    return out


def verdict_table(rows: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """One row per OPD run: what it trained under, where it ended, and its verdict.

    Columns: run_id, pair, rollout (label), clean (bool), seed, baseline (run_id of the clean run it is
    judged against; a clean run's own id; "" when it has none), mismatch_kl (mean over steps of the per-step rollout/training KL on
    the rollout tokens, nats), first_mismatch_kl (its value at the first step, before any update: the check's statistic),
    mismatch_logp_abs_diff_mean, copy_kl_fwd_mean (mean over the evaluations
    after step 0 of the rollout copy's full-vocabulary KL to the student, `mismatch.opd.evaluate.probe_copy`; NaN without), heldout_rkl (final, nats),
    heldout_accuracy (final, fraction: the study's accuracy, `accuracy_metric`, which names it), kl_ratio, acc_delta (fraction), kept_up (means within the thresholds; None for clean
    runs and runs without a baseline; one run's comparison — `mismatch.analysis.tolerance.run_verdicts` gives
    the verdict, pooled over seeds), loss, response_tokens (mean sampled response length, tokens: the
    steps' `tokens` over the batch size), complete (the run, and its baseline, evaluated at their last
    step: False while a run is still going or after it failed), last_step (its last evaluation), steps,
    diverged (`diverged`).
    """
    runs = opd_runs(rows)
    clean = {comparison_key(cfg): (cfg["run_id"], metrics) for cfg, metrics in runs if rollout_label(cfg) == "clean"}
    table = []
    for cfg, metrics in runs:
        is_clean = rollout_label(cfg) == "clean"
        base_id, base = clean.get(comparison_key(cfg), ("", None))
        v = verdict(base, metrics, tolerance=tolerance) if base is not None and not is_clean else {}
        accuracy = accuracy_metric(metrics, *([base] if base is not None else []))
        table.append({"run_id": cfg["run_id"], "pair": cfg.get("pair"), "rollout": rollout_label(cfg), "clean": is_clean,
                      "seed": cfg.get("seed"),
                      "baseline": base_id if not is_clean else cfg["run_id"],
                      "mismatch_kl": mean_value(metrics, "mismatch_kl"),
                      "first_mismatch_kl": first_value(metrics, "mismatch_kl"),
                      "mismatch_logp_abs_diff_mean": mean_value(metrics, "mismatch_logp_abs_diff_mean"),
                      "copy_kl_fwd_mean": mean_value([m for m in metrics if m["step"] > 0], "copy_kl_fwd_mean"),
                      "heldout_rkl": final_value(metrics, "heldout_rkl"),
                      "heldout_accuracy": final_value(metrics, accuracy), "accuracy_metric": accuracy,
                      "kl_ratio": 1.0 if is_clean else v.get("kl_ratio", math.nan),
                      "acc_delta": 0.0 if is_clean else v.get("acc_delta", math.nan),
                      "kept_up": v.get("kept_up"), "loss": cfg.get("loss"),
                      "response_tokens": mean_value(metrics, "tokens") / cfg["batch_size"] if cfg.get("batch_size") else math.nan,
                      "kl_ratio_mc_se": v.get("kl_ratio_mc_se", math.nan), "acc_delta_mc_se": v.get("acc_delta_mc_se", math.nan),
                      "kl_auc_ratio": 1.0 if is_clean else v.get("kl_auc_ratio", math.nan),
                      "complete": last_step(metrics) == cfg.get("steps") and (
                          base is None or last_step(base) == cfg.get("steps")),
                      "last_step": last_step(metrics), "steps": cfg.get("steps"), "diverged": diverged(metrics)})
    return pd.DataFrame(table)
