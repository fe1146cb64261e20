"""Torch-native rounding against torch's own FP8 casts and obvious loops."""

import itertools

import pytest
import torch

from mismatch.perturb.rounding import FP8_DTYPES, fp8_max, round_fp8, round_fp8_per_token, round_int


def _weight(rows, cols, seed=0):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    w[1] = 0.0  # an all-zero output channel
    w[2, 3] = 40.0  # an outlier
    return w


def _slow_fp8(w, fmt, block_of):
    """Scale each block by its own absmax (loops over blocks), cast with torch's dtype."""
    out = torch.empty_like(w)
    fmax = fp8_max(fmt)
    blocks = {}
    for i, j in itertools.product(range(w.shape[0]), range(w.shape[1])):
        blocks.setdefault(block_of(i, j), []).append((i, j))
    for cells in blocks.values():
        amax = max(abs(float(w[i, j])) for i, j in cells)
        scale = torch.tensor(amax / fmax if amax > 0 else 1.0, dtype=torch.float32)
        for i, j in cells:
            v = torch.clamp(w[i, j] / scale, -fmax, fmax)
            out[i, j] = v.to(FP8_DTYPES[fmt]).float() * scale
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity,shape,block_of", [
    ("tensor", (20, 33), lambda i, j: 0),
    ("channel", (20, 33), lambda i, j: i),
    ("block128", (130, 260), lambda i, j: (i // 128, j // 128)),  # not divisible by 128
])
def test_fp8_equals_torch_cast_bit_for_bit(fmt, granularity, shape, block_of):
    w = _weight(*shape)
    got = round_fp8(w, fmt, granularity)
    assert torch.equal(got, _slow_fp8(w, fmt, block_of))
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


def _slow_int(w, bits, group):
    qmax = 2 ** (bits - 1) - 1
    out = torch.empty_like(w)
    for i in range(w.shape[0]):
        cols = w.shape[1]
        g = cols if group is None else group
        for start in range(0, cols, g):
            seg = w[i, start:start + g]
            amax = float(seg.abs().max())
            scale = torch.tensor(amax / qmax if amax > 0 else 1.0, dtype=torch.float32)
            for j in range(seg.shape[0]):
                q = torch.round(seg[j] / scale).clamp(-qmax - 1, qmax)
                out[i, start + j] = q * scale
    return out


@pytest.mark.parametrize("bits,group", [(8, None), (4, 128), (4, 32), (8, 128), (3, 32), (3, None), (2, 32), (2, 128)])
def test_int_rounding_matches_loop(bits, group):
    w = _weight(6, 300)  # 300 is not a multiple of 128: a short last group
    got = round_int(w, bits, group)
    assert torch.equal(got, _slow_int(w, bits, group))
    levels = {len(torch.unique(got[i, s:s + (group or 300)])) for i in range(6) for s in range(0, 300, group or 300)}
    assert max(levels) <= 2 ** bits
