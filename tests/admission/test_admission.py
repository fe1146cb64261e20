"""The admission check on real (tiny random-init) models: its statistics against a direct recomputation,
the decision rules, the staleness carry-over, determinism and the CLI's exit codes."""

from mismatch.admission import CalibrationSettings, Pipeline  # noqa: F401
import json
import math

import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.admission import Thresholds, check
from mismatch.admission.lagged import TrainerSettings
from mismatch.admission.decision import decide
from mismatch.verdict import Verdict
from mismatch.cli.app import app
from mismatch.errors import InputError
from mismatch.model.loader import LM
from mismatch.model.generate import generate

PROMPTS = ["the cat sat", "a b c d e", "hello there", "sort 3 1 2"]


def _thresholds(limit, lagged=(), drift=None):
    return Thresholds(primary="mismatch_kl", limits={"mismatch_kl": limit}, brackets={"mismatch_kl": [0.0, 1.0]},
                      points=[], validation=[], lagged=list(lagged), provenance={"results": ["hand-made"]},
                      drift=drift or {})


def _direct_logprobs(model, batch):
    """log p(y_t) of each response token by one plain forward pass over the padded batch."""
    attn = batch.attention_mask
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=attn, position_ids=positions).logits.double()
    logp = logits.log_softmax(-1)[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return logp[batch.response_mask[:, 1:].bool()]


def _same_samples(lm, spec="noise:0.3", seed=3):
    """The check's calibration batch sampled again (same spec, prompts, length and seed), with each
    response token's log-prob under the model and under the rollout copy by plain forward passes."""
    with mismatch.perturbed(lm.model, spec, seed=seed) as cand:
        batch = generate(LM(cand, lm.tokenizer, "c"), PROMPTS, max_new_tokens=12, temperature=1.0, seed=seed)
        logp_rollout = _direct_logprobs(cand, batch)
    return batch, _direct_logprobs(lm.model, batch), logp_rollout


def test_statistics_equal_a_direct_recomputation_on_the_same_samples():
    lm = mismatch.load("tiny-llama")
    got = check(lm, "noise:0.3", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=12), thresholds={"mismatch_kl": 10.0}, seed=3)
    batch, logp_train, logp_rollout = _same_samples(lm)
    log_r = logp_train - logp_rollout
    assert got.calibration["tokens"] == len(log_r) == int(batch.response_mask.sum())
    assert got.metrics["mismatch_kl"] == pytest.approx(float((-log_r).mean()), rel=1e-5)
    assert got.metrics["train/token_mult_prob_error"] == pytest.approx(float(log_r.abs().exp().mean()), rel=1e-5)
    assert got.metrics["mismatch_kl"] > 0.01 and got.status == "admit"  # interval far below the limit 10
    assert got.decisions[0].low <= got.metrics["mismatch_kl"] <= got.decisions[0].high


def test_identical_rollouts_admit_and_a_large_mismatch_is_rejected():
    lm = mismatch.load("tiny-llama")
    same = check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=8), thresholds={"mismatch_kl": 1e-9}, presets=("slime", "nemo-rl"))
    assert same.metrics["mismatch_kl"] == 0.0 and same.metrics["train/token_mult_prob_error"] == 1.0
    assert same.status == "admit" and same.admitted and not same.violations
    broken = check(lm, "noise:2.0", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=8), thresholds={"mismatch_kl": 1e-3})
    assert broken.status == "reject" and broken.violations[0].low > 1e-3


def test_the_drift_margin_lowers_the_fitted_limit_and_answers_uncertain_between_the_two():
    """The fitted gate judged again at limit × margin: a first-step value admitted by the fitted limit but
    not by the lowered one is uncertain; admitted by both, admit; a source the drift never measured is said."""
    lm = mismatch.load("tiny-llama")
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=8)
    free = check(lm, "noise:0.3", calibration=cal, thresholds={"mismatch_kl": 10.0}, seed=3).decisions[0]
    assert free.low > 0  # the premise: an interval clear of 0, so a limit below it rejects
    for limit, margin, status in ((1.5 * free.high, 0.5, "uncertain"), (2 * free.high, 0.9, "admit")):
        drift = {"noise": {"levels": 4, "median": margin, "largest": 1.0, "margin": margin}}
        got = check(lm, "noise:0.3", calibration=cal, thresholds=_thresholds(limit, drift=drift), seed=3)
        fitted, margined = got.decisions[0], got.decisions[1]
        assert fitted.status == "admit" and margined.metric == "drift/mismatch_kl"
        assert margined.limit == pytest.approx(limit * margin) and margined.value == fitted.value
        assert margined.status == status == got.status
        assert any(n.startswith("drift margin:") and f"× {margin:.3g}" in n for n in got.notes)
    other = check(lm, "noise:0.3", calibration=cal, seed=3,
                  thresholds=_thresholds(2 * free.high, drift={"format": {"levels": 4, "median": 1.0, "largest": 1.0,
                                                                           "margin": 1.0}}))
    assert len(other.decisions) == 1 and any("measured no noise level's drift" in n for n in other.notes)
    # rejected by the fitted limit: a lower limit cannot change that, so no drift row (it would say "uncertain")
    drift = {"noise": {"levels": 4, "median": 0.5, "largest": 1.0, "margin": 0.5}}
    rejected = check(lm, "noise:0.3", calibration=cal, seed=3, thresholds=_thresholds(0.5 * free.low, drift=drift))
    assert rejected.status == "reject" and [d.metric for d in rejected.decisions] == ["mismatch_kl"]
    assert not any(n.startswith("drift margin:") for n in rejected.notes)


