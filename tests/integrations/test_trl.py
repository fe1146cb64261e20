"""`MismatchDistillationTrainer`: TRL's own DistillationTrainer, its rollouts from a mismatched copy.

Runs TRL's trainer for a few steps on the sort-gpt2 pair (its real student and teacher). The logged
statistics are checked against an independent computation on the same tokens: log-probs from the models'
own full-vocabulary logits (a plain forward, `log_softmax`, gather) of the student at the weights the step
sampled with and of a copy built apart with `mismatch.perturbed`, pooled by the check's `judge`.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import mismatch
from mismatch.admission.decision import judge, statistics
from mismatch.admission.thresholds import load_thresholds
from mismatch.errors import InputError
from mismatch.metrics import ESS_EPS

trl = pytest.importorskip("trl", reason="the trl extra is not installed (make test installs it)")
from transformers import TrainerCallback  # noqa: E402

from tests.trl_runs import trl_trainer  # noqa: E402

# The no-mismatch value of every logged mismatch statistic (log r = 0 for every token): 0, else these; verl's
# ESS normalises the weights by (mean + ε), so at r ≡ 1 it is (1 + ε)², not 1.
NO_MISMATCH = {"train/token_mult_prob_error": 1.0, "rollout_corr/rollout_is_eff_sample_size": (1 + ESS_EPS) ** 2,
               "rollout_corr/ppl_ratio": 1.0}
POLICY_SCALE = ("rollout_corr/training_ppl", "rollout_corr/training_log_ppl", "rollout_corr/rollout_ppl",
                "rollout_corr/rollout_log_ppl")  # perplexities of the policy itself, not mismatch


@pytest.fixture(scope="module")
def pair():
    return mismatch.load_pair("sort-gpt2")


def _trainer(pair, tmp_path, **kwargs):
    return trl_trainer(pair, tmp_path / "out", **kwargs)


def _logged(trainer) -> list[dict]:
    return [row for row in trainer.state.log_history if "mismatch_kl" in row]


def _plain_logprobs(model, batch) -> torch.Tensor:
    """`[N]` log π(y) of the batch's response tokens from the model's own `[B, T, V]` logits (the slow,
    obvious way; positions count from each row's first attended token, as generation's do)."""
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=positions).logits
    logp = logits.float().log_softmax(-1)[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return logp[batch.response_mask[:, 1:].bool()]


class _WeightsAtStepBegin(TrainerCallback):
    """The student's weights as each optimizer step begins (before its rollouts are sampled)."""

    def __init__(self) -> None:
        self.weights = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.weights = copy.deepcopy(model.state_dict())


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])  # TRL's default autocasts on CPU too
def test_clean_rollouts_log_exactly_no_mismatch(pair, tmp_path, bf16):
    trainer = _trainer(pair, tmp_path, steps=2, bf16=bf16)
    trainer.train()
    rows = _logged(trainer)
    assert len(rows) == 2
    for row in rows:
        names = [k for k in statistics(torch.zeros(2), torch.zeros(2), torch.tensor([0, 1])) if k not in POLICY_SCALE]
        for name in names:
            # exact: 0 stays 0; a mean of N identical float64 ratios may round in its last bits
            assert row[name] == pytest.approx(NO_MISMATCH.get(name, 0.0), rel=1e-12, abs=0), name
    assert trainer.rollout_copy is None
    assert [r.step for r in trainer.gate_records] == [0] and trainer.gate_records[0].decisions[0].status == "admit"


