"""Time estimates of a study's tasks from measured costs (`mismatch sweep --dry-run`).

An OPD run costs about `steps × batch_size × train_s` (rollout, teacher scoring and update: seconds
per prompt and step, measured as the run's own per-step `wall_s`) plus `evaluations × eval_prompts ×
eval_s` (held-out sampled and greedy responses, with the run's set-up folded in); a probe group about
`tokens × (1 + candidates) × token_s` (generation and set-up folded in). The coefficients are fitted
per pair — and per response cap (`max_new_tokens`) where runs set one, since a step's cost grows with the
responses it samples and scores — and per reference model (`fit_costs`) from a finished sweep — its ledger's seconds and its
rows — never guessed: the package ships those measured by `sweeps/paper.toml` on the 2-core machine
here with one torch thread per task (`mismatch/data/sweep_costs.json`; the SmolLM2 pairs' from the timed parts
of `make reproduce-study`, its `provenance` says), and a results directory that
already holds runs adds its own. A pair or model never measured gets no estimate (NaN).
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from statistics import median

import pandas as pd

from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.probes.runs import ProbeConfig
from mismatch.results import read_results, run_id
from mismatch.model.generate import read_prompts
from mismatch.sweep.tasks import Task, read_ledger, record_status, task_id

COSTS_FILE = "sweep_costs.json"


def packaged_costs() -> dict[str, dict[str, float]]:
    """The coefficients shipped with the package: `{"opd": {pair: {train_s, eval_s[, by_length: {cap: {train_s,
    eval_s}}]}}, "probe": {model: {unit_s, blocks}}}` (`by_length`: runs with a `max_new_tokens` cap, by cap)."""
    path = resources.files("mismatch") / "data" / COSTS_FILE
    return json.loads(path.read_text()) if path.is_file() else {"opd": {}, "probe": {}}


def _evaluations(config: dict) -> int:
    steps, every = int(config["steps"]), int(config["eval_every"])
    return 1 + steps // every + (steps % every != 0)


def fit_costs(out: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """Fit the cost coefficients (module docstring) from the finished tasks of a sweep's results directory."""
    ledger = {tid: r for tid, r in read_ledger(out).items() if r.get("status") == "done"}
    if not ledger:
        return {"opd": {}, "probe": {}}
    rows = read_results(out)
    wall = rows[rows["metric"] == "wall_s"].groupby("run_id")["value"].sum()
    opd: dict[str, list[tuple[float, float, int | None]]] = {}
    probe: dict[str, list[float]] = {}
    for record in ledger.values():
        config = record["config"]
        if config.get("device", "cpu") != "cpu":  # the coefficients are a CPU's (and a CUDA config needs CUDA)
            continue
        if "pair" in config:
            rid = run_id("opd", run_columns(OPDConfig(**config)))  # the id its rows carry
            if rid not in wall:  # written by another toolkit version, or its pair changed since
                continue
            train = wall[rid] / (config["steps"] * config["batch_size"])
            evals = (record["seconds"] - wall[rid]) / (_evaluations(config) * config["eval_prompts"])
            opd.setdefault(config["pair"], []).append((train, evals, config.get("max_new_tokens")))
        else:
            prompts, candidates, blocks = _probe_size(config, rows)
            if prompts:
                unit = prompts * max(1, config["max_new_tokens"]) * (1 + candidates)
                probe.setdefault(config["reference"], []).append((record["seconds"] / unit, blocks))
    return {"opd": {p: _opd_costs(v) for p, v in opd.items()},
            "probe": {m: {"unit_s": median(u for u, _ in v), "blocks": max(b for _, b in v)} for m, v in probe.items()}}


def _opd_costs(runs: list[tuple[float, float, int | None]]) -> dict:
    """A pair's OPD coefficients from its runs' (train_s, eval_s, max_new_tokens): medians over all, and per
    response cap under `by_length` (JSON keys: the cap as text) where runs set one."""
    def medians(chosen):
        return {"train_s": median(t for t, _, _ in chosen), "eval_s": median(e for _, e, _ in chosen)}

    caps = sorted({cap for _, _, cap in runs if cap is not None})
    by_length = {str(cap): medians([r for r in runs if r[2] == cap]) for cap in caps}
    return {**medians(runs), **({"by_length": by_length} if by_length else {})}


