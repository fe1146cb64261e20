"""The real FP8 GEMM (`fp8-…,w8a8,scaled_mm`) against an exact float64 recomputation of the same
quantized operands, within the rounding bound of its fp32 arithmetic; against the fake-quantized W8A8
path; and restored bit for bit.

The bound (module docstring of `mismatch.perturb.fp8_gemm`): every product of two FP8 values is exact in
fp32, and each of the at most K + B + 4 fp32 operations a term goes through (de-quantizing or scaling by
s_a and s_b, the K-term sum, the B per-block partial sums, the bias) costs at most one unit roundoff
u = 2⁻²⁴ of the magnitudes involved, so |y − y_exact| ≤ γ_{K+B+4} · (Σ_k |a_k s_a||b_k s_b| + |bias|),
γ_n = n·u / (1 − n·u). Any fp32 kernel — blocked, vectorised, any summation order — meets it."""

import pytest
import torch

import mismatch
from mismatch.errors import InputError
from mismatch.perturb import parse_spec, perturb_, perturbed, restore_
from mismatch.perturb.fp8_gemm import FP8Weight, fp8_linear, quantize_activations
from mismatch.perturb.rounding import round_fp8
from tests.conftest import random_ids

U = 2.0 ** -24


def _gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _exact(x, weight: FP8Weight, bias):
    """y = Σ_groups (q_a s_a)(q_b s_b)ᵀ + b in float64, and Σ |terms| + |b| (the bound's magnitude)."""
    K = x.shape[-1]
    y = torch.zeros(x.shape[0], weight.values_NK.shape[0], dtype=torch.float64)
    mag = torch.zeros_like(y)
    for j, ((a, b), (qa, sa)) in enumerate(zip(weight.columns(K), quantize_activations(x, weight))):
        lhs = qa.double() * sa.double()
        rhs = weight.values_NK[:, a:b].double() * weight.scale_NB[:, j: j + 1].double()
        y += lhs @ rhs.T
        mag += lhs.abs() @ rhs.abs().T
    if bias is not None:
        y += bias.double()
        mag += bias.double().abs()
    return y, mag


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block128"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("M, K, N", [(7, 64, 48), (5, 300, 130), (1, 576, 192)])
def test_the_gemm_is_exact_up_to_its_fp32_rounding(fmt, granularity, M, K, N):
    gen = torch.Generator().manual_seed(M * K + N)
    w = torch.randn(N, K, generator=gen) * torch.logspace(-2, 1, N)[:, None]  # rows of very different scales
    x = torch.randn(M, K, generator=gen) * 3
    if M > 1:
        x[1] = 0.0  # an all-zero token: scale 1, output the bias
    bias = torch.randn(N, generator=gen)
    weight = FP8Weight(w, fmt, granularity)
    y = fp8_linear(x, weight, bias)
    want, mag = _exact(x, weight, bias)
    B = len(weight.columns(K))
    assert y.dtype == torch.float32 and y.shape == (M, N)
    excess = (y.double() - want).abs() - _gamma(K + B + 4) * mag
    assert excess.max() <= 0, f"beyond the fp32 bound by {excess.max():.3g}"
    # the stored weight is the recipe's: its de-quantized value is round_fp8's, bit for bit
    assert torch.equal(weight.dequantized(torch.float32), round_fp8(w, fmt, granularity))


