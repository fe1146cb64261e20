"""The trainer's precision (`OPDConfig.ref_dtype`): a bf16 compute copy over fp32 master weights."""

import copy
import dataclasses

import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.cli.app import app
from mismatch.errors import InputError
from mismatch.opd import OPDConfig
from mismatch.opd.config import comparison_key, lr_factor
from mismatch.opd.precision import MasterWeights
from mismatch.opd.runs import run_columns
from mismatch.opd.trainer import loss_backward, sample_rollouts, score_with_teacher, setup, update
from mismatch.results import run_id

SHORT = dict(pair="reverse-qwen3", steps=2, batch_size=8, eval_every=2, eval_prompts=8, train_prompts=64)


def test_at_fp32_the_masters_are_the_parameters_and_nothing_is_cast():
    model = mismatch.load("tiny-qwen3").model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weights = MasterWeights(model, torch.float32)
    assert not weights.mixed and all(m is p for m, p in zip(weights.masters, model.parameters()))
    assert all(torch.equal(before[k], v) and v.dtype == before[k].dtype for k, v in model.state_dict().items())


def test_bf16_masters_hold_the_weights_and_the_parameters_become_their_bf16_copy():
    """The masters are the loaded fp32 weights bit for bit; the model's parameters (the same objects, tied
    embeddings still one tensor) are their bf16 rounding; buffers (RoPE's frequencies) are untouched, as
    `from_pretrained(dtype=torch.bfloat16)` leaves them."""
    model = mismatch.load("tiny-qwen3").model
    params = list(model.parameters())
    fp32 = [p.detach().clone() for p in params]
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    weights = MasterWeights(model, torch.bfloat16)
    assert weights.mixed and list(model.parameters()) == params  # the same Parameter objects
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for master, p, w in zip(weights.masters, params, fp32):
        assert master.dtype == torch.float32 and torch.equal(master, w) and master.requires_grad
        assert p.dtype == torch.bfloat16 and torch.equal(p, w.to(torch.bfloat16))
    assert buffers and all(torch.equal(v, buffers[k]) and v.dtype == buffers[k].dtype
                           for k, v in model.named_buffers())


def test_a_bf16_update_steps_the_fp32_masters_with_the_bf16_models_gradient():
    """One `update` of a bf16 run against the same step written out: the bf16 model's gradient (the loss on
    a copy of it), upcast, clipped and stepped by AdamW on fp32 masters, rounded back into the model. The
    masters keep what bf16 cannot: elements the step moved by less than half a bf16 ulp change in the masters
    and not in the model."""
    config = OPDConfig(**SHORT, ref_dtype="bf16", lr=1e-4)
    run = setup(config)
    student, teacher = run.student.model, run.pair.teacher.model
    assert {p.dtype for p in student.parameters()} == {p.dtype for p in teacher.parameters()} == {torch.bfloat16}
    rollout, t_batch = sample_rollouts(run, run.rng.sample(run.train_pool, config.batch_size), 1)
    hidden = score_with_teacher(run, t_batch)
    twin = copy.deepcopy(student)
    masters = [m.detach().clone().requires_grad_() for m in run.weights.masters]
    start = [m.detach().clone() for m in masters]

    result, grad_norm, lr = update(run, rollout, hidden)

    want = loss_backward(twin, teacher, rollout.batch, hidden, None, loss=config.loss, tis_cap=None,
                         chunk_tokens=config.chunk_tokens)
    assert result.loss == want.loss
    for master, p in zip(masters, (p for p in twin.parameters() if p.requires_grad)):
        master.grad = p.grad.float()
    assert grad_norm == float(torch.nn.utils.clip_grad_norm_(masters, config.grad_clip))
    assert lr == config.lr * lr_factor(config, 1)
    torch.optim.AdamW(masters, lr=lr, weight_decay=config.weight_decay, betas=(config.adam_beta1, 0.999)).step()
    for got, want_m, p, p0 in zip(run.weights.masters, masters, run.weights.params, start):
        assert torch.equal(got, want_m)
        assert torch.equal(p, want_m.detach().to(torch.bfloat16))
    kept = sum(int(((m != m0) & (p == m0.to(torch.bfloat16))).sum())
               for m, m0, p in zip(run.weights.masters, start, run.weights.params))
    assert kept > 0  # an update a bf16-only optimizer would have rounded away