def test_int4_rollouts_are_the_copys_and_log_the_checks_own_statistics(pair, tmp_path):
    spec = "int4:channel"
    at_begin = _WeightsAtStepBegin()
    trainer = _trainer(pair, tmp_path, steps=3, callbacks=[at_begin], rollout=spec)
    trainer.train()
    last = _logged(trainer)[-1]
    batch, logp_train_N, logp_rollout_N = trainer.last_rollout
    # independent: the student at the weights step 3 sampled with, and a copy of it quantized apart
    student = copy.deepcopy(pair.student.model)
    student.load_state_dict(at_begin.weights)
    student.eval()
    with mismatch.perturbed(copy.deepcopy(student), spec) as quantized:
        plain_rollout_N = _plain_logprobs(quantized, batch)
    plain_train_N = _plain_logprobs(student, batch)
    # fp32 log-softmax of logits of magnitude ≲ 30 over V = 94: a few ulps (~1e-6) per token and model
    torch.testing.assert_close(logp_train_N, plain_train_N, rtol=0, atol=2e-5)
    torch.testing.assert_close(logp_rollout_N, plain_rollout_N, rtol=0, atol=2e-5)
    seq_N = torch.unique(torch.nonzero(batch.response_mask)[:, 0], return_inverse=True)[1]
    metrics, _ = judge(plain_train_N, plain_rollout_N, seq_N, trainer.gates)
    assert last["mismatch_kl"] > 0
    for name in ("mismatch_kl", "mismatch_k3", "rollout_corr/kl", "train/train_rollout_logprob_abs_diff",
                 "train/token_mult_prob_error"):
        # a mean of per-token differences, each within 4e-5 (two log-probs): the same bound on the mean
        assert last[name] == pytest.approx(metrics[name], abs=1e-4), name
    # the copy sampled: under its own policy the tokens are likelier than under the student's on average
    # (E_q[log q − log p] = KL(q‖p) > 0, while student samples would give −KL(p‖q) < 0)
    assert float((logp_rollout_N - logp_train_N).mean()) > 0


def test_a_copy_under_bf16_autocast_differs_from_the_student_only_by_its_perturbation(pair, tmp_path):
    # noise:0 is a copy (not the student itself) with unchanged weights: under the trainer's bf16 autocast
    # it must score as the student does, bit for bit — had the copy run in fp32, |log r| would be ~0.07
    trainer = _trainer(pair, tmp_path, steps=2, bf16=True, rollout="noise:0")
    trainer.train()
    assert trainer.rollout_copy is not None and not trainer.rollout_copy.is_student
    for row in _logged(trainer):
        assert row["mismatch_logp_abs_diff_max"] == 0.0 and row["mismatch_kl"] == 0.0


def test_the_copy_follows_the_student_every_step(pair, tmp_path):
    at_begin = _WeightsAtStepBegin()
    trainer = _trainer(pair, tmp_path, steps=2, callbacks=[at_begin], rollout="int4:channel")
    trainer.train()
    expected = copy.deepcopy(pair.student.model)
    expected.load_state_dict(at_begin.weights)  # step 2's starting weights: after one update
    with mismatch.perturbed(expected, "int4:channel") as quantized:
        want = {k: v.clone() for k, v in quantized.state_dict().items()}
    got = trainer.rollout_copy.model.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert not torch.equal(at_begin.weights["transformer.h.0.attn.c_attn.weight"],
                           pair.student.model.state_dict()["transformer.h.0.attn.c_attn.weight"])


def test_a_recipe_keeps_its_modules_in_full_precision(pair, tmp_path):
    recipe = {"spec": "int4:channel", "layers": r"^transformer\.h\.0\."}
    trainer = _trainer(pair, tmp_path, steps=1, rollout=recipe)
    served, student = trainer.rollout_copy.model.state_dict(), pair.student.model.state_dict()
    changed = {k for k in student if not torch.equal(served[k], student[k])}
    assert changed and all(k.startswith("transformer.h.0.") for k in changed)
    assert not any(k.startswith("transformer.h.1.") for k in changed)