@pytest.mark.parametrize("fmt, granularity", [("e4m3", "channel"), ("e5m2", "channel"), ("e4m3", "block128")])
def test_on_a_model_it_equals_the_fake_quantized_w8a8_within_twice_the_bound(fmt, granularity):
    """The same quantized operands (the weights' scales; activations per token, per 128 columns for
    block128) multiplied two ways: the kernel's FP8 GEMM and the fake-quantized path's fp32 matmul of the
    de-quantized operands. Each is within γ · Σ|terms| of the exact product, so within twice that of each
    other. Compared at block 1's q projection, whose input (block 0 is not perturbed) is the same bit for
    bit in both runs: further in, an ulp of difference can move an activation across an FP8 rounding
    boundary, and the two paths then differ by that activation's FP8 step, not by the GEMM's rounding."""
    lm = mismatch.load("tiny-llama")
    layer = lm.model.model.layers[1].self_attn.q_proj
    seen: dict[str, torch.Tensor] = {}
    ids = random_ids(2, 9, seed=4)
    for tag, spec in (("fake", f"fp8-{fmt}:{granularity},w8a8"), ("kernel", f"fp8-{fmt}:{granularity},w8a8,scaled_mm")):
        # registered before the perturbation: the pre-hook sees the raw input, ahead of w8a8's rounding
        pre = layer.register_forward_pre_hook(lambda _m, args, tag=tag: seen.update({f"{tag}_x": args[0].detach()}))
        post = layer.register_forward_hook(lambda _m, _a, out, tag=tag: seen.update({f"{tag}_y": out.detach()}))
        try:
            with torch.no_grad(), perturbed(lm.model, spec, layers="1"):
                lm.model(ids)
        finally:
            pre.remove()
            post.remove()
    assert torch.equal(seen["fake_x"], seen["kernel_x"])  # the premise: the same input
    x = seen["kernel_x"].reshape(-1, seen["kernel_x"].shape[-1])
    weight = FP8Weight(layer.weight.detach(), fmt, granularity)
    _, mag = _exact(x, weight, None)
    K, B = x.shape[-1], len(weight.columns(x.shape[-1]))
    diff = (seen["kernel_y"].reshape(-1, mag.shape[1]).double() - seen["fake_y"].reshape(-1, mag.shape[1]).double())
    assert (diff.abs() - 2 * _gamma(K + B + 4) * mag).max() <= 0
    # and the kernel ran on FP8 activations: not the weight-only product of the raw input
    weight_only = x @ weight.dequantized(torch.float32).T
    assert (seen["kernel_y"].reshape(weight_only.shape) - weight_only).abs().max() > 100 * _gamma(K + 5) * mag.max()


def test_it_is_restored_bit_for_bit_and_parses_only_with_w8a8():
    lm = mismatch.load("tiny-qwen3")
    ids = random_ids(2, 7, seed=1)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    with torch.no_grad():
        base = lm.model(ids).logits
        snap = perturb_(lm.model, "fp8-e4m3:block128,w8a8,scaled_mm", layers="linear")
        changed = lm.model(ids).logits
        routed = [m for m in lm.model.modules() if "forward" in m.__dict__]
        restore_(lm.model, snap)
        after = lm.model(ids).logits
    assert len(routed) == len(snap.names) > 0 and not any("forward" in m.__dict__ for m in lm.model.modules())
    assert not torch.equal(changed, base) and torch.equal(after, base)
    assert all(torch.equal(v, before[k]) for k, v in lm.model.state_dict().items())
    assert str(parse_spec("fp8-e4m3:channel,w8a8,scaled_mm")) == "fp8-e4m3:channel,w8a8,scaled_mm"
    with pytest.raises(InputError, match="give w8a8 too"):
        parse_spec("fp8-e4m3:channel,scaled_mm")


def test_fused_moe_experts_are_refused_before_anything_changes():
    """An experts module's GEMMs are fused inside its own forward: the kernel cannot take them, and the
    scope is refused whole (the router, an `nn.Linear`, would take it) — nothing is changed."""
    lm = mismatch.load("tiny-qwen3-moe")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    with pytest.raises(InputError, match="experts"):
        perturb_(lm.model, "fp8-e4m3:channel,w8a8,scaled_mm", layers="linear")
    assert all(torch.equal(v, before[k]) for k, v in lm.model.state_dict().items())
    assert not any("forward" in m.__dict__ for m in lm.model.modules())
    with torch.no_grad(), perturbed(lm.model, "fp8-e4m3:channel,w8a8,scaled_mm", layers="attn"):
        assert lm.model(random_ids(1, 5)).logits.isfinite().all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the kernel's bf16 output on a GPU)")
def test_on_cuda_the_bf16_output_adds_one_bf16_rounding():
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(256, 512, generator=gen), torch.randn(32, 512, generator=gen)
    weight = FP8Weight(w.cuda(), "e4m3", "channel")
    y = fp8_linear(x.cuda(), weight, None).cpu()
    want, mag = _exact(x, FP8Weight(w, "e4m3", "channel"), None)
    assert ((y.double() - want).abs() - (_gamma(512 + 5) * mag + 2.0 ** -8 * want.abs())).max() <= 0
