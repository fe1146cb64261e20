"""Pins on the sweep's bookkeeping that a mutation audit found unguarded: a probe task's id follows its
prompt file's content (so `--resume` reruns changed prompts), and the adaptive-seed rounds grow exactly the
undecided levels, to exactly the design's next look, for exactly as many rounds as the cap allows."""

import dataclasses
import hashlib
import statistics

import pandas as pd

from mismatch.opd import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.probes.runs import ProbeConfig
from mismatch.sweep import task_id
from mismatch.sweep.decide import next_round, rounds
from mismatch.sweep.tasks import execute, pending_tasks
from mismatch.analysis.sequential import DEFAULT_DESIGN
from mismatch.verdict import DEFAULT_TOLERANCE
from tests.conftest import opd_rows


def test_changed_prompts_under_the_same_file_name_are_a_new_task_that_resume_runs(tmp_path):
    """Three probe tasks read `prompts.txt` from three folders: two hold the same lines, one other lines.
    After a real `execute` of the first, `pending_tasks(resume=True)` skips the same content elsewhere (the
    path is not hashed) and runs the changed one (its content is) — whatever the golden ids say."""
    lines = {"a": "hello world, again\nthe quick brown fox\n", "b": "hello world, again\nthe quick brown fox\n",
             "c": "hello world, again\na slow green turtle\n"}
    tasks = {}
    for folder, text in lines.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "prompts.txt").write_text(text)
        tasks[folder] = ProbeConfig(reference="tiny-llama", perturb=("noise:0.01",),
                                    prompts=str(tmp_path / folder / "prompts.txt"), per_layer=False)
    digest = {f: hashlib.sha256((tmp_path / f / "prompts.txt").read_bytes()).hexdigest() for f in lines}
    assert digest["a"] == digest["b"] != digest["c"]  # the premise: same name, same / other content
    assert task_id(tasks["a"]) == task_id(tasks["b"]) != task_id(tasks["c"])
    out = tmp_path / "out"
    assert execute(tasks["a"], out, threads=1)["status"] == "done"
    todo, skipped = pending_tasks(list(tasks.values()), out, resume=True, retry_failed=False, threads=1)
    assert todo == [tasks["c"]] and skipped == {task_id(tasks["a"]): "done"}
    everything = list(tasks.values())
    assert pending_tasks(everything, out, resume=False, retry_failed=False, threads=1)[0] == everything


# ---------------------------------------------------------------- 3. the adaptive-seed rounds

BASE = OPDConfig(pair="sort-gpt2", steps=2, batch_size=4)
CAP = 10
ACC_LIMIT, KL_LIMIT = -DEFAULT_TOLERANCE.acc_tol, 1 + DEFAULT_TOLERANCE.kl_tol


def _run(config: OPDConfig, acc: float, kl: float) -> pd.DataFrame:
    """A finished run's rows as `mismatch.opd.runs` writes them (`tidy(… .assign(level="step"), kind="opd",
    config=run_columns(config))`, runs.py), with the held-out metrics `mismatch.opd.evaluate.evaluate` records."""
    values = {"heldout_rkl": {0: 2.0, 2: kl}, "heldout_expected_accuracy": {0: 0.25, 2: acc}, "mismatch_kl": {1: 0.01}}
    return opd_rows(config, values, columns=run_columns)


# per level, per seed: (Δ accuracy in points, KL ratio); the clean twins end at 40% and KL 1.0
PLANNED = {
    "fp8-e4m3": [(0.1, 1.0), (-0.2, 1.0), (0.0, 1.0)],  # both intervals within: tolerated
    "stale:1": [(-0.5, 1.0), (-2.5, 1.0), (-1.0, 1.0)],  # Δ straddles −2
    "stale:2": [(0.8, 1.0), (-0.2, 1.0), (-1.2, 1.0)],  # Δ straddles too: the same next look, whatever its distance
    "stale:4": [(-8.0, 1.0), (-7.8, 1.3), (-8.2, 1.05)],  # Δ wholly beyond (not tolerated); its KL straddles
    "stale:8": [(-7.0, 1.0)],  # one seed: before the first look
}
ROUND_1 = {"stale:1": [(-3.0, 1.0), (0.5, 1.0), (-2.0, 1.0)], "stale:2": [(-0.3, 1.0), (-0.1, 1.0), (-0.2, 1.0)],
           "stale:8": [(-8.0, 1.0), (-7.5, 1.0)]}
ROUND_2 = {"stale:1": [(-1.5, 1.0), (-2.2, 1.0), (-0.9, 1.0), (-1.8, 1.0)]}
LOOKS = (3, 6, 10, 16)  # the design's looks (docs/sweeps.md); CAP 10 stops at the third


def _interval(values: list[float]) -> tuple[float, float]:
    """Mean and the design's half-width at the look n seeds reach, with the level's own sd (no A/A level
    in these data): `Design.critical`, checked against an independent computation in tests/analysis/test_sequential.py."""
    n = len(values)
    return statistics.fmean(values), DEFAULT_DESIGN.half_width(statistics.stdev(values), n, n - 1)


