"""Pins on published OPD numbers that a mutation audit found unguarded: the noise copy re-drawn at each
refresh, the rollout copy's KL averaged after step 0, the noise floor over finished clean runs only, and
gradient clipping in the update. Each expected value is recomputed here from its definition."""

import copy
import dataclasses
import math
import statistics

import pandas as pd
import pytest
import torch

from mismatch.opd.config import OPDConfig
from mismatch.rollout.copy import RolloutCopy
from mismatch.analysis.tolerance import level_table, noise_floor, run_table
from mismatch.opd.trainer import loss_backward, sample_rollouts, score_with_teacher, setup, update
from mismatch.analysis.twins import verdict_table
from tests.conftest import opd_rows

U32, U64 = 2.0 ** -24, 2.0 ** -53  # unit roundoffs of float32 and float64

# ---------------------------------------------------------------- 1. noise re-drawn at every refresh

SIGMA, SEED = 0.05, 11
TARGET = "model.layers.0.mlp.down_proj"  # one weight tensor in scope: its ε is the generator's first draw
SCOPE = r"layers\.0\.mlp\.down_proj$"


def _noised(w: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W + σ·rms(W)·ε in float64 (DESIGN.md `noise:SIGMA`), ε ~ N(0, 1) the first draw of a CPU generator
    seeded `seed` (`mismatch.perturb.native._apply_noise_`), and the float32 rounding bound of the code's
    computation: rms from a float32 sum of n squares (relative error ≤ (n + 3)·u with the mean and √),
    two products and one sum (u each)."""
    eps = torch.randn(w.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).double()
    w64 = w.double()
    noise = SIGMA * w64.pow(2).mean().sqrt() * eps
    tol = noise.abs() * (w.numel() + 5) * U32 + (w64 + noise).abs() * U32
    return w64 + noise, tol


def _fake_step_(model: torch.nn.Module, step: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * step)


@pytest.mark.parametrize("k", [0, 2])
def test_a_noise_copy_is_the_served_weights_plus_noise_drawn_with_seed_plus_their_version(tiny, k):
    """`RolloutCopy`: noise is re-drawn with `seed + version` of the weights it serves (ring.py docstring),
    so a stale copy of version v is exactly the K = 0 copy of step v — never the new weights with the
    first refresh's ε (a draw not re-seeded), nor the previous copy (not re-noised)."""
    student = copy.deepcopy(tiny("tiny-llama").model)
    saved = [{n: t.clone() for n, t in student.state_dict().items()}]
    ring = RolloutCopy(student, f"noise:{SIGMA}", k, layers=SCOPE, seed=SEED)
    previous = ring.model.get_submodule(TARGET).weight.detach().clone()
    for step in range(1, 5):
        _fake_step_(student, step)
        saved.append({n: t.clone() for n, t in student.state_dict().items()})
        ring.refresh()
        served = max(0, step - k)
        assert ring.served_version == served
        got = ring.model.get_submodule(TARGET).weight.detach().double()
        want, tol = _noised(saved[served][f"{TARGET}.weight"], SEED + served)
        assert bool(((got - want).abs() <= tol).all()), (step, float((got - want).abs().max()))
        if served > 0:
            first, _ = _noised(saved[served][f"{TARGET}.weight"], SEED)  # new weights, the first draw again
            assert float((got - first).abs().max()) > float(tol.max()), step
            assert not torch.equal(got.float(), previous), step
        previous = got.float()
        for name, tensor in ring.model.state_dict().items():  # outside the scope: the served weights exactly
            if name != f"{TARGET}.weight":
                assert torch.equal(tensor, saved[served][name]), (step, name)


# ---------------------------------------------------------------- rows shaped as a run writes them

BASE = OPDConfig(pair="sort-gpt2", steps=4, batch_size=4, eval_every=2)


def _rows(config: OPDConfig, metrics: dict[str, dict[int, float]]) -> pd.DataFrame:
    """A run's tidy rows: `{"step", "metric", "value"}` per step (`trainer.train`'s `emit`, step 0 from
    `initial_evaluation` and `probe_copy`), `level="step"`, through `mismatch.results.tidy` as
    `mismatch.opd.runs` writes them (runs.py `tidy(pd.DataFrame(rows).assign(level="step"), kind="opd", …)`)."""
    return opd_rows(config, metrics)


def _finished(acc: float, kl: float, copy_kl: dict[int, float] | None = None) -> dict[str, dict[int, float]]:
    out = {"heldout_rkl": {0: 2.0, 2: 1.5, 4: kl}, "heldout_expected_accuracy": {0: 0.25, 2: 0.3, 4: acc},
           "mismatch_kl": {1: 0.01, 2: 0.02, 3: 0.01, 4: 0.02}}
    return {**out, "copy_kl_fwd_mean": copy_kl} if copy_kl else out


# ---------------------------------------------------------------- 4. copy_kl_fwd_mean after step 0

COPY_KL = {0: {0: 0.90, 2: 0.10, 4: 0.30}, 1: {0: 0.70, 2: 0.20, 4: 0.60}}  # seed → step → probed KL (nats)


def test_the_copy_kl_is_averaged_over_the_evaluations_after_step_0():
    """`copy_kl_fwd_mean` of a run: the mean over its evaluations at steps > 0 (`verdict_table`'s docstring);
    a level's: the mean of its seeds' (`level_table`) — recomputed here from the raw rows."""
    frames = []
    for seed, by_step in COPY_KL.items():
        frames.append(_rows(dataclasses.replace(BASE, seed=seed), _finished(0.40, 1.0)))
        frames.append(_rows(dataclasses.replace(BASE, seed=seed, rollout="noise:0.1"), _finished(0.40, 1.0, by_step)))
    rows = pd.concat(frames, ignore_index=True)
    per_run = {seed: statistics.fmean(v for s, v in by_step.items() if s > 0) for seed, by_step in COPY_KL.items()}
    assert per_run == {0: pytest.approx(0.20), 1: pytest.approx(0.40)}  # the premise: step 0 would move both
    table = verdict_table(rows).set_index("seed")
    noisy = table[~table["clean"]]
    for seed, want in per_run.items():
        assert noisy.loc[seed, "copy_kl_fwd_mean"] == pytest.approx(want, rel=4 * U64)  # float64 sums of ≤ 3
    assert table[table["clean"]]["copy_kl_fwd_mean"].isna().all()  # the student probes nothing against itself
    (level,) = level_table(run_table(rows)).to_dict("records")
    assert level["copy_kl_fwd_mean"] == pytest.approx(statistics.fmean(per_run.values()), rel=8 * U64)


# ---------------------------------------------------------------- 5. the noise floor: finished clean runs only

def test_the_noise_floor_counts_only_clean_runs_that_reached_their_last_step():
    """Three finished clean seeds and one whose rows stop at step 2 of 4 (killed mid-way): the floor's clean
    seeds, mean and sd are those of the three finished runs' final values, by `statistics`."""
    finished = {0: (0.40, 1.00), 1: (0.44, 1.02), 2: (0.37, 1.05)}
    frames = [_rows(dataclasses.replace(BASE, seed=s), _finished(acc, kl)) for s, (acc, kl) in finished.items()]
    stopped = {m: {s: v for s, v in by_step.items() if s <= 2} for m, by_step in _finished(0.10, 3.0).items()}
    frames.append(_rows(dataclasses.replace(BASE, seed=3), stopped))
    runs = run_table(pd.concat(frames, ignore_index=True))
    assert runs.set_index("seed").loc[3, "complete"] == False  # noqa: E712 - the premise: seed 3 is unfinished
    floor = noise_floor(runs, level_table(runs)).iloc[0]
    acc, kl = [100 * a for a, _ in finished.values()], [k for _, k in finished.values()]
    assert floor["clean_seeds"] == 3
    for column, values in (("clean_accuracy", acc), ("clean_heldout_rkl", kl)):
        mean, sd = statistics.fmean(values), statistics.stdev(values)  # exact (fractions), then rounded
        assert floor[column] == pytest.approx(mean, rel=8 * U64)
        # float64 variance of n values: relative error ≤ (n + 3)·u·mean²/var (the cancellation in Σ(x − x̄)²)
        assert floor[f"{column}_sd"] == pytest.approx(sd, rel=(len(values) + 3) * U64 * mean ** 2 / sd ** 2)


# ---------------------------------------------------------------- 6. gradient clipping in the update

def test_the_update_clips_the_gradient_to_the_configured_max_norm():
    """One real OPD update of sort-gpt2 (4 prompts): the gradient AdamW steps with is the raw gradient
    scaled by min(1, max_norm / (‖g‖₂ + 1e-6)) (`torch.nn.utils.clip_grad_norm_`'s definition, max_norm
    `OPDConfig.grad_clip`), the raw one recomputed on a copy of the student. The raw norm is ~65 at this
    step, so unclipped gradients would be ~65× too large. Tolerance: torch's float32 norm of per-tensor
    norms, relative error ≤ (largest tensor + tensors + 4)·u, against a float64 norm here."""
    config = OPDConfig(pair="sort-gpt2", steps=3, batch_size=4, train_prompts=16, eval_prompts=4)
    run = setup(config)
    model = run.student.model
    rollout, teacher_batch = sample_rollouts(run, run.rng.sample(run.train_pool, config.batch_size), 1)
    teacher_hidden_ND = score_with_teacher(run, teacher_batch)
    twin = copy.deepcopy(model)  # the same weights: the same raw gradient, bit for bit
    loss_backward(twin, run.pair.teacher.model, rollout.batch, teacher_hidden_ND,
                  None, loss=config.loss, tis_cap=config.tis_cap,  # the student sampled: its own log-probs
                  chunk_tokens=config.chunk_tokens, temperature=config.temperature, top_p=config.top_p)
    raw = {n: p.grad.double() for n, p in twin.named_parameters() if p.grad is not None}
    raw_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in raw.values()))
    coef = min(1.0, config.grad_clip / (raw_norm + 1e-6))
    rel = (max(g.numel() for g in raw.values()) + len(raw) + 4) * U32
    _, grad_norm, _ = update(run, rollout, teacher_hidden_ND)
    assert raw_norm > 10 * config.grad_clip  # the premise: this step's gradient is clipped
    assert grad_norm == pytest.approx(raw_norm, rel=rel)  # the logged norm is the raw one
    seen = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    assert seen.keys() == raw.keys()
    assert math.sqrt(sum(float(g.pow(2).sum()) for g in seen.values())) <= config.grad_clip * (1 + rel)
    for name, g in raw.items():
        want = g * coef
        assert bool(((seen[name] - want).abs() <= want.abs() * (rel + U32)).all()), name
