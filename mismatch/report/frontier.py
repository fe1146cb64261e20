"""The cost frontier per pair: what each rollout configuration of a study costs, how OPD fared with it,
and the cheapest configuration that stayed tolerated.

Costs are the analytic factors of `mismatch.rollout.cost` (weight bytes read per decoded token,
rollouts generated per trained step, the step's wall clock with the overlap a lag allows). The
model-dependent ones (`COST_FACTOR_COLUMNS`) were computed on the pair student's architecture when each
run was written and are read from its rows: the report instantiates no model. Levels whose rows lack
them (written before mismatch stored them) are not costed. The rollout share of a step (for the wall clock) is each pair's own, measured
in its clean runs (median rollout_s ÷ wall_s). Verdicts and Δ come from `mismatch.analysis.tolerance`. The
cheapest configuration is named twice: by the interval verdict (`tolerated`), and by the means
alone (Δ accuracy ≥ −acc_tol and KL ratio ≤ 1 + kl_tol: kept up with clean on average, not shown
to at the seed interval).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mismatch.rollout.cost import COST_FACTOR_COLUMNS, assemble_cost
from mismatch.rollout.spec import RolloutSpec
from mismatch.analysis.twins import opd_runs
from mismatch.report.common import plus_minus
from mismatch.analysis.tolerance import Analysis, analyse, kept_up
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance

COST_COLUMNS = ("weight_bytes", "rollouts_generated", "rollout_cost", "step_wall")


def rollout_shares(runs: list[tuple[dict, list[dict]]]) -> dict[str, float]:
    """Per pair: median over its clean runs' steps of rollout_s ÷ wall_s (`runs`: `opd_runs` of the rows)."""
    out: dict[str, list[float]] = {}
    for config, metrics in runs:
        if not RolloutSpec.parse(str(config.get("rollout")), int(config.get("staleness", 0))).is_clean:
            continue
        by_step: dict[int, dict[str, float]] = {}
        for m in metrics:
            by_step.setdefault(m["step"], {})[m["metric"]] = m["value"]
        out.setdefault(config["pair"], []).extend(v["rollout_s"] / v["wall_s"] for v in by_step.values()
                                                  if v.get("wall_s", 0) > 0 and "rollout_s" in v)
    return {pair: float(pd.Series(v).median()) for pair, v in out.items() if v}


NOT_COSTED = ("Engine levels (`engine:llama.cpp,…`) are not costed here: which tensors their GGUF export could "
              "store in the named type depends on the shapes (`reports/engines.md`), and `benchmarks/bench_engines.py` "
              "measures their decoding speed instead.")


def frontier_table(rows: pd.DataFrame, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                   analysis: Analysis | None = None) -> pd.DataFrame:
    """Every judged level with its cost factors (`COST_COLUMNS`), `kept_up` (the means within the
    thresholds), and `cheapest` marks: `tolerated` / `by means` on each pair's cheapest such level
    by step wall clock. `analysis`: the rows' `analyse` when the caller has it (`tolerance` is used only
    without one)."""
    opd = rows[rows["kind"] == "opd"]
    analysis = analysis if analysis is not None else analyse(rows, tolerance)
    runs, levels, tolerance = analysis.runs, analysis.levels, analysis.tolerance
    levels = levels[levels["source"] != "engine"] if len(levels) else levels  # NOT_COSTED
    if levels.empty:
        return levels
    per_run = opd_runs(opd)
    configs = {cfg["run_id"]: cfg for cfg, _ in per_run}
    shares, costs = rollout_shares(per_run), []
    first = runs.drop_duplicates(["pair", "source", "settings", "level"]).set_index(
        ["pair", "source", "settings", "level"])["run_id"]
    for row in levels.itertuples():
        cfg = configs[first[(row.pair, row.source, row.settings, row.level)]]
        rollout = RolloutSpec.parse(str(cfg["rollout"]), int(cfg.get("staleness", 0)))
        factors = [float(cfg.get(name, math.nan)) for name in COST_FACTOR_COLUMNS]  # stored when the run was written
        if any(math.isnan(f) for f in factors):  # rows written before they were stored, or not costed
            costs.append({name: math.nan for name in COST_COLUMNS} | {"rollout_share": shares.get(row.pair, 0.5)})
            continue
        c = assemble_cost(rollout.perturbation_spec or "none", *factors, rollout.staleness, rollout.reuse,
                          shares.get(row.pair, 0.5))
        costs.append({name: getattr(c, name) for name in COST_COLUMNS} | {"rollout_share": c.rollout_share})
    table = pd.concat([levels.reset_index(drop=True), pd.DataFrame(costs)], axis=1)
    table["kept_up"] = kept_up(table, tolerance=tolerance)
    table["cheapest"] = ""
    for _, group in table.groupby("pair", sort=False):
        for label, mask in (("tolerated", group["verdict"] == "tolerated"), ("by means", group["kept_up"])):
            if mask.any() and group.loc[mask, "step_wall"].notna().any():
                best = group.loc[mask, "step_wall"].idxmin()
                table.loc[best, "cheapest"] = ", ".join(filter(None, [table.loc[best, "cheapest"], label]))
    return table.sort_values(["pair", "step_wall"], kind="stable").reset_index(drop=True)