def _undecided(per_seed: list[tuple[float, float]]) -> bool:
    """Whether the level is undecided: not both intervals within, and neither wholly beyond (one seed:
    no interval, undecided)."""
    if len(per_seed) < 3:
        return True
    acc, kl = _interval([d / 100 for d, _ in per_seed]), _interval([k for _, k in per_seed])
    beyond = acc[0] + acc[1] < ACC_LIMIT or kl[0] - kl[1] > KL_LIMIT
    within = acc[0] - acc[1] >= ACC_LIMIT and kl[0] + kl[1] <= KL_LIMIT
    return not (beyond or within)


def _target(per_seed: list[tuple[float, float]], cap: int = CAP) -> int | None:
    """The seeds after the round, by the module's rule (decide.py docstring): the next look, if within the cap."""
    return next((n for n in LOOKS if n > len(per_seed) and n <= cap), None)


def _dataset(levels: dict[str, list[tuple[float, float]]]) -> tuple[list[OPDConfig], pd.DataFrame]:
    """Every seed's run of each level and its clean twin (every seed any level has)."""
    seeds = range(max(len(v) for v in levels.values()))
    configs = [dataclasses.replace(BASE, seed=s) for s in seeds]
    frames = [_run(c, 0.40, 1.0) for c in configs]
    for rollout, per_seed in levels.items():
        for seed, (delta, ratio) in enumerate(per_seed):
            configs.append(dataclasses.replace(BASE, rollout=rollout, seed=seed))
            frames.append(_run(configs[-1], 0.40 + delta / 100, ratio))
    return configs, pd.concat(frames, ignore_index=True)


def _key(rollout: str) -> tuple:
    return ("sort-gpt2", "stale", "default", int(rollout.split(":")[1]))


def _merged(*stages: dict) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list] = {}
    for stage in stages:
        for rollout, per_seed in stage.items():
            out[rollout] = [*out.get(rollout, []), *per_seed]
    return out


def test_a_round_grows_exactly_the_undecided_levels_by_the_documented_count():
    """Round 1 after the plan: the levels whose intervals (computed here) reach a threshold get the next
    look's seeds — stale:1 and stale:2 3 → 6 (however far each is from resolving), stale:8 1 → 3 — and
    neither the tolerated fp8 level nor stale:4, not tolerated on accuracy though its KL interval
    straddles, gets any; each new seed comes with its clean twin unless that twin is planned already."""
    grows = {r: _target(v) for r, v in PLANNED.items() if _undecided(v)}
    assert grows == {"stale:1": 6, "stale:2": 6, "stale:8": 3}  # the premise, from the intervals alone
    kl4 = _interval([k for _, k in PLANNED["stale:4"]])
    assert not _undecided(PLANNED["stale:4"]) and kl4[1] > abs(kl4[0] - KL_LIMIT)  # decided, though its KL straddles
    configs, rows = _dataset(PLANNED)
    step = next_round(configs, rows, max_seeds=CAP)
    assert sorted(step.levels) == sorted((_key(r), len(PLANNED[r]), n) for r, n in grows.items())
    new = {dataclasses.replace(BASE, rollout=r, seed=s) for r, n in grows.items() for s in range(len(PLANNED[r]), n)}
    new |= {c.clean() for c in new} - set(configs)
    assert len(step.runs) == len(set(step.runs)) and set(step.runs) == new


def test_the_rounds_go_on_until_every_level_is_decided_or_at_the_cap():
    """Replayed from disk: round 1's runs ended leave stale:1 undecided at six seeds, so round 2 takes it to
    the next look within the cap (6 → 10) and nothing else; round 2's runs ended, no round 3 (at the cap).
    The replay judges every level on the runs on disk, as the reports do: stale:2 and stale:8, decided by
    round 1's runs, are in no replayed round (their runs are done). With a cap of 7 there is no round 2: the
    next look (10) is past it."""
    configs, rows = _dataset(PLANNED)
    after_1 = _merged(PLANNED, ROUND_1)
    assert {r for r, v in after_1.items() if _undecided(v)} == {"stale:1"} and _target(after_1["stale:1"]) == CAP
    _, rows_1 = _dataset(after_1)
    round_1 = next_round(configs, rows, max_seeds=CAP).runs
    ledger = {task_id(c): {"status": "done"} for c in (*configs, *round_1)}
    everything, found = rounds(configs, rows_1, ledger, max_seeds=CAP)
    assert [r.levels for r in found] == [((_key("stale:1"), 3, 6),), ((_key("stale:1"), 6, CAP),)]
    assert set(found[0].runs) == {c for c in round_1 if c.rollout in ("none", "stale:1") and 3 <= c.seed < 6}
    assert found[1].levels == ((_key("stale:1"), 6, CAP),)
    assert set(found[1].runs) == {dataclasses.replace(BASE, rollout=r, seed=s) for s in range(6, CAP)
                                  for r in ("none", "stale:1")}
    after_2 = _merged(after_1, ROUND_2)
    assert _undecided(after_2["stale:1"])  # still undecided at the cap: reported so, no more seeds
    _, rows_2 = _dataset(after_2)
    ledger |= {task_id(c): {"status": "done"} for c in found[1].runs}
    final, found_2 = rounds(configs, rows_2, ledger, max_seeds=CAP)
    assert [r.levels for r in found_2] == [r.levels for r in found] and set(final) == set(everything)
    assert _target(after_1["stale:1"], cap=7) is None
    _, found_7 = rounds(configs, rows_1, ledger, max_seeds=7)
    assert len(found_7) == 1 and found_7[0].runs == found[0].runs
