"""Where things live inside a `transformers` causal LM, and hooks to read them.

`model_layout(model)` finds the modules every decoder-only LM has, whatever the family calls
them: the token embedding, the stack of decoder blocks, the final norm and the output head.
Per-layer probes and per-layer perturbation scopes rely on these names:
`embed`, `layers.0` ... `layers.{L-1}`, `final_norm`.

`capture(...)` registers forward hooks on those modules for one forward pass and removes them in
`finally`, as TransformerLens' `HookedRootModule.hooks` does. `replay_prefix(...)` makes leading
blocks return recorded outputs instead of running (isolation maps). The head and the log-probs
computed from it live in `mismatch.model.head`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from mismatch.errors import InputError

_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f")


@dataclass(frozen=True)
class Layout:
    """The hookable modules of a causal LM, in forward order."""

    embed: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module | None
    head: nn.Module

    @property
    def layer_names(self) -> list[str]:
        """`embed`, `layers.0` ... `layers.{L-1}`, and `final_norm` when the model has one."""
        names = ["embed"] + [f"layers.{i}" for i in range(len(self.layers))]
        return names + (["final_norm"] if self.final_norm is not None else [])

    def modules(self) -> list[nn.Module]:
        mods = [self.embed, *self.layers]
        return mods + ([self.final_norm] if self.final_norm is not None else [])


def model_layout(model: nn.Module) -> Layout:
    """Find embedding, decoder blocks, final norm and output head of a causal LM.

    Raises:
        InputError: the model has no output head or no recognisable stack of decoder blocks.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if head is None or embed is None:
        raise InputError(f"{type(model).__name__} is not a causal LM with input and output embeddings")
    n_layers = getattr(model.config, "num_hidden_layers", None)
    base = getattr(model, "base_model", model)
    layers = next(
        (m for m in base.modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers),
        None,
    )
    if layers is None:
        raise InputError(f"cannot find the {n_layers} decoder blocks of {type(model).__name__}")
    final_norm = next(
        (getattr(base, n) for n in _FINAL_NORM_NAMES if isinstance(getattr(base, n, None), nn.Module)),
        None,
    )
    return Layout(embed=embed, layers=layers, final_norm=final_norm, head=head)


def _first_tensor(output) -> torch.Tensor:
    # Decoder blocks return a tensor (transformers >= 5) or a tuple whose first item is it.
    return output if isinstance(output, torch.Tensor) else output[0]


@contextmanager
def capture(
    layout: Layout,
    on_layer: Callable[[int, torch.Tensor], None] | None,
    on_head_input: Callable[[torch.Tensor], torch.Tensor | None],
) -> Iterator[None]:
    """Hook a model's layers and head for the forward passes inside the block.

    Args:
        layout: from `model_layout`.
        on_layer: called as `on_layer(index, hidden_BTD)` for the embedding output (index 0),
            each decoder block output (1..L) and the final norm output (L+1); None: no layer hooks.
        on_head_input: called with the head's input `hidden_BTD`; whatever it returns (if not
            None) replaces that input, so the caller can shrink the head's work.
    """
    handles = []
    try:
        if on_layer is not None:
            for index, module in enumerate(layout.modules()):
                handles.append(module.register_forward_hook(
                    lambda _m, _args, out, i=index: on_layer(i, _first_tensor(out))
                ))

        def head_pre_hook(_module, args):
            replaced = on_head_input(args[0])
            return None if replaced is None else (replaced, *args[1:])

        handles.append(layout.head.register_forward_pre_hook(head_pre_hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Replay(nn.Module):
    """Stands in for a decoder block: returns that block's recorded output, computes nothing.

    Attribute reads it does not have go to the block it replaces (a model's loop may read, e.g.,
    `decoder_layer.attention_type`); the block is not registered as a submodule.
    """

    def __init__(self, block: nn.Module, output: torch.Tensor, as_tuple: bool) -> None:
        super().__init__()
        self.__dict__["_block"] = block
        self.__dict__["_output"] = (output,) if as_tuple else output

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_block"], name)

    def forward(self, *args, **kwargs):
        return self.__dict__["_output"]


@contextmanager
def replay_prefix(layout: Layout, outputs: list[torch.Tensor], start: int, as_tuple: bool) -> Iterator[None]:
    """Inside the block, decoder blocks `0 .. start-1` return `outputs[i]` instead of running.

    For a model whose first `start` blocks (and embedding) are known to equal the run that
    recorded `outputs` (each `[B, T, D]`, same inputs): the forward pass then enters the stack at
    block `start` with bit-identical hidden states, so only the changed suffix is computed.
    `as_tuple`: the blocks return `(hidden, ...)` tuples rather than a tensor.
    """
    originals = [layout.layers[i] for i in range(start)]
    try:
        for i, block in enumerate(originals):
            layout.layers[i] = _Replay(block, outputs[i], as_tuple)
        yield
    finally:
        for i, block in enumerate(originals):
            layout.layers[i] = block


def drop_layers(model: nn.Module, drop: tuple[int, ...]) -> nn.Module:
    """Remove decoder blocks `drop` from `model` in place (a student made from a teacher's own weights, as
    layer-pruning studies make one) and return it: the block list, `config.num_hidden_layers` (and a
    per-layer `config.layer_types`) shrink, and each kept block's `layer_idx` (its slot in the KV cache) is
    renumbered so generation indexes the cache as a model built with that many layers does.

    Raises:
        InputError: a block index outside the model, or every block dropped.
    """
    layout = model_layout(model)
    n = len(layout.layers)
    bad = sorted(i for i in drop if not 0 <= i < n)
    if bad or len(set(drop)) >= n:
        raise InputError(f"cannot drop blocks {sorted(set(drop))} of a {n}-block model")
    for i in sorted(set(drop), reverse=True):
        del layout.layers[i]  # ModuleList renumbers its children
    for new_index, block in enumerate(layout.layers):
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    layer_types = getattr(model.config, "layer_types", None)
    model.config.num_hidden_layers = len(layout.layers)
    if isinstance(layer_types, list) and len(layer_types) == n:
        model.config.layer_types = [t for i, t in enumerate(layer_types) if i not in set(drop)]
    return model
