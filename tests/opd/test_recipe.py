"""The OPD recipe: exact identities under no mismatch, learning on a synthetic pair, bad input."""

import dataclasses

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.cli import app
from mismatch.opd import OPDConfig, train
from mismatch.opd.losses import tis_weights
from mismatch.opd.recipe import loss_backward, teacher_hidden
from mismatch.rollout import sample

runner = CliRunner()
SHORT = dict(pair="reverse-qwen3", steps=3, batch_size=8, eval_every=3, eval_prompts=16, train_prompts=256)


def _by(rows, metric):
    return {r["step"]: r["value"] for r in rows if r["metric"] == metric}


def test_identical_policies_give_unit_tis_weights_and_zero_mismatch():
    pair = mismatch.load_pair("reverse-qwen3")
    rollout = sample(pair.student, pair.prompts("train", 16), max_new_tokens=13, seed=2)
    batch = rollout.batch
    logp_r = rollout.logprobs[batch.response_mask.bool()]
    res = loss_backward(pair.student.model, pair.teacher.model, batch, teacher_hidden(pair.teacher.model, batch),
                        logp_r, loss="pg-rkl", tis_cap=2.0, chunk_tokens=1024)
    assert torch.equal(res.logp_student, logp_r)  # bit for bit: one code path for both policies
    assert torch.equal(tis_weights(res.logp_student, logp_r, 2.0), torch.ones_like(logp_r))
    rows = train(OPDConfig(**SHORT, tis_cap=2.0))
    for metric in ("mismatch_kl", "mismatch_k3", "mismatch_logp_abs_diff_mean", "mismatch_logp_abs_diff_max",
                   "mismatch_is_ratio_outside_frac", "mismatch_chi2_token"):
        assert set(_by(rows, metric).values()) == {0.0}, metric


def test_stale_zero_reproduces_the_clean_run_bit_for_bit():
    clean = train(OPDConfig(**SHORT))
    stale0 = train(OPDConfig(**SHORT, rollout="stale:0"))
    timing = {"rollout_s", "teacher_s", "update_s", "refresh_s", "wall_s", "tokens_per_s"}
    strip = lambda rows: [r for r in rows if r["metric"] not in timing]  # noqa: E731
    assert strip(clean) == strip(stale0)
    again = train(OPDConfig(**SHORT))
    assert strip(again) == strip(clean)  # same config and seed, same numbers


def test_stale_run_serves_old_weights_and_differs():
    rows = train(OPDConfig(**{**SHORT, "steps": 4}, rollout="stale:2"))
    # step s samples with the weights of optimizer step s − 1 − K (the initial ones until then)
    assert _by(rows, "served_version") == {1: 0, 2: 0, 3: 0, 4: 1}
    assert _by(rows, "mismatch_logp_abs_diff_max")[1] == 0.0  # step 1: still the same weights
    assert _by(rows, "mismatch_logp_abs_diff_max")[3] > 0.0


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="staleness must be ≥ 0"):
        OPDConfig(pair="sort-gpt2", staleness=-1)
    with pytest.raises(ValueError, match="unknown loss 'kl'"):
        OPDConfig(pair="sort-gpt2", loss="kl")
    with pytest.raises(ValueError, match="unknown perturbation kind"):
        OPDConfig(pair="sort-gpt2", rollout="fp9")
    res = runner.invoke(app, ["opd", "--pair", "sort-gpt2", "--staleness", "-1"])
    assert res.exit_code == 2 and res.output.startswith("error: staleness must be ≥ 0")
    res = runner.invoke(app, ["opd", "--pair", "sort-gpt2", "--loss", "kl"])
    assert res.exit_code == 2 and "unknown loss" in res.output and res.output.count("\n") == 1


def test_interrupted_run_keeps_its_rows(tmp_path, monkeypatch):
    from mismatch.opd import recipe

    calls = {"n": 0}
    real = recipe.loss_backward

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(recipe, "loss_backward", failing)
    out = tmp_path / "run"
    res = runner.invoke(app, ["opd", "--pair", "reverse-qwen3", "--steps", "5", "--batch-size", "4",
                              "--eval-prompts", "8", "--out", str(out)])
    assert res.exit_code != 0
    rows = pd.read_parquet(out / "metrics.parquet")
    assert sorted(rows["step"].unique()) == [0, 1, 2]  # the evaluation at 0 and two finished steps
    assert set(rows["pair"]) == {"reverse-qwen3"} and "git_sha" in rows


def test_clean_run_lowers_heldout_reverse_kl():
    """Measured: 7.65 → 6.84 nats after 30 steps (full-rkl, lr 1e-4, 128 prompts/step). Accuracy does
    not rise yet on this pair (README, "Not done yet"), so only the KL is asserted."""
    rows = train(OPDConfig(pair="reverse-qwen3", loss="full-rkl", lr=1e-4, steps=30, batch_size=128,
                           eval_every=30, eval_prompts=128))
    kl = _by(rows, "heldout_rkl")
    assert set(kl) == {0, 30}
    assert kl[30] <= 0.95 * kl[0]
    assert all(r["value"] > 0 for r in rows if r["metric"] == "grad_norm")
