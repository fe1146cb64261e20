"""What a perturbation replaced, and the swap primitives every perturbation kind writes through.

A perturbation never writes into the model's own tensors: it swaps in new `Parameter` objects,
new modules and forward hooks, and records each original here first. Putting
the originals back (`mismatch.perturb.apply.restore_`) is then exact by construction. This module
is shared by the torch-native kinds and the bitsandbytes / optimum-quanto backends; `weight_out_in`
is the one place that knows which layouts store a matrix `[in, out]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers.pytorch_utils import Conv1D

from mismatch.model.moe import expert_bias_names, expert_tensor_names, is_experts


@dataclass(kw_only=True)
class Snapshot:
    """What `perturb_` replaced, to be put back by `restore_` (filled while perturbing).

    Attributes:
        spec: the canonical spec string of the perturbation (`str(config)`).
        layers: the layer scope as given.
        names: full names of the modules the scope selected, in model order.
        params: `(module, attribute, original Parameter)` for every swapped parameter.
        modules: `(parent, child name, original module)` for every swapped module.
        hooks: handles of the forward (pre-)hooks added.
        restored: whether `restore_` already ran.
    """

    spec: str
    layers: str
    names: list[str]
    params: list[tuple[nn.Module, str, nn.Parameter]] = field(default_factory=list)
    modules: list[tuple[nn.Module, str, nn.Module]] = field(default_factory=list)
    hooks: list[RemovableHandle] = field(default_factory=list)
    restored: bool = False


def weight_names(module: nn.Module) -> tuple[str, ...]:
    """The weight matrices of a selected module that a perturbation rewrites: `weight` of a linear layer
    or router, every 3-D expert tensor of an MoE experts module (`mismatch.model.moe`)."""
    return expert_tensor_names(module) if is_experts(module) else ("weight",)


def _is_in_out(module: nn.Module) -> bool:
    """Whether the module stores its matrices `[..., in, out]`: GPT-2's `Conv1D`, transposed experts."""
    return isinstance(module, Conv1D) or (is_experts(module) and module.is_transposed)


def weight_out_in(module: nn.Module, attr: str = "weight") -> torch.Tensor:
    """The matrix `attr` of a selected module as `[out, in]` (an experts tensor: `[E, out, in]`), detached;
    GPT-2's `Conv1D` stores `[in, out]`, GPT-OSS's experts `[E, in, out]`."""
    w = getattr(module, attr).detach()
    return w.transpose(-1, -2) if _is_in_out(module) else w


def bias_names(module: nn.Module) -> tuple[str, ...]:
    """The biases beside `weight_names(module)` (a linear's `bias`, GPT-OSS experts' `<tensor>_bias`)."""
    if is_experts(module):
        return expert_bias_names(module)
    return ("bias",) if isinstance(getattr(module, "bias", None), nn.Parameter) else ()


def named_targets(model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    """`(name, module)` for each of `names` (full module names of `model`), in that order."""
    modules = dict(model.named_modules())
    return [(name, modules[name]) for name in names]


def swap_param_(snap: Snapshot, module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace `module.<name>` by a new frozen `Parameter` holding `value`; record the original."""
    snap.params.append((module, name, getattr(module, name)))
    setattr(module, name, nn.Parameter(value, requires_grad=False))


def swap_weight_(snap: Snapshot, module: nn.Module, new_out_in: torch.Tensor, attr: str = "weight") -> None:
    """Replace the matrix `attr` of a selected module by `new_out_in` (`[..., out, in]`, stored back in the
    module's own layout)."""
    value = new_out_in.transpose(-1, -2).contiguous() if _is_in_out(module) else new_out_in
    swap_param_(snap, module, attr, value)


def swap_module_(snap: Snapshot, model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule `name` (a full module name) of `model` by `new`; record the original."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    snap.modules.append((parent, child, getattr(parent, child)))
    setattr(parent, child, new)
