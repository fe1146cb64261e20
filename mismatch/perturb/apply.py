"""Apply a perturbation to a model in place, and restore it bit for bit.

A perturbation never writes into the model's own tensors: it swaps in new `Parameter` objects
(rounded, noised or cast weights), new modules (bitsandbytes / optimum-quanto layers) and
forward hooks (activation rounding, dtype casts). The `Snapshot` keeps the original objects, so
`restore_` puts back exactly what was there — bitwise by construction, also for tied weights
(perturbing `lm_head` of a tied model leaves the embedding untouched) — and it runs in
`finally` when `perturbed(...)`'s body raises. Per-layer isolation (`layers="7"`) touches only
that block's modules: no reload, no deep copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from mismatch.errors import InputError
from mismatch.models import parse_dtype
from mismatch.perturb import rounding
from mismatch.perturb.scope import first_block, select
from mismatch.perturb.spec import (
    BnbConfig,
    DtypeConfig,
    FP8Config,
    IntConfig,
    NoiseConfig,
    PerturbConfig,
    QuantoConfig,
    StaleConfig,
    parse_spec,
)

@dataclass
class Snapshot:
    """What `perturb_` replaced, to be put back by `restore_`."""

    spec: str
    layers: str
    names: list[str]
    first_block: int = 0  # index of the first decoder block it touches (the block count if none)
    params: list[tuple[nn.Module, str, nn.Parameter]] = field(default_factory=list)
    modules: list[tuple[nn.Module, str, nn.Module]] = field(default_factory=list)
    hooks: list = field(default_factory=list)
    restored: bool = False


def weight_out_in(module: nn.Module) -> torch.Tensor:
    """The weight of a linear layer as `[out, in]` (GPT-2's Conv1D stores `[in, out]`)."""
    return module.weight.detach().t() if isinstance(module, Conv1D) else module.weight.detach()


def _swap_param(snap: Snapshot, module: nn.Module, name: str, value: torch.Tensor) -> None:
    snap.params.append((module, name, getattr(module, name)))
    setattr(module, name, nn.Parameter(value, requires_grad=False))


def _swap_weight(snap: Snapshot, module: nn.Module, new_out_in: torch.Tensor) -> None:
    value = new_out_in.t().contiguous() if isinstance(module, Conv1D) else new_out_in
    _swap_param(snap, module, "weight", value)


def _fp8_activation_hook(fmt: str):
    def pre_hook(_module, args):
        return (rounding.round_fp8_per_token(args[0], fmt), *args[1:])
    return pre_hook


def _dtype_hooks(dtype: torch.dtype):
    def pre_hook(module, args):
        module._mismatch_in_dtype = args[0].dtype
        return (args[0].to(dtype), *args[1:])

    def post_hook(module, _args, output):
        return output.to(module.__dict__.pop("_mismatch_in_dtype"))
    return pre_hook, post_hook


def perturb_(model: nn.Module, config: PerturbConfig | str, layers: str = "linear",
             seed: int = 0, calibration_ids: torch.Tensor | None = None) -> Snapshot:
    """Perturb `model` in place; return the `Snapshot` that `restore_` needs.

    Args:
        model: a `transformers` causal LM.
        config: a perturbation config or spec string (`mismatch.perturb.spec`).
        layers: layer scope (`mismatch.perturb.scope`).
        seed: seed of the noise generator (`noise:SIGMA`).
        calibration_ids: `[B, T]` token ids to calibrate static activation scales
            (`quanto-…:a8` only).

    Raises:
        InputError: unknown spec or scope, `stale:K` outside an OPD run, or a backend that
            cannot run this spec here.
    """
    config = parse_spec(config) if isinstance(config, str) else config
    if isinstance(config, StaleConfig):
        raise InputError(f"{config} exists only inside an OPD trajectory (weights K optimizer steps old); "
                         "use it as the rollout spec of an OPD run")
    names = select(model, layers)
    modules = dict(model.named_modules())
    snap = Snapshot(spec=str(config), layers=layers, names=names, first_block=first_block(model, names))
    active_perturbations(model).append(snap)
    try:
        if isinstance(config, (BnbConfig, QuantoConfig)):
            from mismatch.perturb import backends

            backends.swap_(model, config, names, snap, calibration_ids)
            return snap
        gen = torch.Generator().manual_seed(seed)
        for name in names:
            module = modules[name]
            w = weight_out_in(module)
            if isinstance(config, FP8Config):
                _swap_weight(snap, module, rounding.round_fp8(w, config.fmt, config.granularity))
                if config.w8a8:
                    snap.hooks.append(module.register_forward_pre_hook(_fp8_activation_hook(config.fmt)))
            elif isinstance(config, IntConfig):
                _swap_weight(snap, module, rounding.round_int(w, config.bits, config.group_size))
            elif isinstance(config, NoiseConfig):
                if config.sigma == 0:
                    continue  # exactly the unperturbed model
                rms = w.float().pow(2).mean().sqrt()
                eps = torch.randn(w.shape, generator=gen, dtype=torch.float32)
                _swap_weight(snap, module, (w.float() + config.sigma * rms * eps).to(w.dtype))
            elif isinstance(config, DtypeConfig):
                dtype = parse_dtype(config.dtype)
                _swap_weight(snap, module, w.to(dtype))
                if module.bias is not None:
                    _swap_param(snap, module, "bias", module.bias.detach().to(dtype))
                pre, post = _dtype_hooks(dtype)
                snap.hooks.append(module.register_forward_pre_hook(pre))
                snap.hooks.append(module.register_forward_hook(post))
            else:  # pragma: no cover - every config type is handled above
                raise InputError(f"no handler for {config}")
    except BaseException:
        restore_(model, snap)
        raise
    return snap


def restore_(model: nn.Module, snapshot: Snapshot) -> None:
    """Undo `perturb_`: remove hooks, put back the original parameters and modules."""
    if snapshot.restored:
        return
    for handle in reversed(snapshot.hooks):
        handle.remove()
    for module, name, original in reversed(snapshot.params):
        setattr(module, name, original)
    for parent, child, original in reversed(snapshot.modules):
        setattr(parent, child, original)
    active = active_perturbations(model)
    if any(s is snapshot for s in active):
        active[:] = [s for s in active if s is not snapshot]
    snapshot.restored = True


def active_perturbations(model: nn.Module) -> list[Snapshot]:
    """Snapshots of the perturbations currently applied to `model` in place (a mutable list kept
    on the model, read by `mismatch.probe` to know which decoder blocks are untouched)."""
    return model.__dict__.setdefault("_mismatch_active_perturbations", [])


@contextmanager
def perturbed(model: nn.Module, spec: PerturbConfig | str, layers: str = "linear",
              seed: int = 0, calibration_ids: torch.Tensor | None = None) -> Iterator[nn.Module]:
    """Context manager: the model perturbed in place inside the block, exactly restored after.

    Yields:
        The candidate model (the same object, perturbed).
    """
    snap = perturb_(model, spec, layers=layers, seed=seed, calibration_ids=calibration_ids)
    try:
        yield model
    finally:
        restore_(model, snap)
