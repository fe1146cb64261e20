"""Mixture-of-experts blocks of a `transformers` causal LM: fused expert tensors, routers, routing.

transformers ≥ 5 holds the experts of an MoE block as fused 3-D parameters of one module (the
`…Experts` classes decorated with `use_experts_implementation`, which records their layout as
`is_transposed`). Qwen3-MoE, Mixtral and OLMoE store `gate_up_proj` `[E, 2I, D]` and `down_proj`
`[E, D, I]`: expert `e`'s matrix `[out, in]`, as `nn.Linear` does. GPT-OSS stores them transposed,
`gate_up_proj` `[E, D, 2I]` and `down_proj` `[E, I, D]` (`[in, out]` per expert), with biases
`[E, out]`. `mismatch.perturb.snapshot.weight_out_in` gives every expert tensor as `[E, out, in]`
whatever the layout, so a perturbation treats each expert's matrix as one linear layer.

The router is the experts' sibling with a `[E, D]` weight (`mlp.gate`; GPT-OSS `mlp.router`). It picks
each token's top-k experts, which reach the experts module as its second argument `top_k_index`
`[tokens, k]` (the interface every decorated experts class shares); `capture_routing` reads them there.
An experts module whose layout is not recorded (transformers classes outside that interface, e.g.
Llama-4's) is refused by name when a scope would perturb it, never skipped; its routing is not read
(`routed_blocks` leaves it out: the probe reports no router agreement for it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from mismatch.errors import InputError
from mismatch.model.layout import model_layout

ROUTER_NAMES = ("gate", "router")  # what transformers' MoE blocks call their router


def expert_tensor_names(module: nn.Module) -> tuple[str, ...]:
    """Names of `module`'s own 3-D floating parameters (its fused expert matrices), in registration order."""
    return tuple(n for n, p in module.named_parameters(recurse=False) if p.dim() == 3 and p.is_floating_point())


def is_experts(module: nn.Module) -> bool:
    """Whether `module` holds fused experts: 3-D parameters of its own and an integer `num_experts`."""
    return isinstance(getattr(module, "num_experts", None), int) and bool(expert_tensor_names(module))


def is_transposed(name: str, module: nn.Module) -> bool:
    """Whether the experts module `name` stores each expert `[in, out]` (True) or `[out, in]` (False).

    Raises:
        InputError: transformers does not record its layout (`is_transposed`).
    """
    flag = getattr(module, "is_transposed", None)
    if not isinstance(flag, bool):
        first = expert_tensor_names(module)[0]
        raise InputError(f"cannot perturb {name}.{first} {list(getattr(module, first).shape)}: "
                         f"{type(module).__name__} does not record whether its experts are [out, in] or [in, out] "
                         "(transformers' use_experts_implementation does); use a scope without it")
    return flag


def expert_bias_names(module: nn.Module) -> tuple[str, ...]:
    """The experts' biases `[E, out]` (`<tensor>_bias`, GPT-OSS), in the order of their tensors."""
    return tuple(f"{a}_bias" for a in expert_tensor_names(module)
                 if isinstance(getattr(module, f"{a}_bias", None), nn.Parameter))


@dataclass(frozen=True)
class MoEBlock:
    """One MoE block: decoder block `index`, full module names of its `experts` and `router`, the
    number of experts `num_experts` and how many each token uses, `top_k`."""

    index: int
    experts: str
    router: str
    num_experts: int
    top_k: int


def _router_of(parent: nn.Module, experts: nn.Module) -> str | None:
    """The child of `parent` (the MoE block) named like a router, with a `[E, D]` weight."""
    for child in ROUTER_NAMES:
        module = getattr(parent, child, None)
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Module) and isinstance(weight, torch.Tensor) and weight.dim() == 2 \
                and weight.shape[0] == experts.num_experts:
            return child
    return None


def _top_k(model: nn.Module, router: nn.Module) -> int:
    k = getattr(router, "top_k", None) or getattr(model.config, "num_experts_per_tok", None)
    if not isinstance(k, int):
        raise InputError(f"cannot tell how many experts {type(router).__name__} picks per token (no top_k)")
    return k


def moe_blocks(model: nn.Module) -> list[MoEBlock]:
    """Every MoE block inside the decoder blocks, in model order (empty for a dense model).

    Raises:
        InputError: an experts module without a recognisable router beside it.
    """
    layout = model_layout(model)
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for index, block in enumerate(layout.layers):
        for sub, module in block.named_modules():
            if not is_experts(module):
                continue
            name = f"{names[id(block)]}.{sub}"
            parent_name = name.rpartition(".")[0]
            router = _router_of(model.get_submodule(parent_name), module)
            if router is None:
                raise InputError(f"{name} holds experts but its block has no router ({' or '.join(ROUTER_NAMES)} "
                                 f"with a [{module.num_experts}, D] weight)")
            router_name = f"{parent_name}.{router}"
            out.append(MoEBlock(index=index, experts=name, router=router_name, num_experts=module.num_experts,
                                top_k=_top_k(model, model.get_submodule(router_name))))
    return out


def routed_blocks(model: nn.Module) -> list[MoEBlock]:
    """The MoE blocks whose experts take transformers' shared experts interface (`top_k_index` as their
    second argument; the decorated classes, which record `is_transposed`): those `capture_routing` reads."""
    return [moe for moe in moe_blocks(model)
            if isinstance(getattr(model.get_submodule(moe.experts), "is_transposed", None), bool)]


def _top_k_index(args: tuple, kwargs: dict) -> torch.Tensor:
    """The experts forward's `top_k_index` (second positional argument, or by keyword)."""
    if len(args) > 1:
        return args[1]
    for key in ("top_k_index", "router_indices", "selected_experts"):
        if key in kwargs:
            return kwargs[key]
    raise InputError("cannot find the selected experts among the experts module's arguments")


@contextmanager
def capture_routing(model: nn.Module, rows_N: torch.Tensor, on_route: Callable[[int, torch.Tensor], None]
                    ) -> Iterator[None]:
    """Inside the block, every forward of a routed MoE block (`routed_blocks`) calls
    `on_route(block index, experts_NK)`: the sorted expert ids `[N, k]` its router selected for the
    token rows `rows_N` (flat indices into the `[tokens, D]` rows the experts see, i.e. `[B*T]`).
    Hooks are removed in `finally`."""
    handles = []
    try:
        for moe in routed_blocks(model):
            def pre_hook(_module, args, kwargs, index=moe.index) -> None:
                chosen = _top_k_index(args, kwargs)
                on_route(index, chosen.reshape(-1, chosen.shape[-1]).index_select(0, rows_N).sort(dim=-1).values)
            handles.append(model.get_submodule(moe.experts).register_forward_pre_hook(pre_hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