def frontier_markdown(table: pd.DataFrame, *, tolerance: Tolerance) -> str:
    """The frontier as Markdown, one table per pair, cheapest first."""
    lines = ["# Cost frontier", "",
             "Analytic cost of each rollout configuration of the study relative to clean synchronous rollouts in "
             "the student's own precision (fp32): weight bytes read per decoded token, rollouts generated per "
             "trained step (1/R with reuse), and the step's wall clock (rollout share measured in the pair's clean "
             "runs; a lag K ≥ 1 overlaps generation and training). Δ and KL ratio against each run's clean twin, "
             f"mean over seeds ± the sequential design's interval; *kept up* = means within −{100 * tolerance.acc_tol:g} points and "
             f"{1 + tolerance.kl_tol:g}; *cheapest* marks each pair's cheapest level by step wall clock that was tolerated "
             "(intervals) and that kept up (means). " + NOT_COSTED, ""]
    for pair, group in table.groupby("pair", sort=False):
        lines += [f"## {pair} (rollout share of a clean step {group['rollout_share'].iloc[0]:.2f})", "",
                  "| source | level | settings | weight bytes | rollouts | step wall | Δ accuracy (pts) | KL ratio | "
                  "verdict | kept up | cheapest |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in group.itertuples():
            lines.append(f"| {r.source} | {r.level} | {r.settings} | {_times(r.weight_bytes, '.3f')} | "
                         f"{_times(r.rollouts_generated, '.3g')} | {_times(r.step_wall, '.3f')} | "
                         f"{plus_minus(r.acc_delta, r.acc_delta_hw, 100, '{:+.1f}')} | "
                         f"{plus_minus(r.kl_ratio, r.kl_ratio_hw, 1, '{:.3f}')} | {r.verdict} | "
                         f"{'yes' if r.kept_up else 'no'} | {r.cheapest} |")
        lines.append("")
    if table["weight_bytes"].isna().any():
        lines += [UNCOSTED, ""]
    return "\n".join(lines)


UNCOSTED = ("Levels shown — are not costed: their rows carry no cost factors (runs written before mismatch stored "
            "them beside the provenance, or a pair whose student's architecture was not local where the run was "
            "written); the same runs written again carry them.")


def _times(value: float, spec: str) -> str:
    """`×value` for a cost factor, or — when it is unknown."""
    return "—" if math.isnan(value) else f"×{value:{spec}}"


def write_frontier_report(rows: pd.DataFrame, out_dir: str | Path, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                          analysis: Analysis | None = None) -> list[Path]:
    """Write `cost_frontier.md` and `cost_frontier.csv` (nothing without judged OPD levels)."""
    analysis = analysis if analysis is not None else analyse(rows, tolerance)
    table = frontier_table(rows, analysis=analysis)
    if table.empty:
        return []
    out_dir = Path(out_dir)
    written = [out_dir / "cost_frontier.md", out_dir / "cost_frontier.csv"]
    written[0].write_text(frontier_markdown(table, tolerance=tolerance), encoding="utf-8")
    table.to_csv(written[1], index=False)
    return written
