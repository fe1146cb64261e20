"""FP8 linear layers on a real FP8 GEMM (`torch._scaled_mm`), as an FP8 inference engine runs them.

`fp8-e4m3:channel,w8a8,scaled_mm` (and `tensor`, `block128`, e5m2) replaces each selected linear layer's
matmul by the engine's: weights stored in FP8 with their absmax scales (per tensor, per output channel, or
per 128×128 block: the recipe of `mismatch.perturb.rounding.round_fp8`), activations cast to FP8 at run time
with a dynamic absmax scale per token (per token and 128 input columns for `block128`: vLLM's
`per_token_group_quant_fp8` before its block-FP8 GEMM), the product of the FP8 operands accumulated in
higher precision and scaled by `scale_a · scale_b` inside the kernel (`torch._scaled_mm` with row-wise
scales; a `block128` layer is one such GEMM per 128 input columns, summed in fp32, as block-FP8 kernels
accumulate). The bias is added after, in the output's precision.

The fake-quantized path (`…,w8a8` without `scaled_mm`) de-quantizes both operands and multiplies in the
model's precision; the two differ only by where the products are rounded and summed: each product of two
FP8 values is exact in fp32 (4 + 4 significant bits), so on a CPU, where the kernel accumulates in fp32,
each of the ≤ K + B + 4 fp32 operations a term meets (scaling, the K-term sum, B column groups' partial
sums, the bias) costs at most one unit roundoff u = 2⁻²⁴: |kernel − exact| ≤ γ_{K+B+4}·(Σ_k |a_k s_a||b_k s_b|
+ |bias|), γ_n = n·u / (1 − n·u) — tested. On CUDA the kernel writes bf16 (row-wise scaling requires it on
Hopper), so one more rounding (2⁻⁸ relative) follows.

The layer's weight is also swapped for its de-quantized FP8 value, so whatever reads the weight (hashes,
exports, the cost model) sees the rounded one; `restore_` removes the kernel and puts the weight back bit
for bit. Only `nn.Linear` and GPT-2's `Conv1D` are replaced (an MoE experts module or a router keeps
weight-only FP8: their GEMMs are fused inside their own forward).
"""

from __future__ import annotations

import torch
from torch import nn

from mismatch.errors import InputError
from mismatch.perturb import rounding

BLOCK = 128  # input columns per activation scale and per weight block (`block128`)


def is_linear(module: nn.Module) -> bool:
    """A layer whose forward is `x @ W.T + b` on its last dimension: `nn.Linear` or GPT-2's `Conv1D`."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


class FP8Weight:
    """A weight `[N, K]` stored as the FP8 GEMM wants it: FP8 values `[N, K]` and fp32 scales `[N, B]` for
    B groups of input columns (B = 1 unless `block128`: one per 128 columns, each block's own scale)."""

    def __init__(self, weight_NK: torch.Tensor, fmt: str, granularity: str) -> None:
        w = weight_NK.detach().float()
        N, K = w.shape
        if granularity == "tensor":
            scale = rounding.fp8_scale(w, fmt, dim=(-2, -1)).expand(N, 1)
        elif granularity == "channel":
            scale = rounding.fp8_scale(w, fmt, dim=-1)
        elif granularity == "block128":
            pr, pc = -N % BLOCK, -K % BLOCK
            tiles = nn.functional.pad(w, (0, pc, 0, pr)).reshape((N + pr) // BLOCK, BLOCK, (K + pc) // BLOCK, BLOCK)
            per_tile = rounding.fp8_scale(tiles, fmt, dim=(-3, -1))  # [Nb, 1, Kb, 1]
            scale = per_tile.expand(-1, BLOCK, -1, 1).reshape(N + pr, (K + pc) // BLOCK)[:N]
        else:
            raise InputError(f"unknown FP8 granularity {granularity!r}")
        self.fmt, self.granularity, self.scale_NB = fmt, granularity, scale.contiguous()
        # one contiguous `[N, k]` block per column group: its transpose is the column-major operand the GEMM takes
        self.blocks = [rounding.to_fp8(w[:, a:b], self.scale_NB[:, j: j + 1], fmt).contiguous()
                       for j, (a, b) in enumerate(self.columns(K))]
        self.scales_1N = [self.scale_NB[:, j: j + 1].t().contiguous() for j in range(len(self.blocks))]

    @property
    def values_NK(self) -> torch.Tensor:
        """The stored FP8 values `[N, K]`."""
        return torch.cat(self.blocks, dim=1)

    def columns(self, K: int) -> list[tuple[int, int]]:
        """The input-column groups that share a scale: all K, or 128 at a time for `block128`."""
        step = BLOCK if self.granularity == "block128" else K
        return [(a, min(a + step, K)) for a in range(0, K, step)]

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight the GEMM multiplies by, `[N, K]` in `dtype` (what the fake-quantized path stores)."""
        return torch.cat([block.float() * self.scale_NB[:, j: j + 1] for j, block in enumerate(self.blocks)],
                         dim=1).to(dtype)


def quantize_activations(x_MK: torch.Tensor, weight: FP8Weight) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Dynamic FP8 activations per token (per token and column group for `block128`): per group of columns
    its FP8 values `[M, k]` and fp32 scales `[M, 1]`."""
    x = x_MK.float()
    out = []
    for a, b in weight.columns(x.shape[1]):
        scale = rounding.fp8_scale(x[:, a:b], weight.fmt)
        out.append((rounding.to_fp8(x[:, a:b], scale, weight.fmt), scale))
    return out


def fp8_linear(x: torch.Tensor, weight: FP8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ W.T + b` on the FP8 GEMM: `x` `[..., K]` in any float dtype, returned in its dtype."""
    lead, K = x.shape[:-1], x.shape[-1]
    out_dtype = torch.bfloat16 if x.is_cuda else torch.float32
    y = None
    activations = quantize_activations(x.reshape(-1, K), weight)
    for block, scale_1N, (qa, sa) in zip(weight.blocks, weight.scales_1N, activations):
        part = torch._scaled_mm(qa, block.t(), scale_a=sa, scale_b=scale_1N, out_dtype=out_dtype).float()
        y = part if y is None else y + part
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, -1)


class KernelHandle:
    """Undoes `install`: removes the instance `forward` that routes the layer through the FP8 GEMM (a
    `Snapshot.hooks` entry, removed by `restore_` like a hook)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def install(module: nn.Module, weight_NK: torch.Tensor, fmt: str, granularity: str) -> tuple[FP8Weight, KernelHandle]:
    """Route `module` (a layer `is_linear` accepts: the caller checks every target first) forward through
    `fp8_linear` with `weight_NK` (out × in) stored in FP8."""
    weight = FP8Weight(weight_NK, fmt, granularity)
    bias = getattr(module, "bias", None)
    module.forward = lambda x, *args, **kwargs: fp8_linear(x, weight, bias)  # instance attribute, hooks still run
    return weight, KernelHandle(module)
