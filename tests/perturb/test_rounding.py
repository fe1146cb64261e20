"""Torch-native rounding against torch's own FP8 casts and obvious loops."""

import itertools

import pytest
import torch

from mismatch.perturb.rounding import round_fp8, round_fp8_per_token, round_int
from tests.conftest import slow_fp8_round, slow_int_round


def _weight(rows, cols, seed=0):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    w[1] = 0.0  # an all-zero output channel
    w[2, 3] = 40.0  # an outlier
    return w


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity,shape", [("tensor", (20, 33)), ("channel", (20, 33)),
                                               ("block128", (130, 260))])  # 130 × 260: not divisible by 128
def test_fp8_equals_torch_cast_bit_for_bit(fmt, granularity, shape):
    w = _weight(*shape)
    got = round_fp8(w, fmt, granularity)
    assert torch.equal(got, slow_fp8_round(w, fmt, granularity))
    assert torch.isfinite(got).all()
    assert (got[1] == 0).all()  # all-zero row stays zero, no NaN from a zero scale


def test_fp8_absmax_saturates_instead_of_nan():
    w = torch.tensor([[1e30, -1e30, 1.0], [448.0, -448.0, 0.0]])
    for fmt, gran in itertools.product(("e4m3", "e5m2"), ("tensor", "channel", "block128")):
        out = round_fp8(w, fmt, gran)
        assert torch.isfinite(out).all()
        # the absmax element maps to ±fmax, which FP8 represents exactly
        assert float(out[0, 0]) == pytest.approx(1e30, rel=1e-6)
        assert float(out[0, 1]) == pytest.approx(-1e30, rel=1e-6)
        if gran == "channel":
            assert out[1, 0] == 448.0 and out[1, 1] == -448.0


def test_fp8_per_token_activations():
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(1))
    x[0, 0] = 0
    out = round_fp8_per_token(x, "e4m3")
    for b, t in itertools.product(range(3), range(5)):
        amax = float(x[b, t].abs().max())
        scale = torch.tensor(amax / 448.0 if amax > 0 else 1.0)
        ref = torch.clamp(x[b, t] / scale, -448, 448).to(torch.float8_e4m3fn).float() * scale
        assert torch.equal(out[b, t], ref)


def test_fp8_per_token_group_activations_scale_each_128_columns_on_their_own():
    x = torch.randn(2, 3, 300, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 2, 300)
    out = round_fp8_per_token(x, "e4m3", group=128)
    for b, t in itertools.product(range(2), range(3)):
        for a in (0, 128, 256):  # the last group holds 44 columns
            part = x[b, t, a: a + 128]
            scale = torch.tensor(float(part.abs().max()) / 448.0)
            ref = torch.clamp(part / scale, -448, 448).to(torch.float8_e4m3fn).float() * scale
            assert torch.equal(out[b, t, a: a + 128], ref)
    assert torch.equal(round_fp8_per_token(x, "e4m3", group=512), round_fp8_per_token(x, "e4m3"))


@pytest.mark.parametrize("bits,group", [(8, None), (4, 128), (4, 32), (8, 128), (3, 32), (3, None), (2, 32), (2, 128)])
def test_int_rounding_matches_loop(bits, group):
    w = _weight(6, 300)  # 300 is not a multiple of 128: a short last group
    got = round_int(w, bits, group)
    assert torch.equal(got, slow_int_round(w, bits, group))
    levels = {len(torch.unique(got[i, s:s + (group or 300)])) for i in range(6) for s in range(0, 300, group or 300)}
    assert max(levels) <= 2 ** bits