def test_the_reference_runs_in_the_trainers_precision():
    """`ref_dtype`: the model the check loads (and the copy made from it) in bf16; the same weights under no
    perturbation give exactly 0; a bad dtype is one clear error."""
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6)
    same = check("tiny-llama", "noise:0", calibration=cal, thresholds={"mismatch_kl": 1.0}, ref_dtype="bf16")
    assert same.calibration["ref_dtype"] == "bfloat16" and same.metrics["mismatch_kl"] == 0.0
    fp8 = {d: check("tiny-llama", "fp8-e4m3:channel", calibration=cal, thresholds={"mismatch_kl": 1.0}, ref_dtype=d)
           for d in ("fp32", "bf16")}
    assert fp8["fp32"].calibration["ref_dtype"] == "float32"
    assert fp8["bf16"].metrics["mismatch_kl"] != fp8["fp32"].metrics["mismatch_kl"]
    with pytest.raises(InputError, match="unknown dtype"):
        check("tiny-llama", "noise:0", calibration=cal, ref_dtype="fp64x")
    said = []  # a lag cannot be trained in fp16: refused before anything is loaded
    with pytest.raises(InputError, match="fp32 or bf16: not fp16"):
        check("tiny-llama", "noise:0", calibration=cal, teacher="tiny-llama", pipeline=Pipeline(staleness=1),
              ref_dtype="fp16", progress=said.append)
    assert said == []


def test_same_seed_same_answer_and_the_spec_scope_is_recorded():
    lm = mismatch.load("tiny-qwen3")
    a = check(lm, "fp8-e4m3:channel", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=8), layers="mlp", thresholds={"mismatch_kl": 1.0}, seed=5)
    b = check(lm, "fp8-e4m3:channel", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=8), layers="mlp", thresholds={"mismatch_kl": 1.0}, seed=5)
    assert a.metrics == b.metrics and a.decisions == b.decisions
    assert (a.rollout, a.layers) == ("fp8-e4m3:channel", "mlp")


def test_offloading_the_originals_changes_no_number_and_restores_the_weights(monkeypatch, tmp_path):
    """offload=True (what a checkpoint of 1 GiB or more gets by default) writes the replaced weights out while
    the rollout copy runs and reads them back: the same answer to the last bit, the same weights after."""
    import mismatch.perturb.snapshot as snapshot

    lm = mismatch.load("tiny-llama")
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    written = []
    real = snapshot.offload_
    monkeypatch.setattr(snapshot, "offload_", lambda snap, p: (written.append(p.numel() * snap.offload), real(snap, p)))
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=8)
    kept = check(lm, "fp8-e4m3:channel", calibration=cal, thresholds={"mismatch_kl": 1.0}, seed=5, offload=False)
    assert not any(written)
    out = check(lm, "fp8-e4m3:channel", calibration=cal, thresholds={"mismatch_kl": 1.0}, seed=5, offload=True)
    assert sum(written) == 2 * sum(p.numel() for n, p in lm.model.named_parameters() if n.endswith("proj.weight"))
    assert out.metrics == kept.metrics and out.status == kept.status
    assert all(torch.equal(p, before[n]) for n, p in lm.model.named_parameters())


def test_decision_rules():
    assert decide(0.1, 0.05, 0.2, 0.3) is Verdict.PASS and decide(0.5, 0.4, 0.6, 0.3) is Verdict.FAIL
    assert decide(0.3, 0.2, 0.4, 0.3) is Verdict.UNCERTAIN and decide(float("nan"), 0, 0, 1) is Verdict.UNCERTAIN


STUDIED = "loss full-rkl, lr 0.001, adam_beta1 0.9, tis_cap off"  # the study's settings text: TrainerSettings()'s
LAGGED = [{"pair": "sort-gpt2", "source": "stale", "settings": STUDIED, "level": k, "seeds": 3,
           "acc_delta": d, "acc_delta_hw": 0.01, "kl_ratio": 1.0, "kl_ratio_hw": 0.01, "verdict": v}
          for k, d, v in ((1, -0.001, "tolerated"), (2, -0.08, "not tolerated"))]


@pytest.mark.parametrize("k, status", [(0, "admit"), (1, "admit"), (2, "reject"), (4, "uncertain")])
def test_staleness_carries_over_the_study_verdict(k, status):
    lm = mismatch.load("tiny-llama")
    got = check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=4), pipeline=Pipeline(staleness=k), thresholds=_thresholds(1.0, LAGGED))
    assert got.status == status
    carried_notes = [n for n in got.notes if "calibration sequence" not in n]  # 4 prompts: also a small-set note
    assert len(carried_notes) == (k > 0) and (k == 0 or f"stale:{k}" in carried_notes[0])
    carried = [d for d in got.decisions if d.metric.startswith("study/")]  # it decides, so it is a decision
    assert [(d.metric, d.status) for d in carried] == ([] if k == 0 else [(f"study/stale:{k}", status)])
    assert got.to_dict()["decisions"][-1]["metric"] == (f"study/stale:{k}" if k else "mismatch_kl")
    if k:  # OPD's grammar: `stale:K` is the model itself, K steps behind — the same decisions, every statistic 0
        same = check(lm, f"stale:{k}", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=4),
                     thresholds=_thresholds(1.0, LAGGED))
        assert same.rollout == "none" and same.recipe is None and same.metrics["mismatch_kl"] == 0.0
        assert [(d.metric, d.status) for d in same.decisions] == [(d.metric, d.status) for d in got.decisions]


