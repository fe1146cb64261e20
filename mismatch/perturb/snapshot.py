"""What a perturbation replaced, and the swap primitives every perturbation kind writes through.

A perturbation never writes into the model's own tensors: it swaps in new `Parameter` objects,
new modules and forward hooks, and records each original here first (STYLE.md rule 17). Putting
the originals back (`mismatch.perturb.apply.restore_`) is then exact by construction. This module
is shared by the torch-native kinds and the bitsandbytes / optimum-quanto backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers.pytorch_utils import Conv1D


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


def weight_out_in(module: nn.Module) -> torch.Tensor:
    """The weight of a linear layer as `[out, in]`, detached (GPT-2's `Conv1D` stores `[in, out]`)."""
    return module.weight.detach().t() if isinstance(module, Conv1D) else module.weight.detach()


def named_targets(model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    """`(name, module)` for each of `names` (full module names of `model`), in that order."""
    modules = dict(model.named_modules())
    return [(name, modules[name]) for name in names]


def swap_param_(snap: Snapshot, module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace `module.<name>` by a new frozen `Parameter` holding `value`; record the original."""
    snap.params.append((module, name, getattr(module, name)))
    setattr(module, name, nn.Parameter(value, requires_grad=False))


def swap_weight_(snap: Snapshot, module: nn.Module, new_out_in: torch.Tensor) -> None:
    """Replace a linear layer's weight by `new_out_in` (`[out, in]`, transposed back for `Conv1D`)."""
    value = new_out_in.t().contiguous() if isinstance(module, Conv1D) else new_out_in
    swap_param_(snap, module, "weight", value)


def swap_module_(snap: Snapshot, model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule `name` (a full module name) of `model` by `new`; record the original."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    snap.modules.append((parent, child, getattr(parent, child)))
    setattr(parent, child, new)
