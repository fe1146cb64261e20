"""The trainer's precision: a bf16 compute copy of the student over fp32 master weights.

Trainers do not run their forward in fp32. Megatron-LM's and DeepSpeed's bf16 optimizers, and FSDP's mixed
precision with bf16 parameters, keep the weights the optimizer steps in fp32 (the *masters*) and run every
forward and backward on a bf16 copy of them; after each step the masters are rounded into the copy. `OPDConfig`'s
`ref_dtype = "bf16"` reproduces that on one machine: the student's parameters become the bf16 compute copy —
so the student's sampling, its update, the rollout copy made from it and the evaluation all read bf16
weights, as the trainer and `mismatch check --ref-dtype bf16` do — the teacher's parameters are cast too (the
trainer scores with it in the same precision), buffers stay as the model holds them (RoPE's frequencies in
fp32, as `from_pretrained(dtype=…)` leaves them), and AdamW steps fp32 masters whose gradients are the copy's,
upcast. Log-probs, losses and metrics are computed from fp32 logits (`mismatch.model.head.Head.logits`).
At `fp32` the masters are the parameters themselves: nothing is copied and nothing changes.
"""

from __future__ import annotations

import torch
from torch import nn

from mismatch.errors import InputError
from mismatch.model.loader import parse_dtype
from mismatch.opd.config import TRAINER_DTYPES


def trainer_precision(dtype: str | torch.dtype) -> str:
    """`dtype` as the `OPDConfig.ref_dtype` a trainer runs in (`TRAINER_DTYPES`); another dtype is a one-line
    `InputError` (fp16 would need loss scaling)."""
    name = {parse_dtype(n): n for n in TRAINER_DTYPES}.get(parse_dtype(dtype))
    if name is None:
        raise InputError(f"a trainer runs in {' or '.join(TRAINER_DTYPES)}: not {dtype}")
    return name


def cast_parameters_(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast `model`'s floating parameters to `dtype` in place (the same `Parameter` objects, tied ones once);
    buffers are left as they are. Returns `model`."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return model


class MasterWeights:
    """What the optimizer steps: the student's trainable parameters, or fp32 masters under a bf16 copy.

    Args:
        model: the student, its parameters in their loaded precision: read into fp32 masters, then cast to
            `dtype` (a bf16 checkpoint's masters are its values, exactly).
        dtype: the compute precision; at `torch.float32` the masters are the model's own parameters.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.mixed = dtype != torch.float32
        masters = [p.detach().to(torch.float32, copy=True).requires_grad_() for p in self.params] if self.mixed else None
        cast_parameters_(model, dtype)
        self.masters = masters if self.mixed else self.params

    def zero_grad(self) -> None:
        for p in (*self.params, *(self.masters if self.mixed else ())):
            p.grad = None

    def grads_to_masters(self) -> None:
        """After backward: the copy's gradients, upcast, become the masters' (nothing to do unmixed)."""
        if self.mixed:
            for master, p in zip(self.masters, self.params):
                master.grad = None if p.grad is None else p.grad.to(torch.float32)

    @torch.no_grad()
    def write_back(self) -> None:
        """After the optimizer's step: round the masters into the compute copy (nothing to do unmixed)."""
        if self.mixed:
            for master, p in zip(self.masters, self.params):
                p.copy_(master)
