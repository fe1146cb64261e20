"""Torch-native kinds against slow, obvious recomputations of what they claim to do."""

import pytest
import torch
import torch.nn.functional as F

import mismatch
from mismatch.perturb import perturbed
from tests.conftest import random_ids


def _fp8_rows(x, fmt="e4m3"):
    """Row by row: scale = absmax / max(fp8), round through float8, scale back (fp32)."""
    dtype, fmax = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}[fmt]
    out = torch.empty_like(x)
    for i, row in enumerate(x.float()):
        s = row.abs().max() / fmax
        out[i] = (row / s).to(dtype).float() * s if s > 0 else row
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_w8a8_rounds_each_tokens_activation_as_well_as_the_weight(fmt):
    """`fp8-…:channel,w8a8` on a layer: its output is F.linear of the per-token FP8-rounded input and
    the per-channel FP8-rounded weight. Weight rounding alone already differs from the model, so
    the comparison with the weight-only output tells whether activations are rounded at all."""
    lm = mismatch.load("tiny-llama")
    layer = lm.model.model.layers[1].self_attn.q_proj
    seen = {}
    handle = layer.register_forward_hook(lambda _m, args, out: seen.update(x=args[0].detach(), y=out.detach()))
    try:
        with torch.no_grad(), perturbed(lm.model, f"fp8-{fmt}:channel,w8a8", layers="1"):
            lm.model(random_ids(2, 9, seed=6))
    finally:
        handle.remove()
    # the hook runs after w8a8's pre-hook: recover the layer's raw input by running the block's norm again
    with torch.no_grad():
        raw = {}
        h = lm.model.model.layers[1].input_layernorm.register_forward_hook(lambda _m, _a, out: raw.update(x=out))
        try:
            lm.model(random_ids(2, 9, seed=6))
        finally:
            h.remove()
    x = raw["x"].reshape(-1, raw["x"].shape[-1])
    w_q = _fp8_rows(layer.weight.detach(), fmt)
    want = F.linear(_fp8_rows(x, fmt), w_q).reshape(seen["y"].shape)
    weight_only = F.linear(x, w_q).reshape(seen["y"].shape)
    # the same fp32 matmul of the same operands: only its summation order may differ (rel ~1e-6)
    torch.testing.assert_close(seen["y"], want, rtol=1e-5, atol=1e-6)
    assert (seen["y"] - weight_only).abs().max() > 100 * 1e-5 * weight_only.abs().max()
