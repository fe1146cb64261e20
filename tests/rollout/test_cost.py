"""The analytic rollout cost against shapes counted by hand from tiny-llama's configuration."""

import pytest

import mismatch
from mismatch.rollout.cost import generation_speed, measured_cost, rollout_cost
from mismatch.errors import InputError

# tiny-llama: vocab 259, hidden 64, MLP 128, 3 blocks, 4 heads of 16, 2 KV heads, untied head, fp32
BLOCK = {"q": 64 * 64, "k": 64 * 32, "v": 64 * 32, "o": 64 * 64, "gate": 64 * 128, "up": 64 * 128, "down": 128 * 64}
LINEAR = 3 * sum(BLOCK.values())
NORMS = 3 * 2 * 64 + 64
HEAD = 259 * 64
TOTAL = LINEAR + NORMS + HEAD  # the input embedding reads one row per token: left out


def test_weight_bytes_and_matmul_cost_follow_the_shapes():
    model = mismatch.load("tiny-llama").model
    c = rollout_cost(model, "fp8-e4m3:channel")
    assert c.reference_bits == 32 and c.label == "analytic"
    assert c.weight_bytes == pytest.approx(((TOTAL - LINEAR) * 32 + LINEAR * 8) / (TOTAL * 32), rel=1e-12)
    assert c.matmul_cost == 1.0  # weight-only: de-quantized, multiplied at fp32
    w8a8 = rollout_cost(model, "fp8-e4m3:channel,w8a8")
    assert w8a8.matmul_cost == pytest.approx((HEAD + LINEAR * 8 / 32) / (HEAD + LINEAR), rel=1e-12)
    kept = [f"model.layers.0.mlp.{m}_proj" for m in ("gate", "up")]
    k = rollout_cost(model, "int8:channel", kept=kept)
    q = LINEAR - BLOCK["gate"] - BLOCK["up"]
    assert k.weight_bytes == pytest.approx(((TOTAL - q) * 32 + q * 8) / (TOTAL * 32), rel=1e-12)


def test_reuse_divides_and_staleness_overlaps():
    model = mismatch.load("tiny-llama").model
    base = rollout_cost(model, "int8:channel", rollout_share=0.6)
    assert base.step_wall == pytest.approx(0.6 * base.weight_bytes + 0.4)
    reused = rollout_cost(model, "int8:channel", reuse=4, rollout_share=0.6)
    assert reused.rollout_cost == pytest.approx(base.weight_bytes / 4)
    stale = rollout_cost(model, "int8:channel", staleness=1, rollout_share=0.6)
    assert stale.rollout_cost == base.rollout_cost and stale.step_wall == pytest.approx(max(0.6 * base.weight_bytes, 0.4))
    noisy = rollout_cost(model, "noise:0.1", reuse=2, rollout_share=0.6)  # a full-precision copy
    assert (noisy.weight_bytes, noisy.rollout_cost, noisy.step_wall) == (1.0, 0.5, pytest.approx(0.3 + 0.4))
    with pytest.raises(InputError, match="staleness=K"):
        rollout_cost(model, "stale:2")
    with pytest.raises(InputError, match="rollout_share"):
        rollout_cost(model, "int8:channel", rollout_share=1.0)


def test_a_tied_head_is_counted_once_and_quantized_with_all():
    model = mismatch.load("tiny-qwen3").model  # tied embeddings: the head is the embedding, read in full
    linear = sum(p.numel() for n, p in model.named_parameters() if "layers" in n and n.endswith("proj.weight"))
    total = sum(p.numel() for p in model.parameters())  # named_parameters counts the tied matrix once
    c = rollout_cost(model, "int8:channel", layers="all")
    assert c.weight_bytes == pytest.approx(((total - linear - 259 * 64) * 32 + (linear + 259 * 64) * 8) / (total * 32))


