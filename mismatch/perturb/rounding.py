"""Torch-native weight and activation rounding: FP8 (e4m3fn / e5m2) and symmetric integers.

FP8 follows the usual "absmax scale, cast, dequantize" recipe (as in torchao's float8 and
vLLM's fp8 weight quantization): s = absmax / fmax per tensor, per output channel or per
128×128 block; W ≈ s · cast_fp8(clamp(W / s, ±fmax)). The clamp makes saturation explicit:
torch's cast to float8_e4m3fn turns out-of-range values into NaN. All-zero groups get s = 1.
On CPU the matmul then runs in fp32 on the de-quantized weights; this equals `torch._scaled_mm`
up to fp32 rounding (measured 3e-7 relative) and is ~1000x faster there.

Integers are symmetric: s = absmax / qmax (qmax = 127 or 7) per output channel or per group of
N input columns; W ≈ s · clamp(round(W / s), −qmax − 1, qmax) (round half to even, as torch.round).

Both take a stack of matrices `[..., out, in]` (MoE experts `[E, out, in]`): each matrix is rounded
as if alone, so "tensor", "channel", "group" and "block" live within one expert's matrix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_max(fmt: str) -> float:
    """Largest finite value of the FP8 format (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(FP8_DTYPES[fmt]).max)


def _safe_scale(absmax: torch.Tensor, qmax: float) -> torch.Tensor:
    scale = absmax / qmax
    return torch.where(absmax > 0, scale, torch.ones_like(scale))


def to_fp8(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """`x / scale`, saturated at ±fmax and cast to the FP8 dtype: the stored values of the recipe."""
    fmax = fp8_max(fmt)
    return (x / scale).clamp_(-fmax, fmax).to(FP8_DTYPES[fmt])


def _cast_fp8(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    return to_fp8(x, scale, fmt).to(x.dtype) * scale


def fp8_scale(x: torch.Tensor, fmt: str, dim: int | tuple[int, ...] = -1) -> torch.Tensor:
    """The absmax scale `absmax / fmax` over `dim` (kept), 1 where the group is all zero (fp32)."""
    return _safe_scale(x.float().abs().amax(dim=dim, keepdim=True), fp8_max(fmt))


def round_fp8(weight_RC: torch.Tensor, fmt: str, granularity: str) -> torch.Tensor:
    """Round a weight `[R, C]` (out × in) through FP8 with an absmax scale; returns its dtype.

    Leading dimensions are a stack of independent matrices (MoE experts `[E, R, C]`): every scale
    then lives within one matrix, exactly as if each were rounded on its own.

    Args:
        weight_RC: weight matrix `[..., R, C]` (any float dtype; computed in fp32).
        fmt: "e4m3" or "e5m2".
        granularity: "tensor" (one scale per matrix), "channel" (per output row) or "block128"
            (128×128 tiles; edge tiles of shapes not divisible by 128 use their own absmax).
    """
    w = weight_RC.float()
    if granularity == "tensor":
        out = _cast_fp8(w, fp8_scale(w, fmt, dim=(-2, -1)), fmt)
    elif granularity == "channel":
        out = _cast_fp8(w, fp8_scale(w, fmt), fmt)
    elif granularity == "block128":
        *lead, R, C = w.shape
        pr, pc = -R % 128, -C % 128
        padded = F.pad(w, (0, pc, 0, pr))  # zeros never raise an absmax
        tiles = padded.reshape(*lead, (R + pr) // 128, 128, (C + pc) // 128, 128)  # [..., Rb, 128, Cb, 128]
        scale = fp8_scale(tiles, fmt, dim=(-3, -1))
        out = _cast_fp8(tiles, scale, fmt).reshape(*lead, R + pr, C + pc)[..., :R, :C]
    else:
        raise ValueError(f"unknown FP8 granularity {granularity!r}")
    return out.to(weight_RC.dtype)


def round_fp8_per_token(x_TD: torch.Tensor, fmt: str, group: int | None = None) -> torch.Tensor:
    """Dynamic FP8 rounding of activations `[..., D]`: an absmax scale per token (the last dim), or per
    token and `group` consecutive columns (the last group may be shorter: vLLM's per-token-group
    quantization before its block-FP8 GEMM, group 128)."""
    x = x_TD.float()
    if group is None or group >= x.shape[-1]:
        return _cast_fp8(x, fp8_scale(x, fmt), fmt).to(x_TD.dtype)
    parts = [_cast_fp8(x[..., a: a + group], fp8_scale(x[..., a: a + group], fmt), fmt)
             for a in range(0, x.shape[-1], group)]
    return torch.cat(parts, dim=-1).to(x_TD.dtype)


def round_int(weight_RC: torch.Tensor, bits: int, group_size: int | None) -> torch.Tensor:
    """Symmetric integer rounding of a weight `[R, C]`, per output channel (`group_size=None`)
    or per group of `group_size` input columns (the last group may be shorter). Leading
    dimensions are a stack of independent matrices (MoE experts `[E, R, C]`)."""
    qmax = 2 ** (bits - 1) - 1
    w = weight_RC.float()
    *lead, R, C = w.shape
    g = C if group_size is None else group_size
    pad = -C % g
    groups = F.pad(w, (0, pad)).reshape(*lead, R, (C + pad) // g, g)  # [..., R, G, g]
    scale = _safe_scale(groups.abs().amax(dim=-1, keepdim=True), qmax)
    q = torch.clamp(torch.round(groups / scale), -qmax - 1, qmax) * scale
    return q.reshape(*lead, R, C + pad)[..., :C].to(weight_RC.dtype)