def test_a_lag_at_settings_no_study_ran_is_uncertain_and_says_which():
    """A carried-over verdict holds only for the settings it was measured at: at lr 3e-4 (or β1 0) the
    study's stale:1 verdict at lr 1e-3 says nothing, so the check is uncertain and names both."""
    lm = mismatch.load("tiny-llama")
    for trainer in (TrainerSettings(lr=3e-4), TrainerSettings(adam_beta1=0.0), TrainerSettings(loss="pg-rkl-is")):
        got = check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=4),
                    pipeline=Pipeline(staleness=1, trainer=trainer), thresholds=_thresholds(1.0, LAGGED))
        assert got.status == "uncertain" and got.decisions[-1].metric == "study/stale:1"
        assert f"no study covers {trainer.describe()}" in got.notes[-1] and STUDIED in got.notes[-1]


class _BothSplits:
    """PROMPTS as train and held-out prompts: `opd.train` evaluates at steps 0 and last (its own seeds)."""

    def count(self, split):
        return len(PROMPTS)

    def prompts(self, split, n, seed=0):
        return PROMPTS[:n]


def _trained_window_mean(student, teacher, ref_dtype: str = "fp32", rollout: str = "none", staleness: int = 2) -> float:
    """The check's pipeline (default: a stale:2 lag; lr 3e-2, seed 4, the PROMPTS) run through `opd.train` on
    `student`: the mean of the `mismatch_kl` it logs over the window the check measures (steps K+1 … K+WINDOW)."""
    from mismatch.admission.transfer import WINDOW
    from mismatch.opd.config import OPDConfig
    from mismatch.opd.trainer import train
    from mismatch.pairs.load import Pair

    config = OPDConfig(pair="check", rollout=rollout, staleness=staleness, lr=3e-2, warmup_steps=0, decay="constant",
                       steps=staleness + WINDOW, batch_size=4, seed=4, max_new_tokens=6, train_prompts=4, eval_probe=0,
                       eval_every=100, ref_dtype=ref_dtype)
    pair = Pair(name="check", student=student, teacher=teacher, task=None, prompt_source=_BothSplits(),
                max_new_tokens=6)
    logged = [r["value"] for r in train(config, pair=pair)
              if r["metric"] == "mismatch_kl" and staleness < r["step"] <= staleness + WINDOW]
    assert len(logged) == WINDOW
    return sum(logged) / WINDOW


def test_a_lag_is_measured_on_the_checkpoint_with_a_teacher_and_the_weights_are_restored():
    """With a teacher the check runs the pipeline's first K + WINDOW OPD steps (the study's step) and judges
    the window's mismatch_kl against the window limit; its value is the mean of what `opd.train` logs at those
    steps for the same run, a rate too small to move fp32 weights measures ~0, and the checkpoint's weights
    are the same bit for bit afterwards."""
    lm, teacher = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", seed=1)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    table = _thresholds(1.0, LAGGED)
    table.window_limits = {"mismatch_kl": 0.5}
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6, chat=False)
    got = check(lm, "stale:2", calibration=cal, pipeline=Pipeline(trainer=TrainerSettings(lr=3e-2)),
                thresholds=table, teacher=teacher, seed=4)
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    lag = got.decisions[-1]
    assert lag.metric == "measured/stale:2/window:mismatch_kl" and lag.limit == 0.5
    assert lag.low <= lag.value <= lag.high and lag.value > 1e-3  # lr 3e-2 moves a tiny model
    assert "measured on this checkpoint" in got.notes[-1] and "lr 0.03" in got.notes[-1]
    # the same run through opd.train on a copy of the checkpoint: the window's mean of its logged values
    assert lag.value == pytest.approx(_trained_window_mean(mismatch.load("tiny-llama"), teacher), rel=1e-6)
    still = check(lm, "stale:2", calibration=cal, pipeline=Pipeline(trainer=TrainerSettings(lr=1e-30)),
                  thresholds=table, teacher=teacher, seed=4)
    assert abs(still.decisions[-1].value) < 1e-5 and still.decisions[-1].status == "admit"