def test_gates_warn_or_stop_on_a_copy_beyond_the_limit(pair, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mismatch"):
        warned = _trainer(pair, tmp_path / "warn", steps=3, rollout="noise:1.0", gate_every=2)
        warned.train()
    assert warned.state.global_step == 3
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mismatch gate")]
    assert [line.split(":")[0] for line in lines] == ["mismatch gate at step 0", "mismatch gate at step 2"]
    shipped = load_thresholds()  # the limits the gates apply, as the lines print them: the first batch's and
    # later windows', those of TRL's default loss (beta 1: the full-vocabulary reverse KL, the study's full-rkl)
    assert warned.beta == 1 and warned.study_loss == "full-rkl"
    first, window = shipped.for_loss("full-rkl")[0], shipped.for_loss("full-rkl", window=True)[0]
    assert "mismatch_kl" in lines[0] and f"above the limit {first:.4g}" in lines[0] and "\n" not in lines[0]
    assert f"above the limit {window:.4g}" in lines[1]
    assert [r.decisions[0].limit for r in warned.gate_records] == [first, window]
    assert all(r.violations for r in warned.gate_records)

    stopped = _trainer(pair, tmp_path / "stop", steps=5, rollout="noise:1.0", on_violation="stop")
    stopped.train()
    assert stopped.state.global_step == 1  # the step whose first batch was judged, then stopped
    assert (tmp_path / "stop" / "out" / "checkpoint-1").is_dir()


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
def test_the_gates_are_those_of_the_trainers_loss(pair, tmp_path, beta):
    trainer = _trainer(pair, tmp_path, steps=1, rollout="int8:channel", config={"beta": beta})
    shipped = load_thresholds()
    loss = "full-rkl" if beta == 1 else None  # forward KL and the JSD: losses the study did not run
    assert trainer.study_loss == loss
    # the loss's own limit where the check uses it (its held-out record at least the pooled one's), else pooled
    own, own_window = (shipped.own_limit(loss), shipped.own_limit(loss, window=True)) if loss else (None, None)
    assert [g.limit for g in trainer.gates] == [own["limit"] if own else shipped.limits["mismatch_kl"]]
    assert [g.limit for g in trainer.later_gates] == [own_window["limit"] if own_window
                                                      else shipped.window_limits["mismatch_kl"]]


def test_given_limits_gate_any_named_statistic(pair, tmp_path):
    trainer = _trainer(pair, tmp_path, steps=1, rollout="int4:channel",
                       thresholds={"train/token_mult_prob_error": 1.0 + 1e-9})
    trainer.train()
    (decision,) = trainer.gate_records[0].decisions
    assert decision.metric == "train/token_mult_prob_error" and decision.status == "reject"
    assert trainer.later_gates == trainer.gates  # limits given apply to every judgement


@pytest.mark.parametrize("kwargs, message", [
    (dict(rollout="stale:2"), "fresh every step"),
    (dict(rollout="reuse:2"), "fresh every step"),
    (dict(rollout="fp9"), "fp9"),
    (dict(on_violation="halt"), "on_violation"),
    (dict(gate_every=0), "gate_every"),
    (dict(thresholds={"kl_typo": 0.1}), "kl_typo"),
    (dict(rollout=3), "rollout must be"),
])
def test_bad_arguments_are_one_line_errors(pair, tmp_path, kwargs, message):
    with pytest.raises(InputError, match=message) as err:
        _trainer(pair, tmp_path, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.engines
def test_llama_cpp_rollouts_log_the_engines_own_log_probs(pair, tmp_path):
    pytest.importorskip("llama_cpp", reason="llama.cpp is not installed (the engines extra: make engines)")
    at_begin = _WeightsAtStepBegin()
    trainer = _trainer(pair, tmp_path, steps=2, batch=8, callbacks=[at_begin], rollout="engine:llama.cpp,f32")
    trainer.train()
    batch, logp_train_N, logp_rollout_N = trainer.last_rollout
    student = copy.deepcopy(pair.student.model)
    student.load_state_dict(at_begin.weights)
    student.eval()
    # llama.cpp's own log-probs, not a PyTorch pass: they differ from the student's by the engine's fp32
    # arithmetic (f32 weights, f16 KV cache) — small but not zero
    diff = (logp_rollout_N.double() - _plain_logprobs(student, batch).double()).abs()
    assert 0 < float(diff.max()) < 0.05
    torch.testing.assert_close(logp_train_N, _plain_logprobs(student, batch), rtol=0, atol=2e-5)


@pytest.mark.parametrize("fix", [True, False])
def test_training_positions_are_the_generations_for_absolute_position_models(pair, tmp_path, fix):
    # GPT-2 learns absolute position embeddings: a left-padded row must be read at the positions `generate`
    # gave it (counted from its first token), i.e. exactly as the same row without its padding
    trainer = _trainer(pair, tmp_path, steps=1, fix_positions=fix)
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    row = pair.student.tokenizer("sort:6276=")["input_ids"] + [24, 25, 28]
    pad = 3
    ids = torch.tensor([[0] * pad + row])
    mask = torch.tensor([[0] * pad + [1] * len(row)])
    with torch.no_grad():
        padded = trainer._get_last_hidden_state(model, ids, mask, 3)
        alone = trainer._get_last_hidden_state(model, ids[:, pad:], mask[:, pad:], 3)
    gap = float((padded - alone).abs().max())
    if fix:
        assert gap < 1e-5  # fp32 rounding of other attention shapes
    else:
        assert gap > 0.1  # TRL 1.16's own forward: positions shifted by the padding


def test_a_lora_student_trains_at_the_generations_positions(pair, tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed (the test extra installs it)")
    # random B (init_lora_weights=False): the adapter changes the forward from the first step, so a forward that
    # bypassed it would show; GPT-2's c_attn is a Conv1D, whose weight is stored transposed (fan_in_fan_out)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True,
                           init_lora_weights=False)
    trainer = _trainer(pair, tmp_path, steps=1, peft_config=lora)
    student = trainer.accelerator.unwrap_model(trainer.model)
    assert isinstance(student, peft.PeftModel)
    seen = []  # (position_ids, attention_mask) of every forward of the student's backbone that builds a graph

    def record(module, args, kwargs):
        if torch.is_grad_enabled():
            seen.append((kwargs.get("position_ids"), kwargs["attention_mask"]))

    hook = student.base_model.model.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        trainer.train()
    finally:
        hook.remove()
    # one step of one batch: one training forward builds a graph (the statistics' pass runs without gradient)
    assert len(seen) == 1
    for positions, mask in seen:
        assert positions is not None
        # independent: t − (index of the row's first attended token), on every attended token
        first = mask.argmax(-1, keepdim=True)
        expected = torch.arange(mask.shape[1]).expand_as(mask) - first
        assert torch.equal(positions[mask.bool()], expected[mask.bool()])
        assert bool((mask.argmax(-1) > 0).any())  # some row was left-padded: positions without fix would differ

    # the training forward's logits on a left-padded row: the PEFT model's own forward at the generation's positions
    student.eval()
    row = pair.student.tokenizer("sort:6276=")["input_ids"] + [24, 25, 28]
    pad = 3
    ids, mask = torch.tensor([[0] * pad + row]), torch.tensor([[0] * pad + [1] * len(row)])
    positions = torch.tensor([[0] * pad + list(range(len(row)))])
    head = student.get_output_embeddings()
    with torch.no_grad():
        trained = head(trainer._get_last_hidden_state(student, ids, mask, 3))
        at_positions = student(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -4:-1]
        unpositioned = student(input_ids=ids, attention_mask=mask).logits[:, -4:-1]
        with student.disable_adapter():
            base = student(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -4:-1]
    # the same backbone numbers; only the head's matmul runs over another number of rows: fp32 rounding of a
    # D = 64 term dot product, ≤ 64 · 2⁻²⁴ · Σ|w·h| ≈ 1e-5 for these logits (|logit| ≲ 30)
    torch.testing.assert_close(trained, at_positions, rtol=0, atol=1e-4)
    assert float((trained - unpositioned).abs().max()) > 0.1  # TRL 1.16's positions: shifted by the padding
    assert float((trained - base).abs().max()) > 1e-3  # the adapter is in the training forward


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_in_bf16_the_copy_follows_the_student_and_the_statistics_are_measured(pair, tmp_path):
    """Where TRL trains on a GPU (`use_cpu=False`) in its bf16 autocast, the rollout copy is built beside the
    student and the logged statistics are those of its own rollout tokens (the log-probs come back to the CPU)."""
    trainer = _trainer(pair, tmp_path, steps=2, bf16=True, rollout="fp8-e4m3:channel", config={"use_cpu": False})
    trainer.train()
    assert next(trainer.rollout_copy.model.parameters()).device.type == "cuda"
    rows = _logged(trainer)
    assert rows and all(r["mismatch_kl"] == r["mismatch_kl"] for r in rows)  # finite, measured each step
