"""Adaptive seeds: the seed count a round asks for (against a brute-force search), rounds judged from
hand-made results (only undecided levels grow, each new seed with its clean twin, capped), rounds
replayed from disk, and a real study run with `decide` end to end."""

import dataclasses
import math
import statistics

import pandas as pd
import pytest
from typer.testing import CliRunner

from mismatch.cli.app import app
from mismatch.opd import OPDConfig
from mismatch.opd.runs import run_columns
from mismatch.opd.tolerance import level_table, run_table
from mismatch.results import read_results, tidy
from mismatch.sweep import load_study, read_ledger, run_study, task_id
from mismatch.sweep.decide import next_round, next_seed_count, rounds
from tests.opd.test_tolerance import STAMP, _t975_by_bisection

BASE = OPDConfig(pair="sort-gpt2", steps=2, batch_size=4)


def _half(n: int, sd: float) -> float:
    return _t975_by_bisection(n - 1) * sd / math.sqrt(n)


@pytest.mark.parametrize("seeds, distance, sd, cap", [(3, 0.5, 1.0, 10), (3, 2.0, 1.0, 10), (4, 0.9, 1.0, 10),
                                                      (6, 0.3, 0.5, 8), (5, 10.0, 1.0, 10)])
def test_next_seed_count_is_the_smallest_count_that_resolves_the_distance(seeds, distance, sd, cap):
    """By brute force: the smallest n whose t half-width is below the distance, within [n + 2, 2n] and the cap."""
    need = next(n for n in range(2, 10_000) if _half(n, sd) < distance)
    want = min(cap, max(seeds + 2, min(need, 2 * seeds)))
    assert next_seed_count(seeds, [(distance, sd)], cap) == want
    assert next_seed_count(1, [], cap) == 3 and next_seed_count(3, [(distance, sd)], 4) <= 4


def _run(config: OPDConfig, acc: float, kl: float = 1.0) -> pd.DataFrame:
    rows = [{"step": 0, "metric": "heldout_rkl", "value": 2.0}, {"step": 2, "metric": "heldout_rkl", "value": kl},
            {"step": 0, "metric": "heldout_accuracy", "value": 0.25}, {"step": 2, "metric": "heldout_accuracy", "value": acc},
            {"step": 1, "metric": "mismatch_kl", "value": 0.01}]
    return tidy(pd.DataFrame(rows).assign(level="step"), kind="opd", config=run_columns(config), stamp=STAMP)


# Δ accuracy per seed (points): fp8 clearly within −2, stale:1 straddling it, stale:4 wholly beyond
DELTAS = {"fp8-e4m3": [0.1, -0.2, 0.0], "stale:1": [-0.5, -2.5, -1.0], "stale:4": [-8.0, -7.0, -9.0]}


def _rows(deltas: dict[str, list[float]], seeds=range(3)) -> tuple[list[OPDConfig], pd.DataFrame]:
    configs, frames = [], []
    for seed in seeds:
        clean = dataclasses.replace(BASE, seed=seed)
        configs.append(clean)
        frames.append(_run(clean, 0.40))
        for rollout, per_seed in deltas.items():
            if seed < len(per_seed):
                run = dataclasses.replace(BASE, rollout=rollout, seed=seed)
                configs.append(run)
                frames.append(_run(run, 0.40 + per_seed[seed] / 100))
    return configs, pd.concat(frames, ignore_index=True)


def test_a_round_grows_only_the_undecided_levels_with_their_clean_twins():
    configs, rows = _rows(DELTAS)
    levels = level_table(run_table(rows)).set_index("level")
    assert levels["verdict"].to_dict() == {"fp8-e4m3:channel": "tolerated", 1: "uncertain", 4: "not tolerated"}
    step = next_round(configs, rows, max_seeds=10)
    sd = statistics.stdev(d / 100 for d in DELTAS["stale:1"])
    distance = abs(statistics.fmean(d / 100 for d in DELTAS["stale:1"]) + 0.02)
    target = next_seed_count(3, [(distance, sd)], 10)
    assert target == 6  # −1.3 ± 2.6 points: far from resolved, so the round doubles
    assert step.levels == ((("sort-gpt2", "stale", "default", 1), 3, target),)
    new = [dataclasses.replace(BASE, seed=s, rollout=r) for s in range(3, target) for r in ("none", "stale:1")]
    assert sorted(step.runs, key=repr) == sorted(new, key=repr)  # each new seed with its clean twin, nothing else
    assert next_round(configs, rows, max_seeds=3).runs == ()  # at the cap: undecided at 3 seeds, no round
    capped = next_round(configs, rows, max_seeds=4)
    assert {c.seed for c in capped.runs} == {3} and capped.levels[0][2] == 4


