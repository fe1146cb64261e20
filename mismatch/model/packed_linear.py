"""Faster incremental decoding on the CPU: the model's linear layers run on oneDNN with weights
packed once per `generate` call.

Why: a decode step multiplies a few rows (one per sequence) by every weight matrix, so it should
cost about one read of the weights. On the CPUs here `torch`'s default fp32 GEMM (MKL) streams the
weights at ~7 GB/s for 8 rows, against ~30 GB/s of memory bandwidth; oneDNN's matmul on weights
reordered for its kernel (`mkldnn::_reorder_linear_weight`, the layout `torch.compile` uses when
it freezes a model) reaches ~11 GB/s on the same stream (docs/benchmarks.md). A static KV cache
adds ~10% on top and a compiled decode step (`torch.compile`, inductor) nothing
(`benchmarks/bench_opd.py --compile` measures all of them): the step is bound by the GEMMs.

What changes: only the rounding of the linear layers' fp32 dot products (another summation
order). Logits stay within fp32 rounding of the default path (tested), so sampled tokens are the
same except at near-ties. Log-probabilities used as numbers (`mismatch.model.generate.sequence_logprobs`, the
probes) never run through here.

Scope: modules whose type is exactly `torch.nn.Linear` with an fp32 CPU weight of at least
`MIN_PACKED_ELEMENTS` elements (tiny matrices gain nothing), and only without autograd. Other
layers (GPT-2's `Conv1D`, bitsandbytes / quanto layers, anything on CUDA) keep their own forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

MIN_PACKED_ELEMENTS = 1 << 16  # below this a weight matrix fits in cache: packing buys nothing


def onednn_available() -> bool:
    """Whether this `torch` build has the oneDNN linear ops used here."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and mkldnn is not None
            and hasattr(mkldnn, "_reorder_linear_weight") and hasattr(mkldnn, "_linear_pointwise"))


def packable(module: nn.Module) -> bool:
    """True for an exact `nn.Linear` with an fp32 CPU weight of ≥ `MIN_PACKED_ELEMENTS` elements."""
    if type(module) is not nn.Linear:
        return False
    weight = module.weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.numel() >= MIN_PACKED_ELEMENTS


def _packed_forward(weight_packed: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if not rows.is_contiguous():
            rows = rows.contiguous()
        y = torch.ops.mkldnn._linear_pointwise(rows, weight_packed, bias, "none", [None], "")
        return y.reshape(*x.shape[:-1], y.shape[-1])
    return forward


@contextlib.contextmanager
def packed_linears(model: nn.Module, *, rows: int | None = None) -> Iterator[int]:
    """Inside the block, every `packable` linear layer of `model` computes `x @ W.T + b` with
    oneDNN on a packed copy of its weight taken on entry (weights changed inside the block are
    not seen). Yields the number of layers packed (0 when oneDNN is unavailable or autograd is
    on: nothing changes then). `rows`: the expected number of input rows (the batch), a hint for
    the packed layout. On exit every layer's own `forward` is back."""
    if torch.is_grad_enabled() or not onednn_available():
        yield 0
        return
    patched: list[nn.Module] = []
    try:
        for module in model.modules():
            if packable(module) and "forward" not in module.__dict__:
                weight_packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows)
                bias = None if module.bias is None else module.bias.detach()
                module.forward = _packed_forward(weight_packed, bias)
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