def test_each_gate_is_scaled_from_the_lengths_its_own_limit_was_fitted_at():
    """The window gate's length margin uses the window limit's lengths (`window_response_tokens`), the first-step
    gate's the first-step limits' (`response_tokens`); a thresholds file without the former falls back to the
    latter."""
    lm, teacher = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", seed=1)
    table = _thresholds(1.0, LAGGED)
    table.window_limits = {"mismatch_kl": 0.5}
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6, chat=False)
    kwargs = dict(calibration=cal, pipeline=Pipeline(trainer=TrainerSettings(lr=1e-30)), thresholds=table, seed=4)
    mean = (lambda c: c["tokens"] / c["sequences"])(check(lm, "stale:2", teacher=teacher, **kwargs).calibration)
    assert mean > 2
    table.response_tokens, table.window_response_tokens = [mean / 2, mean], [0.5, 1.0]  # the window's end at 2
    windowed = check(lm, "stale:2", teacher=teacher, **kwargs)
    (d,) = [d for d in windowed.decisions if d.metric.startswith("length/")]
    assert d.metric == "length/measured/stale:2/window:mismatch_kl" and d.limit == pytest.approx(0.5 * 2 / mean)
    first_step = check(lm, "noise:0", **kwargs)  # no teacher: the first-step gate, fitted within 2x of the mean
    assert not [d for d in first_step.decisions if d.metric.startswith("length/")]
    assert any("within 2x" in n for n in first_step.notes)
    table.window_response_tokens = []  # an older file: the first-step lengths
    older = check(lm, "stale:2", teacher=teacher, **kwargs)
    assert not [d for d in older.decisions if d.metric.startswith("length/")]
    assert any("within 2x" in n for n in older.notes)


def test_the_fitted_gate_is_the_trainers_losss_own_limit_and_its_lengths():
    """The first-step gate for `Pipeline.trainer.loss`: the loss's own limit (`Thresholds.loss_limits`) and the
    lengths it was fitted at where the study fitted one, the pooled limit and lengths for a loss without one."""
    lm = mismatch.load("tiny-llama")
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=12)
    table = _thresholds(10.0)
    table.response_tokens = [1.0, 1000.0]
    table.loss_limits = {"pg-rkl-is": {"limit": 5.0, "bracket": [4.0, 6.0], "levels": 4, "not_tolerated": 2,
                                       "response_tokens": [2.0, 3.0], "held_out_levels": 4, "held_out_right": 4,
                                       "always_admit_right": 2}}
    pg = check(lm, "noise:0.1", calibration=cal, thresholds=table,
               pipeline=Pipeline(trainer=TrainerSettings(loss="pg-rkl-is")))
    mean = pg.calibration["tokens"] / pg.calibration["sequences"]
    assert mean > 6 and pg.decisions[0].limit == 5.0 and "pg-rkl-is's levels alone" in pg.decisions[0].source
    (length,) = [d for d in pg.decisions if d.metric == "length/mismatch_kl"]  # from pg-rkl-is's 3 tokens, ×2
    assert length.limit == pytest.approx(5.0 * 6 / mean)
    full = check(lm, "noise:0.1", calibration=cal, thresholds=table)  # the default trainer: full-rkl
    assert full.decisions[0].limit == 10.0 and "no limit of full-rkl's own" in full.decisions[0].source
    assert not [d for d in full.decisions if d.metric.startswith("length/")]
    assert full.decisions[0].value == pg.decisions[0].value  # the same calibration, judged twice


def test_the_window_gate_is_the_trainers_losss_own_window_limit():
    """With a teacher the deciding gate — the pipeline's window statistic measured on the checkpoint — is judged
    against the trainer's loss's own window limit (`Thresholds.loss_window_limits`) where the study fitted one,
    against the pooled window limit for a loss without one — each with the response lengths that limit was
    fitted at (the length note), not the first-step limits' lengths."""
    lm, teacher = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", seed=1)
    table = _thresholds(1.0, LAGGED)
    table.window_limits = {"mismatch_kl": 0.5}
    table.response_tokens, table.window_response_tokens = [10.0, 20.0], [1.0, 3.0]
    table.loss_window_limits = {"pg-rkl-is": {"limit": 7.0, "bracket": [6.0, 8.0], "levels": 4, "not_tolerated": 2,
                                              "response_tokens": [1.0, 2.0], "held_out_levels": 0, "held_out_right": 0,
                                              "pooled_held_out_levels": 0, "pooled_held_out_right": 0,
                                              "always_admit_right": 0}}
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6, chat=False)
    reports = {loss: check(lm, "stale:1", calibration=cal, thresholds=table, teacher=teacher, seed=4,
                           pipeline=Pipeline(trainer=TrainerSettings(lr=3e-2, loss=loss)))
               for loss in ("pg-rkl-is", "full-rkl")}
    got = {loss: r.decisions[-1] for loss, r in reports.items()}
    assert all(d.metric == "measured/stale:1/window:mismatch_kl" for d in got.values())
    assert got["pg-rkl-is"].limit == 7.0 and "pg-rkl-is's levels alone" in got["pg-rkl-is"].source
    assert got["full-rkl"].limit == 0.5 and "no limit of full-rkl's own" in got["full-rkl"].source
    fitted_at = {loss: [n for n in r.notes if "the limits were fitted at" in n] for loss, r in reports.items()}
    assert len(fitted_at["pg-rkl-is"]) == len(fitted_at["full-rkl"]) == 1
    assert "fitted at 1–2 tokens" in fitted_at["pg-rkl-is"][0] and "fitted at 1–3 tokens" in fitted_at["full-rkl"][0]