def test_rounds_replay_from_disk_and_stop_when_every_level_is_decided():
    """Round 1's runs on disk and in the ledger: the replay takes round 1, judges it, and finds no round
    2 once stale:1 is decided; with round 1 not yet run, the replay returns it as the round to run."""
    configs, rows = _rows(DELTAS)
    ledger = {task_id(c): {"status": "done"} for c in configs}
    planned, found = rounds(configs, rows, {}, max_seeds=10)  # nothing ended in the ledger: the plan first
    assert planned == tuple(configs) and found == []
    everything, found = rounds(configs, rows, ledger, max_seeds=10)
    assert len(found) == 1 and set(everything) == set(configs) | set(found[0].runs)
    # round 1 on disk: three more seeds of stale:1 → −1.2 ± 0.7 points over six: decided (tolerated)
    more = {"stale:1": [*DELTAS["stale:1"], -1.0, -0.8, -1.2]}
    _, rows2 = _rows(more, seeds=range(6))
    rows2 = pd.concat([rows2, rows[rows["rollout"] != "stale:1"]]).drop_duplicates(["run_id", "step", "metric"])
    ledger2 = {**ledger, **{task_id(c): {"status": "done"} for c in found[0].runs}}
    again, found2 = rounds(configs, rows2, ledger2, max_seeds=10)
    assert len(found2) == 1 and set(again) == set(everything)  # round 1 replayed, no round 2
    assert level_table(run_table(rows2)).set_index("level").loc[1, "verdict"] == "tolerated"
    failed = {**ledger, **{task_id(c): {"status": "failed"} for c in found[0].runs}}  # a failed round ends them
    again, found3 = rounds(configs, rows, failed, max_seeds=10)
    assert len(found3) == 1 and set(again) == set(everything)  # neither retried nor replaced: no round 2


STUDY = """
name = "decide"
decide = true
max_seeds = 3

[dynamic]
pairs = ["reverse-qwen3"]
rollouts = ["noise:0.05"]
seeds = [0]

[dynamic.settings]
steps = 2
batch_size = 4
eval_every = 2
eval_prompts = 8
"""


@pytest.mark.slow
def test_a_study_with_decide_adds_seeds_until_the_cap_and_the_dry_run_shows_the_round(tmp_path):
    path = tmp_path / "decide.toml"
    path.write_text(STUDY)
    study, out = load_study(path), tmp_path / "out"
    assert study.decide and study.max_seeds == 3 and len(study.plan.opd) == 2
    first = run_study(study, out, decide=False)  # the plan alone: one seed, undecided
    assert len(first.ran) == 2
    dry = CliRunner().invoke(app, ["sweep", str(path), "--out", str(out), "--dry-run"], terminal_width=200)
    assert dry.exit_code == 0, dry.output
    assert "1 → 3" in dry.output and "seed 2" in dry.output  # the next round: seeds 1 and 2, with twins
    report = run_study(study, out, resume=True, decide=True, max_seeds=3)
    assert len(report.ran) == 4 and len(report.rounds) == 1
    rows = read_results(out)
    assert sorted(set(zip(rows["rollout"], rows["seed"]))) == [(r, s) for r in ("noise:0.05", "none") for s in range(3)]
    assert {r["status"] for r in read_ledger(out).values()} == {"done"}
    assert run_study(study, out, resume=True, decide=True, max_seeds=3).ran == ()  # at the cap: nothing more


def test_a_block_caps_its_own_levels_seeds(tmp_path):
    """`max_seeds` in a [dynamic] block: its levels stop there, the others at the study's cap."""
    path = tmp_path / "caps.toml"
    path.write_text(STUDY.replace('rollouts = ["noise:0.05"]', 'rollouts = ["noise:0.05"]\nmax_seeds = 2'))
    plan = load_study(path).plan
    (noisy,) = [c for c in plan.opd if not c.is_clean]
    assert plan.max_seeds(noisy, 10) == 2 and plan.max_seeds(dataclasses.replace(noisy, rollout="fp8-e4m3"), 10) == 10
    configs, rows = _rows(DELTAS)
    capped = next_round(configs, rows, max_seeds=lambda c: 4 if c.rollout == "stale:1" else 10)
    assert {c.seed for c in capped.runs} == {3} and capped.levels[0][2] == 4
