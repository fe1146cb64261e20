"""Layer scopes: which modules of a causal LM a perturbation touches.

    linear   every linear layer inside the decoder blocks (default; not embeddings nor lm_head)
    all      linear + lm_head
    attn     linear layers of the attention blocks      mlp   of the MLP blocks
    lm_head  the output head only
    0-3,7    linear layers of those decoder blocks (per-layer isolation)
    REGEX    linear layers (and lm_head) whose full module name matches (re.search)

Linear layers are `nn.Linear` and GPT-2's `Conv1D` (same map, transposed weight).
"""

from __future__ import annotations

import re

from torch import nn
from transformers.pytorch_utils import Conv1D

from mismatch.errors import InputError
from mismatch.layout import model_layout

KEYWORDS = ("linear", "all", "attn", "mlp", "lm_head")
_ATTN = re.compile(r"(^|\.)(self_attn|attn|attention|self_attention)(\.|$)")
_MLP = re.compile(r"(^|\.)(mlp|ffn|feed_forward)(\.|$)")
_RANGES = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")


def is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, Conv1D))


def _block_linears(model: nn.Module) -> dict[str, tuple[int, nn.Module]]:
    """Linear modules inside decoder blocks: full name -> (block index, module)."""
    layout = model_layout(model)
    block_of = {id(block): i for i, block in enumerate(layout.layers)}
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for block in layout.layers:
        prefix = names[id(block)]
        for sub_name, module in block.named_modules():
            if is_linear(module):
                out[f"{prefix}.{sub_name}"] = (block_of[id(block)], module)
    return out


def _head_name(model: nn.Module) -> str:
    head = model_layout(model).head
    return next(n for n, m in model.named_modules() if m is head)


def parse_ranges(text: str, n_layers: int) -> list[int]:
    """`"0-3,7"` -> [0, 1, 2, 3, 7]; every index must be < n_layers."""
    indices = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        lo_i, hi_i = int(lo), int(hi) if hi else int(lo)
        if lo_i > hi_i:
            raise InputError(f"layer range {part.strip()!r} is empty")
        indices.update(range(lo_i, hi_i + 1))
    bad = sorted(i for i in indices if i >= n_layers)
    if bad:
        raise InputError(f"layer index {bad[0]} out of range: the model has {n_layers} decoder blocks (0-{n_layers - 1})")
    return sorted(indices)


def first_block(model: nn.Module, names: list[str]) -> int:
    """Index of the first decoder block holding one of `names`; the block count if none does
    (only the output head is named)."""
    blocks = _block_linears(model)
    return min((blocks[n][0] for n in names if n in blocks), default=len(model_layout(model).layers))


def select(model: nn.Module, layers: str = "linear") -> list[str]:
    """Full names of the modules a scope selects, in model order.

    Raises:
        InputError: an empty scope, an invalid regex, or one that selects no module; the
            message lists the valid scopes.
    """
    if not isinstance(layers, str) or not layers.strip():
        raise InputError(f"empty layer scope; valid: {', '.join(KEYWORDS)}, index ranges like 0-3,7, or a regex")
    scope = layers.strip()
    blocks = _block_linears(model)
    head = _head_name(model)
    if scope == "linear":
        names = list(blocks)
    elif scope == "all":
        names = [*blocks, head]
    elif scope == "lm_head":
        names = [head]
    elif scope == "attn":
        names = [n for n in blocks if _ATTN.search(n)]
    elif scope == "mlp":
        names = [n for n in blocks if _MLP.search(n)]
    elif _RANGES.match(scope):
        wanted = set(parse_ranges(scope, len(model_layout(model).layers)))
        names = [n for n, (i, _) in blocks.items() if i in wanted]
    else:
        try:
            pattern = re.compile(scope)
        except re.error:
            raise InputError(f"unknown layer scope {scope!r}; valid: {', '.join(KEYWORDS)}, "
                             "index ranges like 0-3,7, or a regex on module names") from None
        names = [n for n in [*blocks, head] if pattern.search(n)]
    if not names:
        raise InputError(f"layer scope {scope!r} selects no linear module; valid: {', '.join(KEYWORDS)}, "
                         "index ranges like 0-3,7, or a regex on module names")
    return names