def test_a_lag_is_measured_in_the_trainers_precision():
    """A bf16 checkpoint's lag is measured as a bf16 trainer runs it (`OPDConfig.ref_dtype`: fp32 masters under
    the bf16 weights, the teacher in bf16): the value is the window's mean of what `opd.train` logs for the same
    bf16 run, not the fp32 run's; the checkpoint and a teacher given in fp32 are the same bit for bit (and in
    their own dtype) afterwards."""
    lm, teacher = mismatch.load("tiny-llama", dtype="bf16"), mismatch.load("tiny-llama", seed=1)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    teacher_before = {k: v.clone() for k, v in teacher.model.state_dict().items()}
    table = _thresholds(1.0, LAGGED)
    table.window_limits = {"mismatch_kl": 0.5}
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6, chat=False)
    got = check(lm, "stale:2", calibration=cal, pipeline=Pipeline(trainer=TrainerSettings(lr=3e-2)),
                thresholds=table, teacher=teacher, seed=4)
    for model, saved in ((lm.model, before), (teacher.model, teacher_before)):
        state = model.state_dict()
        assert all(torch.equal(saved[k], v) and saved[k].dtype == v.dtype for k, v in state.items())
    value = got.decisions[-1].value
    logged = {dtype: _trained_window_mean(mismatch.load("tiny-llama", dtype=dtype), mismatch.load("tiny-llama", seed=1),
                                          dtype) for dtype in ("bf16", "fp32")}
    assert value == pytest.approx(logged["bf16"], rel=1e-6)
    assert abs(value - logged["fp32"]) > 1e-6 * abs(value)


def test_the_limit_follows_the_pipelines_response_length():
    """Within 2x of the lengths the limits were fitted at, the fitted limit as it is (the length said); beyond,
    the gate again at `limit · (T / 2·high)^b`: b the length law's lower exponent, −1 (per sequence) without a
    law, a limit of 0 (uncertain) where the law leaves b open; the pipeline's length overrides the
    calibration's; never a reject of its own."""
    lm = mismatch.load("tiny-llama")
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=12)
    table = _thresholds(2.0)
    table.response_tokens = [2.0, 3.0]  # fitted at ~2–3 tokens: the window ends at 6
    first = check(lm, "noise:0.1", calibration=cal, thresholds=table)
    mean = first.calibration["tokens"] / first.calibration["sequences"]
    value, high = first.decisions[0].value, first.decisions[0].high
    assert mean > 6 and 0 < value < high < 2.0 * 6 / mean and first.decisions[0].status == "admit"

    def length_decision(admission):
        return [d for d in admission.decisions if d.metric == "length/mismatch_kl"]

    (d,) = length_decision(first)  # no law: per sequence
    assert d.limit == pytest.approx(2.0 * 6 / mean) and d.status == "admit" and first.status == "admit"
    assert any("assumed per sequence" in n and "the calibration responses' mean" in n for n in first.notes)
    table.length_law = {"b_low": -0.5, "b_high": 0.25, "b_mid": -0.2, "lengths": [3.0, 48.0], "ladder": "x"}
    (d,) = length_decision(check(lm, "noise:0.1", calibration=cal, thresholds=table))
    assert d.limit == pytest.approx(2.0 * (mean / 6) ** -0.5)
    assert any("from every ladder" in n for n in check(lm, "noise:0.1", calibration=cal, thresholds=table).notes)
    # a ladder run under the trainer's loss: its own law, not the envelope; another loss keeps the envelope
    table.loss_length_laws = {"pg-rkl-is": {**table.length_law, "b_low": -2.0, "ladders": ["x · pg-rkl-is · y"]}}
    for loss, b in (("pg-rkl-is", -2.0), ("full-rkl", -0.5)):
        got = check(lm, "noise:0.1", calibration=cal, thresholds=table, pipeline=Pipeline(trainer=TrainerSettings(loss=loss)))
        (d,) = length_decision(got)
        assert d.limit == pytest.approx(2.0 * (mean / 6) ** b)
        assert any(("from pg-rkl-is's ladder" if b == -2.0 else "ladders of pg-rkl-is; none ran full-rkl") in n
                   for n in got.notes)
    # its ladders ran without TIS: a trainer with a cap gets the law, said to be carried over; a loss whose
    # ladder ran but bounds nothing gets the envelope, said so
    table.loss_length_laws["pg-rkl-is"]["tis_caps"] = ["off"]
    for cap, carried in ((None, False), (2.0, True)):
        got = check(lm, "noise:0.1", calibration=cal, thresholds=table,
                    pipeline=Pipeline(trainer=TrainerSettings(loss="pg-rkl-is", tis_cap=cap)))
        assert length_decision(got)[0].limit == pytest.approx(2.0 * (mean / 6) ** -2.0)
        assert any("tis_cap off, this trainer's is 2: carried over" in n for n in got.notes) is carried
    table.loss_open_ladders = {"full-rkl": "ladder bounds no exponent"}
    got = check(lm, "noise:0.1", calibration=cal, thresholds=table, pipeline=Pipeline(trainer=TrainerSettings(loss="full-rkl")))
    assert any("ladders of pg-rkl-is; full-rkl's ladder bounds no exponent" in n for n in got.notes)
    table.loss_length_laws, table.loss_open_ladders = {}, {}
    table.length_law = {**table.length_law, "b_low": None}  # open below: nothing carries to longer responses
    opened = check(lm, "noise:0.1", calibration=cal, thresholds=table)
    assert length_decision(opened)[0].limit == 0.0 and opened.status == "uncertain"
    table.length_law = {}
    long = check(lm, "noise:0.1", calibration=cal, thresholds=table, pipeline=Pipeline(response_tokens=6 * 2.0 / value * 4))
    (d,) = length_decision(long)
    assert d.limit == pytest.approx(value / 4) and d.status == "uncertain" and long.status == "uncertain"
    assert any("the pipeline's (response_tokens)" in n for n in long.notes)
    table.response_tokens = [mean / 2, mean]
    near = check(lm, "noise:0.1", calibration=cal, thresholds=table)
    assert not length_decision(near) and any("within 2x" in n for n in near.notes)
    table.response_tokens = [100.0, 200.0]  # far shorter responses keep the limit without a law
    short = check(lm, "noise:0.1", calibration=cal, thresholds=table)
    assert not length_decision(short) and any("shorter responses keep the limit" in n for n in short.notes)


