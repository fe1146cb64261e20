"""Torch-native perturbation kinds: FP8 and integer weight rounding, a lower dtype, weight noise.

Each handler swaps new parameters (and forward hooks) into the selected modules through
`mismatch.perturb.snapshot`, never writing into the model's tensors; the rounding recipes are in
`mismatch.perturb.rounding`. A selected module is a linear layer, an MoE router (its `[E, D]` weight
is one linear map) or an MoE experts module, whose every expert matrix is treated as one linear
layer (`weight_names`, `weight_out_in`: `[E, out, in]`). Registers `fp8-e4m3` / `fp8-e5m2`,
`int8` / `int4`, `dtype`, `noise`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mismatch.errors import InputError
from mismatch.model.loader import parse_dtype
from mismatch.model.moe import is_experts
from mismatch.perturb import fp8_gemm, rounding
from mismatch.perturb.configs import DtypeConfig, FP8Config, IntConfig, NoiseConfig
from mismatch.perturb.registry import ApplyContext
from mismatch.perturb.snapshot import (Snapshot, bias_names, named_targets, swap_param_, swap_weight_, weight_names,
                                       weight_out_in)


def _fp8_activation_hook(fmt: str, group: int | None) -> Callable:
    def pre_hook(_module, args):
        return (rounding.round_fp8_per_token(args[0], fmt, group), *args[1:])
    return pre_hook


def _dtype_hooks(dtype: torch.dtype) -> tuple[Callable, Callable]:
    """A pre-hook casting a layer's input to `dtype` and a post-hook casting its output back to the
    input's dtype, which the pair remembers in its own closure (a stack: calls may nest)."""
    in_dtypes: list[torch.dtype] = []

    def pre_hook(_module, args):
        in_dtypes.append(args[0].dtype)
        return (args[0].to(dtype), *args[1:])

    def post_hook(_module, _args, output):
        back = in_dtypes.pop()
        if isinstance(output, tuple):  # a router returns (logits, scores, expert ids)
            return tuple(o.to(back) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in output)
        return output.to(back)
    return pre_hook, post_hook


def _apply_fp8_(config: FP8Config, model: nn.Module, names: list[str], snap: Snapshot,
                ctx: ApplyContext) -> None:
    targets = named_targets(model, names)
    if config.w8a8:
        experts = next((name for name, module in targets if is_experts(module)), None)
        if experts is not None:
            raise InputError(f"{config} cannot round activations inside the fused experts {experts} (their down "
                             "projection's input never leaves the experts' forward); use weight-only fp8 there "
                             "or a scope without experts (attn)")
    if config.scaled_mm:  # every target must take the kernel before any is changed
        for name, module in targets:
            if not fp8_gemm.is_linear(module):
                raise InputError(f"{config} replaces the GEMM of linear layers only; {name} is a "
                                 f"{type(module).__name__} (use fp8-{config.fmt}:{config.granularity} there, or a "
                                 "scope without it)")
    for _, module in targets:
        for attr in weight_names(module):
            original = weight_out_in(module, attr)
            if config.scaled_mm:  # the layer's forward on the FP8 GEMM (activations quantized inside); before the
                # swap, which may offload the original
                snap.hooks.append(fp8_gemm.install(module, original, config.fmt, config.granularity)[1])
            swap_weight_(snap, module, rounding.round_fp8(original, config.fmt, config.granularity), attr)
        if config.w8a8 and not config.scaled_mm:
            group = fp8_gemm.BLOCK if config.granularity == "block128" else None  # as the kernel's activations
            snap.hooks.append(module.register_forward_pre_hook(_fp8_activation_hook(config.fmt, group)))


def _apply_int_(config: IntConfig, model: nn.Module, names: list[str], snap: Snapshot,
                ctx: ApplyContext) -> None:
    for _, module in named_targets(model, names):
        for attr in weight_names(module):
            swap_weight_(snap, module, rounding.round_int(weight_out_in(module, attr), config.bits, config.group_size),
                         attr)


def _apply_dtype_(config: DtypeConfig, model: nn.Module, names: list[str], snap: Snapshot,
                  ctx: ApplyContext) -> None:
    dtype = parse_dtype(config.dtype)
    for _, module in named_targets(model, names):
        for attr in weight_names(module):
            swap_weight_(snap, module, weight_out_in(module, attr).to(dtype), attr)
        for attr in bias_names(module):
            swap_param_(snap, module, attr, getattr(module, attr).detach().to(dtype))
        pre, post = _dtype_hooks(dtype)
        snap.hooks.append(module.register_forward_pre_hook(pre))
        snap.hooks.append(module.register_forward_hook(post))


def _apply_noise_(config: NoiseConfig, model: nn.Module, names: list[str], snap: Snapshot,
                  ctx: ApplyContext) -> None:
    """W ← W + σ·rms(W)·ε, ε ~ N(0, 1) drawn tensor by tensor in model order from one generator
    seeded with `ctx.seed` (so a scope's draws do not depend on other scopes); rms(W) per matrix
    (per expert, for an experts tensor `[E, out, in]`, drawn at once in that shape)."""
    if config.sigma == 0:
        return  # exactly the unperturbed model
    gen = torch.Generator().manual_seed(ctx.seed)
    for _, module in named_targets(model, names):
        for attr in weight_names(module):
            w = weight_out_in(module, attr)
            rms = w.float().pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()
            eps = torch.randn(w.shape, generator=gen, dtype=torch.float32).to(w.device)  # drawn on the CPU: the
            # same noise on every device
            swap_weight_(snap, module, (w.float() + config.sigma * rms * eps).to(w.dtype), attr)