def test_generation_speed_counts_the_generated_tokens():
    import torch

    from mismatch.model.generate import generate

    lm = mismatch.load("tiny-llama")
    prompts = ["a b c", "hello"]
    speed = generation_speed(lm, "int8:channel", prompts, max_new_tokens=6, device="cpu")
    with mismatch.perturbed(lm.model, "int8:channel") as cand:
        batch = generate(mismatch.LM(cand, lm.tokenizer, "c"), prompts, max_new_tokens=6, temperature=1.0, seed=0)
    assert speed["tokens"] == batch.response_tokens and speed["tokens_per_s"] == speed["tokens"] / speed["seconds"]
    if not torch.cuda.is_available():
        assert measured_cost(lm, "bnb-nf4", prompts) is None  # analytic only without CUDA


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA: measured generation speed")
@pytest.mark.parametrize("spec", ["bnb-nf4", "fp8-e4m3:channel,w8a8,scaled_mm"])  # kernels of their own: measured
def test_measured_cost_on_cuda_is_labelled_and_positive(spec):
    if spec.startswith("bnb"):
        pytest.importorskip("bitsandbytes")  # a lent GPU image without the project's venv lacks it
    lm = mismatch.load("tiny-llama")  # widths 64 / 128: multiples of 16, as the FP8 kernel needs
    got = measured_cost(lm, spec, ["What is the capital of France?"] * 8)
    assert got["label"] == "measured" and got["rollout_cost"] > 0 and got["reference_tokens_per_s"] > 0
    assert got["rollout_tokens_per_s"] > 0 and got["device"]


def test_only_formats_with_kernels_of_their_own_are_timed():
    from mismatch.perturb import parse_spec
    from mismatch.rollout.cost import has_real_kernels

    assert has_real_kernels(parse_spec("fp8-e4m3:channel,w8a8,scaled_mm")) and has_real_kernels(parse_spec("bnb-nf4"))
    assert not has_real_kernels(parse_spec("fp8-e4m3:channel,w8a8")) and not has_real_kernels(parse_spec("int4:group128"))


# tiny-qwen3-moe: 2 blocks, attention as above with q/k norms of 16, 8 experts of width 160, top-2, untied head
MOE_ATTN = 2 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64)
MOE_EXPERTS = 2 * 8 * (320 * 64 + 64 * 160)  # gate_up [8, 320, 64] + down [8, 64, 160] per block
MOE_ACTIVE = MOE_EXPERTS * 2 / 8  # a decoded token reads its top-2 of 8 experts
MOE_ROUTERS = 2 * 8 * 64
MOE_READ = MOE_ATTN + MOE_ACTIVE + MOE_ROUTERS + 2 * (16 + 16 + 64 + 64) + 64 + HEAD


def test_an_moe_token_reads_and_multiplies_only_its_active_experts():
    model = mismatch.load("tiny-qwen3-moe").model
    q = MOE_ATTN + MOE_ACTIVE
    c = rollout_cost(model, "int8:channel")  # linear: attention and experts; routers full precision
    assert c.weight_bytes == pytest.approx(((MOE_READ - q) * 32 + q * 8) / (MOE_READ * 32), rel=1e-12)
    bf16 = rollout_cost(model, "dtype:bf16")
    matmuls = HEAD + MOE_ROUTERS + MOE_ATTN + MOE_ACTIVE
    assert bf16.matmul_cost == pytest.approx((HEAD + MOE_ROUTERS + q * 16 / 32) / matmuls, rel=1e-12)
    k = rollout_cost(model, "int8:channel", kept=["model.layers.0.mlp.experts"])
    q_kept = q - MOE_ACTIVE / 2
    assert k.weight_bytes == pytest.approx(((MOE_READ - q_kept) * 32 + q_kept * 8) / (MOE_READ * 32), rel=1e-12)
    r = rollout_cost(model, "int8:channel", layers="router")
    routers = ((MOE_READ - MOE_ROUTERS) * 32 + MOE_ROUTERS * 8) / (MOE_READ * 32)
    assert r.weight_bytes == pytest.approx(routers, rel=1e-12)