def test_bad_input_is_a_clear_error():
    lm = mismatch.load("tiny-llama")
    with pytest.raises(InputError, match="unknown loss 'kl'"):
        TrainerSettings(loss="kl")
    with pytest.raises(InputError, match="lr > 0"):
        TrainerSettings(lr=0.0)
    with pytest.raises(InputError, match="give the lag once"):
        check(lm, "stale:1", calibration=CalibrationSettings(prompts=PROMPTS), pipeline=Pipeline(staleness=2))
    with pytest.raises(InputError, match="--dump"):
        check(lm, "resample:1", calibration=CalibrationSettings(prompts=PROMPTS))
    with pytest.raises(InputError, match="unknown"):
        check(lm, "fp9", calibration=CalibrationSettings(prompts=PROMPTS))
    with pytest.raises(InputError, match="context"):
        check(lm, "noise:0", calibration=CalibrationSettings(prompts=["x" * 200]))
    with pytest.raises(InputError, match="unknown gate preset"):
        check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS), presets=("trl",))
    with pytest.raises(InputError, match="no gate"):
        check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS), thresholds={})
    with pytest.raises(InputError, match="no statistic 'kl' to gate"):
        check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS), thresholds={"kl": 0.1})
    with pytest.raises(InputError, match="max_new_tokens must be ≥ 1, got 0"):
        check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=0))


def test_judge_checks_its_inputs_and_one_sequence_gives_no_interval():
    from mismatch.admission import judge

    gate = [mismatch.admission.Gate("mismatch_kl", 0.3, "x")]
    lp = -torch.rand(10, generator=torch.Generator().manual_seed(0))
    for train, rollout, seq, message in ((lp, lp, torch.zeros(5), "need three"), (lp[:0], lp[:0], lp[:0], "no sampled"),
                                         (lp, lp.clone().fill_(float("nan")), torch.zeros(10), "finite")):
        with pytest.raises(InputError, match=message):
            judge(train, rollout, seq, gate)
    with pytest.raises(InputError, match="no statistic 'kl'"):
        judge(lp, lp, torch.zeros(10), [mismatch.admission.Gate("kl", 0.3, "x")])
    # one sequence, however far apart the policies: resampling it shows no spread, so no decision
    metrics, [d] = judge(lp, lp - 0.9, torch.zeros(10), gate)
    assert metrics["mismatch_kl"] == pytest.approx(-0.9) and math.isnan(d.low) and d.status == "uncertain"
    _, [d2] = judge(lp, lp - 0.9, torch.arange(10) // 5, gate)  # two sequences: an interval again
    assert not math.isnan(d2.low) and d2.status == "admit"


def test_reuse_carries_over_the_verdict_at_the_default_without_tis():
    rows = [{**LAGGED[0], "source": "reuse", "level": 2, "settings": settings, "verdict": verdict}
            for settings, verdict in ((STUDIED.replace("tis_cap off", "tis_cap 2"), "tolerated"), (STUDIED, "not tolerated"))]
    got = check(mismatch.load("tiny-llama"), "noise:0", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=4), pipeline=Pipeline(reuse=2), thresholds=_thresholds(1.0, rows))
    assert got.status == "reject" and "tis_cap off" in got.notes[-1]


@pytest.mark.parametrize("args, code", [(["--rollout", "noise:0"], 0), (["--rollout", "noise:2.0"], 1),
                                        (["--rollout", "noise:0", "--staleness", "3"], 3),
                                        # measured, but these thresholds hold no window limit to judge it by
                                        (["--rollout", "noise:0", "--staleness", "1", "--teacher", "tiny-llama"], 3),
                                        (["--rollout", "noise:0", "--staleness", "1", "--loss", "kl"], 2),
                                        (["--rollout", "bogus:1"], 2)])
