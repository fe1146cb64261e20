"""`device=` / `--device`: one resolution rule, models loaded where asked, seeded streams on that device.
The CUDA cases run where a GPU is present and skip cleanly elsewhere (CI is CPU-only)."""

import pytest
import torch

import mismatch
from mismatch.errors import InputError
from mismatch.model.device import model_device, resolve_device, seeded
from mismatch.model.generate import generate

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def test_auto_is_cuda_where_present_else_the_cpu_and_names_are_normalised():
    assert resolve_device("auto") == torch.device("cuda" if CUDA else "cpu")
    assert resolve_device(None) == resolve_device("CPU") == resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("bad", ["tpu", "gpu0", "", "meta"])
def test_an_unknown_device_is_one_line(bad):
    with pytest.raises(InputError, match="device") as info:
        resolve_device(bad)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(CUDA, reason="CUDA is present here")
def test_cuda_asked_for_where_none_is_present_fails_before_any_weights_are_read(monkeypatch):
    from mismatch.model import loader

    monkeypatch.setattr(loader, "_load", lambda *a: pytest.fail("weights were read"))
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(InputError, match="no CUDA device"):
            mismatch.load("tiny-llama", device=spec)


def test_seeded_draws_repeat_and_give_the_callers_stream_back():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    with seeded(0, torch.device("cpu")):
        first = torch.rand(4)
    with seeded(0, torch.device("cpu")):
        again = torch.rand(4)
    assert torch.equal(first, again) and not torch.equal(first, torch.rand(4))
    torch.manual_seed(11)
    with seeded(0, torch.device("cpu")):
        torch.rand(100)
    assert torch.equal(torch.rand(3), expected)  # the block's draws did not move the caller's stream


def test_cpu_given_explicitly_is_the_default():
    a, b = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", device="cpu")
    assert model_device(b.model) == torch.device("cpu")
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


@needs_cuda
def test_on_cuda_the_model_moves_and_the_same_seed_samples_the_same_tokens():
    lm = mismatch.load("tiny-llama", device="cuda")
    assert model_device(lm.model).type == "cuda"
    one = generate(lm, ["a b c", "hello"], max_new_tokens=6, temperature=1.0, seed=3)
    two = generate(lm, ["a b c", "hello"], max_new_tokens=6, temperature=1.0, seed=3)
    assert torch.equal(one.input_ids, two.input_ids) and one.input_ids.device.type == "cpu"  # a Batch lives on the CPU


@needs_cuda
def test_a_probe_on_cuda_agrees_with_the_cpu_within_fp32_rounding():
    from mismatch.model.head import head_inputs
    from mismatch.model.positions import response_index

    cpu, gpu = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", device="cuda")
    batch = generate(cpu, ["a b c", "hello"], max_new_tokens=6, seed=0)
    index = response_index(batch.response_mask)
    rows_cpu = head_inputs(cpu.model, batch.input_ids, batch.attention_mask, index).rows_ND
    rows_gpu = head_inputs(gpu.model, batch.input_ids, batch.attention_mask, index).rows_ND  # a CPU batch, moved
    assert rows_gpu.device.type == "cuda"
    # fp32 with TF32 off (torch's default for matmuls): two reduction orders, a few ulps per layer
    torch.testing.assert_close(rows_gpu.cpu(), rows_cpu, rtol=1e-4, atol=1e-5)


