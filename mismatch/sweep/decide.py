"""Adaptive seeds: more seeds, in rounds, for the levels whose interval still straddles a threshold.

After a study's planned OPD runs, every level (pair × source × settings × level, pooled over seeds by
`mismatch.opd.tolerance.level_table`) that is `uncertain` and has fewer than `max_seeds` seeds gets
more seeds, each with its clean twin; the rounds go on until every level is decided or has
`max_seeds`. A round follows from the results on disk alone (`rounds`): the planned runs' levels are
judged, the next seeds of each undecided level are chosen, and when those runs are all on disk the
next round is judged with them — so the rounds are deterministic, resumable and can be shown
before they run (`mismatch sweep --decide --dry-run`).

How many seeds a round gives a level (`next_seed_count`): enough, by the level's own spread, for the
95% half-width to fall below the distance of the straddling mean from its threshold — at least two
more, at most twice the seeds so far (an sd from three seeds is itself uncertain), never beyond
`max_seeds`; a level with one seed (no spread yet) goes to three. New seeds are the smallest seed
numbers the level has on disk; a seed planned before whose run failed is neither retried nor replaced
(a failure is the configuration's, not the seed's), so the rounds always end.

Looking again after each round is a sequential test: with R looks at 95% the chance that a level at
its threshold is called wrongly grows with R (Bonferroni: at most R × 5%). The study's rounds are
few (3 → 6 → 10 seeds at `max_seeds` 10); the report counts each level's seeds, so a reader sees
which levels were decided late. A level still uncertain at `max_seeds` is reported as undecided at
that many seeds, with its interval and its distance from the threshold.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.opd.tolerance import analyse, t975
from mismatch.results import run_id
from mismatch.sweep.tasks import task_id  # the ledger's keys
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance

LEVEL_KEY = ("pair", "source", "settings", "level")


@dataclass(frozen=True)
class Round:
    """One round of adaptive seeds: the runs it adds (each new seed with its clean twin) and, per level
    that got seeds, `(level key, seeds before, seeds after)`."""

    runs: tuple[OPDConfig, ...]
    levels: tuple[tuple[tuple, int, int], ...]


def next_seed_count(seeds: int, spreads: Sequence[tuple[float, float]], max_seeds: int) -> int:
    """Seeds a level should have after this round.

    Args:
        seeds: the level's seeds so far (n).
        spreads: `(distance of the mean from the threshold, sd over seeds)` of each statistic whose
            interval straddles its threshold (same units within a pair).
        max_seeds: the cap.

    Returns:
        The smallest n' whose 95% half-width t(n'−1)·sd/√n' is below every distance, clipped to
        [n + 2, 2n] (three for a level with one seed) and to `max_seeds`.
    """
    if seeds < 2 or not spreads:
        return min(max_seeds, 3)
    need = seeds
    for distance, sd in spreads:
        n = seeds
        while n < 2 * seeds and not (t975(n - 1) * sd / math.sqrt(n) < distance):
            n += 1
        need = max(need, n)
    return min(max_seeds, max(seeds + 2, min(need, 2 * seeds)))


def _straddling(level: pd.Series, tolerance: Tolerance) -> list[tuple[float, float]]:
    """`(distance, sd)` of the level's statistics whose intervals straddle their thresholds."""
    out = []
    n = int(level["seeds"])
    for mean, half, limit in ((level["acc_delta"], level["acc_delta_hw"], -tolerance.acc_tol),
                              (level["kl_ratio"], level["kl_ratio_hw"], 1 + tolerance.kl_tol)):
        if any(isinstance(v, float) and math.isnan(v) for v in (mean, half)) or n < 2:
            continue
        distance = abs(float(mean) - limit)
        if distance <= float(half):  # the interval reaches the threshold: this statistic is undecided
            out.append((distance, float(half) * math.sqrt(n) / t975(n - 1)))
    return out


