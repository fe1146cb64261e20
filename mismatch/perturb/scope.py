"""Layer scopes: which modules of a causal LM a perturbation touches.

    linear   every linear layer inside the decoder blocks, MoE experts included (default; not the
             routers, embeddings nor lm_head)
    all      linear + lm_head
    attn     linear layers of the attention blocks      mlp   of the MLP blocks (experts included)
    experts  the fused MoE experts modules only         router  the MoE routers only (`mlp.gate`)
    lm_head  the output head only
    0-3,7    linear layers and experts of those decoder blocks (per-layer isolation)
    REGEX    linear layers, experts, routers and lm_head whose full module name matches (re.search)

Linear layers are `nn.Linear` and GPT-2's `Conv1D` (same map, transposed weight). An MoE block's
experts module (`mismatch.model.moe`) counts as one unit holding its 3-D expert tensors; its router stays
in full precision unless a scope names it (`router`, or a regex), as vLLM and slime keep it.
"""

from __future__ import annotations

import re

from torch import nn
from transformers.pytorch_utils import Conv1D

from mismatch.errors import InputError
from mismatch.model.layout import model_layout
from mismatch.model.moe import is_experts, is_transposed, moe_blocks

KEYWORDS = ("linear", "all", "attn", "mlp", "experts", "router", "lm_head")
_ATTN = re.compile(r"(^|\.)(self_attn|attn|attention|self_attention)(\.|$)")
_MLP = re.compile(r"(^|\.)(mlp|ffn|feed_forward)(\.|$)")
_RANGES = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")
_KIND_WORDS = {"linear": "linear module", "experts": "MoE experts module", "router": "MoE router"}


def is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, Conv1D))


def block_modules(model: nn.Module) -> dict[str, tuple[int, str]]:
    """Every module a scope can select inside the decoder blocks, in model order: full name ->
    (block index, kind), kind `linear`, `experts` or `router` (a router is never a `linear`)."""
    layout = model_layout(model)
    names = {id(m): n for n, m in model.named_modules()}
    routers = {moe.router for moe in moe_blocks(model)}
    out = {}
    for index, block in enumerate(layout.layers):
        prefix = names[id(block)]
        for sub_name, module in block.named_modules():
            name = f"{prefix}.{sub_name}"
            if name in routers:
                out[name] = (index, "router")
            elif is_experts(module):
                out[name] = (index, "experts")
            elif is_linear(module):
                out[name] = (index, "linear")
    return out


def head_name(model: nn.Module) -> str:
    """Full module name of the output head."""
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
    blocks = block_modules(model)
    return min((blocks[n][0] for n in names if n in blocks), default=len(model_layout(model).layers))


def _no_match(model: nn.Module, scope: str, kinds: tuple[str, ...]) -> InputError:
    present = {kind for _, kind in block_modules(model).values()}
    missing = [k for k in kinds if k not in present]
    what = " or ".join(_KIND_WORDS[k] for k in kinds)
    why = (f": {type(model).__name__} has no {' and no '.join(_KIND_WORDS[k] for k in missing)}"
           if missing and len(missing) == len(kinds) else "")
    return InputError(f"layer scope {scope!r} selects no {what}{why}; valid: {', '.join(KEYWORDS)}, "
                      "index ranges like 0-3,7, or a regex on module names")


def select(model: nn.Module, layers: str = "linear") -> list[str]:
    """Full names of the modules a scope selects, in model order.

    Raises:
        InputError: an empty scope, an invalid regex, one that selects no module (saying when the
            model has no module of the kind asked for), or experts of unknown layout; the message
            lists the valid scopes.
    """
    if not isinstance(layers, str) or not layers.strip():
        raise InputError(f"empty layer scope; valid: {', '.join(KEYWORDS)}, index ranges like 0-3,7, or a regex")
    scope = layers.strip()
    blocks = block_modules(model)
    weights = [n for n, (_, kind) in blocks.items() if kind != "router"]  # linears and experts
    head = head_name(model)
    kinds: tuple[str, ...] = ("linear", "experts")
    if scope == "linear":
        names = weights
    elif scope == "all":
        names = [*weights, head]
    elif scope == "lm_head":
        names = [head]
    elif scope == "attn":
        names = [n for n in weights if _ATTN.search(n)]
    elif scope == "mlp":
        names = [n for n in weights if _MLP.search(n)]
    elif scope in ("experts", "router"):
        kinds = (scope,)
        names = [n for n, (_, kind) in blocks.items() if kind == scope]
    elif _RANGES.match(scope):
        wanted = set(parse_ranges(scope, len(model_layout(model).layers)))
        names = [n for n in weights if blocks[n][0] in wanted]
    else:
        try:
            pattern = re.compile(scope)
        except re.error:
            raise InputError(f"unknown layer scope {scope!r}; valid: {', '.join(KEYWORDS)}, "
                             "index ranges like 0-3,7, or a regex on module names") from None
        names = [n for n in [*blocks, head] if pattern.search(n)]
    if not names:
        raise _no_match(model, scope, kinds)
    modules = dict(model.named_modules())
    for n in names:
        if blocks.get(n, (0, ""))[1] == "experts":
            is_transposed(n, modules[n])  # refuses experts whose layout transformers does not record
    return names