def _probe_size(config: dict, rows: pd.DataFrame) -> tuple[int, int, int]:
    """Prompts, candidates and decoder blocks (0 unless an isolation map) of a probe group, from its rows."""
    summ = rows[(rows["kind"] == "probe") & (rows["level"] == "summary") & (rows["metric"] == "tokens")]
    mine = summ[(summ["reference"] == config["reference"]) & (summ["seed"] == config["seed"])
                & summ["perturb"].isin(config["perturb"])]
    scopes = mine["layers"].astype(str)
    mine = mine[scopes.str.isdigit()] if config.get("each_layer") else mine[scopes == config["layers"]]
    if not len(mine):
        return 0, 0, 0
    blocks = mine["layers"].astype(int).max() + 1 if config.get("each_layer") else 0
    return int(mine["n_prompts"].iloc[0]), len(mine), int(blocks)


def estimate_seconds(task: Task, costs: dict) -> float:
    """Estimated seconds of one task with `costs` (`fit_costs` / `packaged_costs`); NaN when its
    pair or reference model was never measured."""
    if isinstance(task, OPDConfig):
        c = costs.get("opd", {}).get(task.pair)
        if c is None:
            return math.nan
        c = c.get("by_length", {}).get(str(task.max_new_tokens), c)  # a cap measured on its own; else the pair's
        evaluations = _evaluations({"steps": task.steps, "eval_every": task.eval_every})
        return task.steps * task.batch_size * c["train_s"] + evaluations * task.eval_prompts * c["eval_s"]
    assert isinstance(task, ProbeConfig)
    c = costs.get("probe", {}).get(task.reference)
    if c is None or task.prompts is None and not task.texts:
        return math.nan
    prompts = len(read_prompts(task.prompts)) if task.prompts is not None else len(task.texts)
    prompts = min(prompts, task.max_prompts or prompts)
    candidates = len(task.perturb) * (c["blocks"] if task.each_layer else 1)
    return prompts * max(1, task.max_new_tokens) * (1 + candidates) * c["unit_s"]


def estimates(tasks: list[Task], *, out: str | Path | None = None) -> list[float]:
    """Estimated seconds of each task: the packaged costs, refined by the runs already in `out`."""
    costs = packaged_costs()
    if out is not None and Path(out).is_dir():
        measured = fit_costs(out)
        for kind in ("opd", "probe"):
            costs.setdefault(kind, {}).update(measured.get(kind, {}))
    return [estimate_seconds(task, costs) for task in tasks]


def measured_seconds(tasks: list[Task], out: str | Path, threads: int = 1) -> tuple[int, float]:
    """How many of `tasks` the ledger in `out` records as done at `threads` torch threads (what `--resume`
    skips: `record_status`), and the sum of their measured wall times in seconds: what those tasks took,
    whatever they ran beside."""
    ledger = read_ledger(out) if Path(out).is_dir() else {}
    done = [ledger[t] for t in map(task_id, tasks) if record_status(ledger.get(t, {}), threads) == "done"]
    return len(done), float(sum(record["seconds"] for record in done))


def longest_first(tasks: list[Task], *, out: str | Path | None = None) -> list[int]:
    """Indices of `tasks`, longest estimated first (tasks never measured, NaN, come first: a new
    pair or model is usually the expensive part). Submitting a pool's tasks in this order keeps one
    long task from starting last and running alone. Ties go round-robin over the OPD runs' seeds,
    then in plan order: runs of one pair and seed share their step-0 evaluation
    (`mismatch.opd.evaluate.initial_evaluation`), which only the first to reach it computes, so twins
    started side by side would both compute it."""
    secs = estimates(tasks, out=out)
    turn, seen = [], {}
    for task in tasks:
        key = (task.pair, task.seed) if isinstance(task, OPDConfig) else None
        seen[key] = seen.get(key, -1) + 1
        turn.append(seen[key] if key is not None else 0)
    return sorted(range(len(tasks)), key=lambda i: (-math.inf if math.isnan(secs[i]) else -secs[i], turn[i], i))
