"""More seeds, in rounds, for the levels still undecided — from one pre-registered look to the next.

After a study's planned OPD runs, every level (pair × source × settings × level, pooled over seeds and
judged by `mismatch.analysis.tolerance.judge_level`) that is `uncertain` gets the seeds of the sequential
design's next look (`mismatch.analysis.sequential.Design.looks`: 3 → 6 → 10 → 16), each with its clean twin;
the rounds go on until every level is decided or has reached the last look within `max_seeds` (a cap
between two looks stops at the one below it: a look the design has not planned would spend α it
has not got). A round follows from the results on disk alone (`rounds`): the planned runs' levels are
judged, the next seeds of each undecided level are chosen, and when those runs are all on disk the
next round is judged with them — per judging group (`judging_group`: a level, its clean twins and its A/A
level), so that one group's look never waits for another's — and the rounds are deterministic, resumable and
can be shown before they run (`mismatch sweep --decide --dry-run`).

The seed count of a round never depends on the data beyond "decided or not" (`next_seeds`): with the
design's α-spending boundaries, a level sitting on a threshold is declared decided at most α = 5% of
the time over all its looks, whatever its spread against its A/A level's (simulated with this planner and rule: `mismatch.analysis.sequential.simulate`,
tests/sweep/test_decide.py). New seeds are the smallest seed numbers the level has not on disk; a seed
planned before whose run failed is neither retried nor replaced (a failure is the configuration's,
not the seed's), so the rounds always end. A level still uncertain at its last look is reported as
undecided at that many seeds, with its interval and its distance from the threshold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.analysis.tolerance import NOT_SETTINGS, analyse
from mismatch.results import run_id
from mismatch.analysis.sequential import DEFAULT_DESIGN, Design, next_seeds
from mismatch.sweep.tasks import task_id  # the ledger's keys
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance

LEVEL_KEY = ("pair", "source", "settings", "level")


@dataclass(frozen=True)
class Round:
    """One round of adaptive seeds: the runs it adds (each new seed with its clean twin) and, per level
    that got seeds, `(level key, seeds before, seeds after)`; `group`: the judging group it was taken for
    (`judging_group`; None for a round taken across every run given, `next_round`)."""

    runs: tuple[OPDConfig, ...]
    levels: tuple[tuple[tuple, int, int], ...]
    group: OPDConfig | None = None


def _ids(configs: Sequence[OPDConfig]) -> dict[str, OPDConfig]:
    return {run_id("opd", run_columns(c)): c for c in configs}


def next_round(configs: Sequence[OPDConfig], rows: pd.DataFrame, *, max_seeds: int | Callable[[OPDConfig], int],
               tolerance: Tolerance = DEFAULT_TOLERANCE, design: Design = DEFAULT_DESIGN) -> Round:
    """The round after `configs` (the runs planned so far), judged on their rows among `rows`.
    `max_seeds`: the cap, or the cap of a level's run (`Plan.max_seeds`: a block's own).

    Only the levels of `configs` get seeds, but each is judged on every OPD run of `rows`, as the reports
    judge it: another study's runs of the same level (the same run ids: its seeds beyond these) and of its
    A/A level (which lends the level its spread) count, so that the planner stops where the reports decide
    (judged on this study's runs alone, a level whose A/A level had more seeds elsewhere was planned on
    another basis than the one it was reported on). A level whose runs are not all on disk is judged as it
    stands; the caller runs a round's runs before asking for the next one.
    """
    return _next_round(configs, _Judged(rows, tolerance, design), max_seeds=max_seeds, design=design)


class _Judged:
    """`rows`' OPD runs judged per set of pairs, once: a replay asks for the same pairs' verdicts round after round
    (the rows do not change during it), and the judging is what costs."""

    def __init__(self, rows: pd.DataFrame, tolerance: Tolerance, design: Design):
        self.rows, self.tolerance, self.design, self._done = rows, tolerance, design, {}

    def __call__(self, pairs: frozenset[str]):
        if pairs not in self._done:
            opd = self.rows[(self.rows["kind"] == "opd") & self.rows["pair"].isin(sorted(pairs))]
            self._done[pairs] = (set(opd["run_id"]), analyse(opd, self.tolerance, self.design) if len(opd) else None)
        return self._done[pairs]


def _next_round(configs: Sequence[OPDConfig], judged: _Judged, *, max_seeds: int | Callable[[OPDConfig], int],
                design: Design) -> Round:
    ids, known = _ids(configs), set(configs)
    # a level and its A/A level are one pair's: other pairs' runs never count
    on_disk, analysis = judged(frozenset(c.pair for c in configs))
    if not on_disk & set(ids):
        return Round((), ())
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
        target = next_seeds(len(seeds_planned), level["verdict"], cap, design)
        if target is None:
            continue
        extra = target - len(seeds_planned)
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
           max_seeds: int | Callable[[OPDConfig], int], tolerance: Tolerance = DEFAULT_TOLERANCE,
           design: Design = DEFAULT_DESIGN) -> tuple[tuple[OPDConfig, ...], list[Round]]:
    """Replay the rounds on disk after the planned `configs`, per judging group (`judging_group`): while every
    run of a group so far has ended (done or failed in the sweep's `ledger`, `mismatch.sweep.tasks.read_ledger`),
    its next round is judged on `rows` and taken; its first round with a run still to do is the one to run.

    Returns:
        Every run the study has now — planned, rounds ended, and the rounds to run — and the rounds
        found, group by group (each group's last one still to run unless all its runs have ended; no new
        round: every level is decided or has `max_seeds` planned seeds).
    """
    def ended(batch: Sequence[OPDConfig]) -> bool:
        return all(ledger.get(task_id(c), {}).get("status") in ("done", "failed") for c in batch)

    judged = _Judged(rows, tolerance, design)
    everything = list(configs)
    found: list[Round] = []
    groups: dict[OPDConfig, list[OPDConfig]] = {}
    for config in configs:
        groups.setdefault(judging_group(config), []).append(config)
    for group, planned in groups.items():  # each group's rounds on its own runs: one group's look waits for no other's
        while ended(planned):
            step = _next_round(planned, judged, max_seeds=max_seeds, design=design)
            if not step.runs:
                break
            found.append(dataclasses.replace(step, group=group))
            planned += step.runs
            everything += step.runs
    return tuple(everything), found


def judging_group(config: OPDConfig) -> OPDConfig:
    """The runs a level is judged on — its own, its clean twins', its A/A level's — share this key: the clean run
    at seed 0 with the fields a level's settings leave out (`NOT_SETTINGS`: how often it evaluates, chunk sizes)
    at their defaults, so the pair and every setting but the rollout. No run outside the group moves its levels'
    verdicts, so the rounds are replayed per group: a group's next look is planned as soon as its own runs have
    ended, whatever another group's (a cheap rung's look does not wait behind an expensive one's), and every group
    reaches the seeds it would reach with rounds taken across the whole study at once. (Identical levels of two
    groups, `same_as`, are reported once, under the first; the seeds planned are the same either way.)"""
    return dataclasses.replace(config.clean(), seed=0, **_UNJUDGED)


_UNJUDGED = {f.name: f.default for f in dataclasses.fields(OPDConfig) if f.name in NOT_SETTINGS - {"pair", "seed"}}