def test_cli_exit_codes_and_json(tmp_path, args, code):
    path = _thresholds(1e-3).to_json(tmp_path / "t.json")
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS))
    res = CliRunner().invoke(app, ["check", "tiny-llama", *args, "--prompts", str(prompts), "--thresholds", str(path),
                                   "--max-new-tokens", "6", "--json"])
    assert res.exit_code == code, res.output
    if code != 2:
        payload = json.loads(res.stdout)
        assert payload["status"] == {0: "admit", 1: "reject", 3: "uncertain"}[code]
        assert payload["admitted"] == (code == 0) and payload["decisions"][0]["limit"] == 1e-3
    else:
        assert "error:" in res.output and len(res.output.strip().splitlines()) == 1


def test_judging_a_loops_own_log_probs_gives_the_checks_numbers():
    """`judge` on the check's own calibration tokens reproduces the check's statistics and decisions."""
    from mismatch.admission import judge

    lm = mismatch.load("tiny-llama")
    got = check(lm, "noise:0.3", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=12), thresholds={"mismatch_kl": 0.05}, seed=3)
    batch, logp_train, logp_rollout = _same_samples(lm)
    seq = batch.response_mask[:, 1:].nonzero()[:, 0] * 7 + 100  # any labels
    metrics, decisions = judge(logp_train, logp_rollout, seq, [mismatch.admission.Gate("mismatch_kl", 0.05, "x")],
                               seed=3)
    assert metrics["mismatch_kl"] == pytest.approx(got.metrics["mismatch_kl"], rel=1e-5)
    assert decisions[0].status == got.decisions[0].status
    assert (decisions[0].low, decisions[0].high) == pytest.approx((got.decisions[0].low, got.decisions[0].high), rel=1e-4)


def test_a_recipe_that_keeps_every_module_has_no_quantized_scope():
    """A gate no quantized module can pass keeps everything: nothing is quantized, so the recipe's
    scope is None (not a scope string that selects nothing), and it keeps all the weights."""
    got = check(mismatch.load("tiny-qwen3"), "int4:group32", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=6), thresholds={"mismatch_kl": 1e-9}, recipe=True)
    assert got.recipe["layers"] is None and got.recipe["kept_fraction"] == 1.0
    assert got.recipe["bits_per_weight"] == 16.0


def test_a_calibration_of_two_sequences_says_its_interval_means_little():
    lm = mismatch.load("tiny-llama")
    small = check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS[:2], max_new_tokens=4), thresholds={"mismatch_kl": 1.0})
    assert small.calibration["sequences"] == 2 and any("only 2 calibration sequences" in n for n in small.notes)
    enough = check(lm, "noise:0", calibration=CalibrationSettings(prompts=PROMPTS * 4, max_new_tokens=4, max_prompts=8), thresholds={"mismatch_kl": 1.0})
    assert enough.calibration["sequences"] >= 8 and not any("calibration sequence" in n for n in enough.notes)


def test_no_recipe_is_honoured_on_a_reject_and_each_stage_is_said(tmp_path):
    """A reject searches a recipe by default (against the fitted gate); `recipe=False` (`--no-recipe`) never does,
    and says so in a note. `progress` hears every stage, and the CLI prints them on stderr off a terminal (the
    README's rejecting check printed nothing for minutes), with stdout still the verdict alone (here JSON)."""
    lm = mismatch.load("tiny-llama")
    calibration = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6)
    said: list[str] = []
    searched = check(lm, "noise:2.0", calibration=calibration, thresholds={"mismatch_kl": 1e-3}, progress=said.append)
    assert searched.status == "reject" and searched.recipe is not None
    assert said[0].startswith("loading") and said[1].startswith("sampling 4 calibration responses")
    assert said[2] == "recipe: noise:2 on each of 3 blocks alone"  # the spec in its canonical form
    assert said[3] == "recipe: noise:2 on each module group of block 0 alone"
    skipped = check(lm, "noise:2.0", calibration=calibration, thresholds={"mismatch_kl": 1e-3}, recipe=False)
    assert skipped.status == "reject" and skipped.recipe is None
    assert skipped.notes[-1] == "no recipe searched (recipe=False, `--no-recipe`)"
    assert skipped.metrics == searched.metrics and skipped.decisions == searched.decisions  # the search changes no answer
    path = _thresholds(1e-3).to_json(tmp_path / "t.json")
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS))
    res = CliRunner().invoke(app, ["check", "tiny-llama", "--rollout", "noise:2.0", "--prompts", str(prompts),
                                   "--thresholds", str(path), "--max-new-tokens", "6", "--no-recipe", "--json"])
    assert res.exit_code == 1
    assert json.loads(res.stdout)["recipe"] is None
    stages = res.stderr.strip().splitlines()
    assert [s.split(" ", 1)[1].split(" ")[0] for s in stages] == ["checking", "loading", "sampling"]