def _ids(configs: Sequence[OPDConfig]) -> dict[str, OPDConfig]:
    return {run_id("opd", run_columns(c)): c for c in configs}


def next_round(configs: Sequence[OPDConfig], rows: pd.DataFrame, *, max_seeds: int | Callable[[OPDConfig], int],
               tolerance: Tolerance = DEFAULT_TOLERANCE) -> Round:
    """The round after `configs` (the runs planned so far), judged on their rows among `rows`.
    `max_seeds`: the cap, or the cap of a level's run (`Plan.max_seeds`: a block's own).

    Only the runs of `configs` are judged (a dataset may hold other studies' runs). A level whose
    runs are not all on disk is judged as it stands; the caller runs a round's runs before asking for
    the next one.
    """
    ids, known = _ids(configs), set(configs)
    mine = rows[(rows["kind"] == "opd") & rows["run_id"].isin(list(ids))]
    if mine.empty:
        return Round((), ())
    analysis = analyse(mine, tolerance)
    runs, levels = analysis.runs, analysis.levels
    planned: dict[tuple, list[OPDConfig]] = {}  # level → its planned (non-clean) configs, every seed
    key_of = {r["run_id"]: tuple(r[k] for k in LEVEL_KEY) for r in runs.to_dict("records")}
    for rid, config in ids.items():
        if rid in key_of and not config.is_clean:
            planned.setdefault(key_of[rid], []).append(config)
    added: list[OPDConfig] = []
    grown = []
    for level in levels.to_dict("records"):
        key = tuple(level[k] for k in LEVEL_KEY)
        if level["verdict"] != "uncertain" or key not in planned:
            continue
        configs_of = planned[key]
        seeds_planned = sorted({c.seed for c in configs_of})
        cap = min(max_seeds(c) for c in configs_of) if callable(max_seeds) else max_seeds
        if len(seeds_planned) >= cap:
            continue
        target = next_seed_count(int(level["seeds"]), _straddling(pd.Series(level), tolerance), cap)
        extra = target - len(seeds_planned)
        if extra <= 0:
            continue
        new_seeds, candidate = [], 0
        while len(new_seeds) < extra:
            if candidate not in seeds_planned:
                new_seeds.append(candidate)
            candidate += 1
        templates = {dataclasses.replace(c, seed=0) for c in configs_of}  # one per spelling of the level
        before = len(added)
        for template in sorted(templates, key=repr):
            for seed in new_seeds:
                run = dataclasses.replace(template, seed=seed)
                for config in (run.clean(), run):
                    if config not in added and config not in known:
                        added.append(config)
        if len(added) > before:  # seeds planned before whose runs failed are neither retried nor replaced
            grown.append((key, len(seeds_planned), target))
    return Round(tuple(added), tuple(grown))


def rounds(configs: Sequence[OPDConfig], rows: pd.DataFrame, ledger: dict[str, dict], *,
           max_seeds: int | Callable[[OPDConfig], int],
           tolerance: Tolerance = DEFAULT_TOLERANCE) -> tuple[tuple[OPDConfig, ...], list[Round]]:
    """Replay the rounds on disk after the planned `configs`: while every run so far has ended (done or
    failed in the sweep's `ledger`, `mismatch.sweep.tasks.read_ledger`), the next round is judged on
    `rows` and taken; the first round with a run still to do is the one to run.

    Returns:
        Every run the study has now — planned, rounds ended, and the round to run — and the rounds
        found (the last one still to run unless all its runs have ended; no new round: every level
        is decided or has `max_seeds` planned seeds).
    """
    def ended(batch: Sequence[OPDConfig]) -> bool:
        return all(ledger.get(task_id(c), {}).get("status") in ("done", "failed") for c in batch)

    everything = list(configs)
    found: list[Round] = []
    while ended(everything):
        step = next_round(everything, rows, max_seeds=max_seeds, tolerance=tolerance)
        if not step.runs:
            break
        found.append(step)
        everything += step.runs
    return tuple(everything), found