def test_the_prepared_gpu_script_dry_runs_on_the_cpu_and_writes_every_part(tmp_path):
    """benchmarks/device_check.py is what a lent GPU runs as is: on the CPU (`--device cpu`) each part runs
    and lands in its JSON, the probe on the device beside the CPU's (here the same device: ratio 1)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "device_check.py"
    spec = importlib.util.spec_from_file_location("device_check", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "device.json"
    assert script.main(["--device", "cpu", "--model", "tiny-llama", "--skip-tests", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["probe"]["kl_fwd_mean_ratio"] == 1.0 and report["probe"]["cpu"]["tokens"] > 0
    assert report["check"]["status"] in ("admit", "reject", "uncertain") and report["check"]["mismatch_kl"] > 0
    assert ("skipped" in report["rollout_speed"]) == (not CUDA)
    assert "skipped" in report["scale_check"]  # --device cpu: the scale check is bench_scale.py's there
    if not CUDA:
        assert script.main(["--out", str(tmp_path / "none.json")]) == 2 and not (tmp_path / "none.json").exists()


@needs_cuda
def test_offload_on_cuda_keeps_the_originals_in_host_memory_and_restores_them_bitwise():
    from mismatch.perturb import active_perturbations, perturbed

    lm = mismatch.load("tiny-llama", device="cuda")
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    with perturbed(lm.model, "int4:group128", layers="linear", offload=True) as cand:
        snap = active_perturbations(cand)[-1]
        assert snap.offloaded and all(isinstance(where, torch.Tensor) and where.device.type == "cpu"
                                      for _, where, _ in snap.offloaded)
        assert snap.offload_dir is None
    for name, param in lm.model.named_parameters():
        assert param.device.type == "cuda" and torch.equal(param, before[name]), name


def _per_module_map(model) -> dict[str, str]:
    """Every top-level part of the model on the CPU as its own entry: the map a balanced spread writes, one
    device per decoder block."""
    from mismatch.model.layout import model_layout

    layout = model_layout(model)
    names = {id(m): n for n, m in model.named_modules()}
    blocks = [names[id(block)] for block in layout.layers]
    others = [n for n, _ in model.named_children() if n != "model"] + \
             [f"model.{n}" for n, _ in model.model.named_children() if n != "layers"]
    return {name: "cpu" for name in [*blocks, *others]}


def test_a_spread_model_checks_as_the_whole_one_and_gets_its_weights_back_bitwise():
    """accelerate's device map, run on the CPU with its hooks forced on (the multi-device code path: hooks
    carry activations between modules, weights stay where the map put them): the check's numbers equal the
    unspread model's, and the perturbation is undone bit for bit on the one copy of the weights."""
    from mismatch.admission import CalibrationSettings
    from mismatch.model.device import spread

    plain, lm = mismatch.load("tiny-llama"), mismatch.load("tiny-llama")
    spread(lm.model, _per_module_map(lm.model), hooks=True)
    assert hasattr(lm.model.model.layers[0], "_hf_hook")  # the hooked path, not a plain move
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    settings = dict(rollout="int4:group128", recipe=False, calibration=CalibrationSettings(max_prompts=4))
    expected, got = mismatch.check(plain, **settings), mismatch.check(lm, **settings)
    assert got.status == expected.status and got.metrics == expected.metrics
    assert all(torch.equal(p, before[n]) for n, p in lm.model.named_parameters())


@pytest.mark.parametrize("where", ["disk", "meta"])
def test_a_device_map_that_leaves_weights_off_the_devices_is_refused(where):
    from mismatch.model.device import spread

    lm = mismatch.load("tiny-llama")
    with pytest.raises(InputError, match="resident") as info:
        spread(lm.model, {**_per_module_map(lm.model), "lm_head": where})
    assert "\n" not in str(info.value)


@pytest.mark.skipif(CUDA, reason="CUDA is present here")
def test_balanced_without_cuda_is_one_line_before_any_weights_are_read(monkeypatch):
    from mismatch.model import loader
    from mismatch.opd import OPDConfig

    monkeypatch.setattr(loader, "_load", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(InputError, match="spreads a model over CUDA devices"):
        mismatch.load("tiny-llama", device="balanced")
    with pytest.raises(ValueError, match="OPD trains on one device"):
        OPDConfig(pair="sort-gpt2", device="balanced")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_balanced_spreads_over_every_gpu_and_probes_as_one_gpu_within_rounding():
    from mismatch.model.head import head_inputs
    from mismatch.model.positions import response_index

    one, spread_lm = mismatch.load("smollm2-135m", device="cuda:0"), mismatch.load("smollm2-135m", device="balanced")
    assert len({p.device for p in spread_lm.model.parameters()}) >= 2
    batch = generate(one, ["Name a colour.", "Count to three."], max_new_tokens=8, seed=0)
    index = response_index(batch.response_mask)
    a = head_inputs(one.model, batch.input_ids, batch.attention_mask, index).rows_ND
    b = head_inputs(spread_lm.model, batch.input_ids, batch.attention_mask, index).rows_ND
    torch.testing.assert_close(b.to(a.device), a, rtol=1e-4, atol=1e-5)  # same kernels, another device's order