def test_json_output_is_strict_where_an_interval_is_undefined(tmp_path):
    """One calibration sequence has no bootstrap spread: the interval is NaN. `--json` wrote a bare `NaN`, which
    RFC 8259 JSON (jq, JavaScript, `json.loads(parse_constant=…)`) refuses; now the string "nan"."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat sat\n")
    res = CliRunner().invoke(app, ["check", "tiny-llama", "--rollout", "noise:0.3", "--prompts", str(prompts),
                                   "--max-new-tokens", "6", "--json"])
    assert res.exit_code == 3, res.output
    payload = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert payload["decisions"][0]["low"] == "nan" and math.isnan(float(payload["decisions"][0]["high"]))


def test_studies_that_disagree_at_the_users_settings_carry_no_verdict_over():
    """Two pairs ran stale:1 at the same settings: a decided verdict and an undecided one carry the decided one
    over, naming both; two decided verdicts that disagree give uncertain, naming both; order does not matter."""
    lm = mismatch.load("tiny-llama")
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=4)

    def level(pair, verdict):
        return {**LAGGED[0], "pair": pair, "verdict": verdict}

    for studies, status in (([level("sort-gpt2", "tolerated"), level("smollm2-pruned", "uncertain")], "admit"),
                            ([level("sort-gpt2", "tolerated"), level("smollm2-pruned", "not tolerated")], "uncertain"),
                            ([level("sort-gpt2", "uncertain"), level("smollm2-pruned", "uncertain")], "uncertain")):
        for order in (studies, studies[::-1]):
            got = check(lm, "noise:0", calibration=cal, pipeline=Pipeline(staleness=1),
                        thresholds=_thresholds(1.0, order))
            assert got.status == status and got.decisions[-1].metric == "study/stale:1"
            assert all(f"{s['pair']}, {STUDIED}" in got.notes[-1] for s in studies)
            assert ("disagree" in got.notes[-1]) == (status == "uncertain" and "tolerated" in
                                                     {s["verdict"] for s in studies})


def test_a_lag_studied_at_another_response_length_is_not_carried_over():
    """A lag's verdict carries over only near the response length it was studied at (within 2×, the limits' own
    window): at 32-token responses a study at 8 tokens says nothing, so uncertain, naming its length; at 12
    tokens it carries. Of two agreeing studies (8 and 24 tokens) the decision's number is the nearer one's (in log
    length), whatever their order."""
    lm = mismatch.load("tiny-llama")
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=4)
    short = {**LAGGED[0], "response_tokens": 8.0, "acc_delta": -0.001}
    long_ = {**LAGGED[0], "pair": "smollm2-pruned", "response_tokens": 24.0, "acc_delta": -0.004}
    far = check(lm, "noise:0", calibration=cal, pipeline=Pipeline(staleness=1, response_tokens=64),
                thresholds=_thresholds(1.0, [short]))
    assert far.status == "uncertain" and far.decisions[-1].metric == "study/stale:1"
    assert "near 64-token responses" in far.notes[-1] and "studied at 8 tokens" in far.notes[-1]
    near = check(lm, "noise:0", calibration=cal, pipeline=Pipeline(staleness=1, response_tokens=12),
                 thresholds=_thresholds(1.0, [short]))
    assert near.status == "admit" and "(8-token responses)" in near.notes[-1]
    for order in ([short, long_], [long_, short]):
        for tokens, nearest in ((12, short), (15, long_)):  # within 2× of both; 15 is nearer 24 than 8 in log length
            got = check(lm, "noise:0", calibration=cal, pipeline=Pipeline(staleness=1, response_tokens=tokens),
                        thresholds=_thresholds(1.0, order))
            assert got.status == "admit" and got.decisions[-1].value == nearest["acc_delta"]


@pytest.mark.parametrize("staleness", [0, 1])
def test_with_a_teacher_the_window_statistic_decides_a_format_too(staleness):
    """With a teacher a format (alone, or with a lag) is measured as a lag is: its first WINDOW OPD steps from
    the checkpoint under the format's rollouts, the window's mismatch_kl judged against the window limit. That
    decision decides (the statistic that transfers across sources); the first-step gate is kept, shown and not
    deciding — here it rejects (limit 1e-9) while the window admits (its limit 100× the window's mean), and the
    check admits. The value is the window's mean of what `opd.train` logs for the same run; the weights are
    restored bit for bit."""
    lm, teacher = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", seed=1)
    logged = _trained_window_mean(mismatch.load("tiny-llama"), teacher, rollout="int4:group32", staleness=staleness)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    table = _thresholds(1e-9, LAGGED)
    table.window_limits = {"mismatch_kl": 100 * logged}
    cal = CalibrationSettings(prompts=PROMPTS, max_new_tokens=6, chat=False)
    got = check(lm, "int4:group32", calibration=cal, thresholds=table, teacher=teacher, seed=4,
                pipeline=Pipeline(staleness=staleness, trainer=TrainerSettings(lr=3e-2)), recipe=False)
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    first, window = got.decisions[0], got.decisions[-1]
    label = "int4:group32" + (f"+stale:{staleness}" if staleness else "")
    assert first.metric == "mismatch_kl" and first.status == "reject" and not first.decides
    assert window.metric == f"measured/{label}/window:mismatch_kl" and window.decides
    assert window.status == "admit" and got.status == "admit" and got.violations == []
    assert window.value == pytest.approx(logged, rel=1e-6) and window.value > 1e-3
    assert not any(d.metric.startswith("drift/") for d in got.decisions)  # the window's steps hold the drift
    assert "the window statistic decides" in got.notes[-1]


def test_a_format_with_reuse_is_refused_before_anything_is_loaded():
    with pytest.raises(InputError, match="reuse:2: OPD reuses the student's own batches"):
        check("no-such-model", "int4:group32", pipeline=Pipeline(reuse=2), teacher="no-such-teacher")