def test_bf16_changes_the_numbers_and_is_part_of_the_runs_identity():
    """A bf16 run is another computation (other numbers, its own id, compared only with bf16 runs); at the
    defaults (CPU, fp32) the columns and ids are those of runs made before the fields existed."""
    fp32, bf16 = OPDConfig(**SHORT), OPDConfig(**SHORT, ref_dtype="bf16")
    assert "ref_dtype" not in run_columns(fp32) and "device" not in run_columns(fp32)
    assert run_columns(bf16)["ref_dtype"] == "bf16"
    fields = {f.name for f in dataclasses.fields(OPDConfig)}
    assert set(run_columns(fp32)) == fields - {"device", "ref_dtype"} | {"pair_sha256"}
    assert run_id("opd", run_columns(bf16)) != run_id("opd", run_columns(fp32))
    noisy = dataclasses.replace(bf16, rollout="noise:0.01")
    assert comparison_key(run_columns(noisy)) == comparison_key(run_columns(bf16))
    assert comparison_key(run_columns(bf16)) != comparison_key(run_columns(fp32))
    rows = {d: {(r["step"], r["metric"]): r["value"] for r in mismatch.opd.train(c)}
            for d, c in (("fp32", fp32), ("bf16", bf16))}
    assert rows["fp32"][(1, "loss")] != rows["bf16"][(1, "loss")]
    assert abs(rows["fp32"][(1, "loss")] - rows["bf16"][(1, "loss")]) < 0.05 * rows["fp32"][(1, "loss")]


def test_a_bad_precision_or_absent_device_is_one_line():
    runner = CliRunner()
    for args, words in ((["--ref-dtype", "fp16"], "ref_dtype must be one of fp32, bf16"),
                        (["--device", "tpu"], "unknown device")):
        res = runner.invoke(app, ["opd", "--pair", "reverse-qwen3", "--steps", "1", *args])
        assert res.exit_code != 0 and words in res.output and len(res.output.strip().splitlines()) == 1
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA device"):
            OPDConfig(**SHORT, device="cuda")
    assert OPDConfig(**SHORT, device="auto").device == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_run_on_cuda_learns_and_is_recorded_as_one():
    config = OPDConfig(**SHORT, device="cuda", ref_dtype="bf16")
    rows = mismatch.opd.train(config)
    kl = {r["step"]: r["value"] for r in rows if r["metric"] == "heldout_rkl"}
    assert kl[SHORT["steps"]] < kl[0]
    assert run_columns(config)["device"] == "cuda"


def test_step_zeros_shared_evaluation_is_kept_apart_per_precision(tmp_path):
    """Runs that share an evaluation cache share step 0 only within one device and precision: an fp32 and a
    bf16 run of the same pair and seed each read back their own evaluation, the one they compute without it."""
    cache = tmp_path / "cache"
    first = {}
    for dtype in ("fp32", "bf16", "fp32", "bf16"):
        rows = mismatch.opd.train(OPDConfig(**{**SHORT, "steps": 1, "eval_every": 1}, ref_dtype=dtype),
                                  eval_cache=cache)
        step0 = {r["metric"]: r["value"] for r in rows if r["step"] == 0}
        assert first.setdefault(dtype, step0) == step0
    alone = {r["metric"]: r["value"] for r in mismatch.opd.train(OPDConfig(**{**SHORT, "steps": 1, "eval_every": 1},
                                                                           ref_dtype="bf16")) if r["step"] == 0}
    assert first["bf16"] == alone and first["bf16"]["heldout_rkl"] != first["fp32"]["heldout_rkl"]
    assert len(list(cache.glob("*.json"))) == 2
