"""Per-token and per-layer divergence between a reference LM and a candidate LM.

The reference `p` is the policy being trained (full-precision student); the candidate `q` is the
copy that generates rollouts (quantized, stale, another engine). For every scored token
`y = input_ids[s, t]` we compare the full next-token distributions predicting it (from position
`t-1`), in fp32, natural log; the metric definitions are fixed in docs/design.md and computed in
`mismatch.metrics`.

Memory: logits are never materialised as `[B, T, V]`. A forward pre-hook on the output head
keeps the head's input rows at the predicting positions (`[N, D]`) and lets the model's own head
run on the last position only; the head is then applied here chunk by chunk over tokens, so at
most `[chunk, V]` fp32 tensors exist at once. The reference side (`reference(...)`) is computed
once and can be scored against many candidates; it keeps its own copy of the head weights, so a
candidate perturbed in place (the same model object) cannot leak into it.

Mixture-of-experts models add one per-layer metric, `router_topk_agree`, on the row of each MoE
block (`layers.i`): the share of scored tokens whose selected expert set (the router's top-k, as the
experts receive it, `mismatch.model.moe.capture_routing`) is the same for candidate and reference, at the
positions predicting them (the rows of the hidden-state metrics). It is 1 exactly for identical
models; expert-routing flips are the MoE-specific mismatch that routing replay removes. Other rows
hold NaN there (dense blocks, the embedding, the final norm).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from mismatch.errors import InputError, NumericsError, VocabMismatchError
from mismatch.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_CLIP
from mismatch.model.head import CACHE_ROWS, Head, HeadInputs, head_inputs, logprob_chunks, token_chunks
from mismatch.model.layout import Layout, model_layout, replay_prefix
from mismatch.metrics import summarize, token_metrics_
from mismatch.model.external import ExternalLM
from mismatch.model.generate import Batch
from mismatch.model.loader import LM, context_length
from mismatch.model.moe import capture_routing, routed_blocks
from mismatch.perturb import active_perturbations
from mismatch.model.positions import position_ids, response_index, scorable
from mismatch.model.tokenizer import vocab_fingerprint

TOKEN_COLUMNS = ("seq", "pos", "token", "logp_ref", "logp_cand", "kl_fwd", "kl_rev", "tv",
                 "top1_agree", "is_ratio", "k3")
ROUTER_METRIC = "router_topk_agree"  # per MoE block; NaN on the rows of layers without a router
LAYER_COLUMNS = ("layer", "index", "rel_l2", "cosine", "sqnr_db", ROUTER_METRIC)


# ---------------------------------------------------------------- masks and inputs


def unpack(tokens, attention_mask, response_mask) -> tuple:
    """`(input_ids, attention_mask, response_mask)` from a `Batch` (`mismatch.generate`'s, its three tensors) or
    from the three given apart; a `Batch` with a mask given as well is an error (two sources of one mask)."""
    if not isinstance(tokens, Batch):
        return tokens, attention_mask, response_mask
    if attention_mask is not None or response_mask is not None:
        raise InputError("give a Batch alone: its masks are the batch's own")
    return tokens.input_ids, tokens.attention_mask, tokens.response_mask


def score_mask(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate inputs and decide which tokens are scored.

    Args:
        input_ids: `[B, T]` token ids.
        attention_mask: `[B, T]` 1 for real tokens, 0 for padding (left or right); default all 1.
        response_mask: `[B, T]` 1 for tokens to score; default every attended token whose
            predecessor is attended. It may only mark such tokens.

    Returns:
        `(attention_mask_BT, scored_BT, position_ids_BT)`: the attention mask as long, the bool
        mask of scored tokens, and positions counted from each sequence's first attended token.

    Raises:
        InputError: wrong shapes/dtypes, empty input, no scored token, or a response_mask
            marking padding or a sequence's first token (it has no prediction to score).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise InputError("input_ids must be a [batch, tokens] tensor")
    if input_ids.numel() == 0:
        raise InputError(f"input_ids is empty (shape {tuple(input_ids.shape)})")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise InputError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    masks = {}
    for name, mask in (("attention_mask", attention_mask), ("response_mask", response_mask)):
        if mask is None:
            continue
        if mask.shape != input_ids.shape:
            raise InputError(f"{name} has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise InputError(f"{name} must hold only 0 and 1")
        masks[name] = mask.to(device=input_ids.device, dtype=torch.bool)
    attn_BT = masks.get("attention_mask", torch.ones_like(input_ids, dtype=torch.bool))
    valid_BT = scorable(attn_BT)
    scored_BT = valid_BT
    if "response_mask" in masks:
        bad = masks["response_mask"] & ~valid_BT
        if bool(bad.any()):
            raise InputError(
                f"response_mask marks {int(bad.sum())} token(s) that are padding or a sequence's first "
                "token, which has no prediction to score"
            )
        scored_BT = masks["response_mask"]
    if not bool(scored_BT.any()):
        raise InputError("no token to score: every sequence needs ≥ 2 attended tokens and the "
                         "response_mask must mark at least one of them")
    position_ids_BT = position_ids(attn_BT)
    return attn_BT.long(), scored_BT, position_ids_BT


def _unwrap(model: nn.Module | LM) -> tuple[nn.Module, str | None, str]:
    if isinstance(model, LM):
        return model.model, vocab_fingerprint(model.tokenizer), model.name
    return model, None, type(model).__name__


def _check_inputs(model: nn.Module, name: str, input_ids: torch.Tensor, position_ids_BT: torch.Tensor,
                  vocab_size: int) -> None:
    limit = context_length(model)
    longest = int(position_ids_BT.max()) + 1
    if limit is not None and longest > limit:
        raise InputError(f"sequence of {longest} tokens is longer than {name}'s context of {limit}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise InputError(f"token ids span [{lo}, {hi}] but {name}'s vocabulary has {vocab_size} entries")


# ---------------------------------------------------------------- one forward pass


def _forward(model: nn.Module, input_ids_BT, attn_BT, pred_index_N, on_layer, keep_blocks: list | None = None,
             replay: Reference | None = None, start: int = 0, on_route=None) -> HeadInputs:
    """`layout.head_inputs` plus the isolation map's block bookkeeping and MoE routing.

    `keep_blocks`: a list that receives every decoder block's full output `[B, T, D]` (a copy)
    and, last, whether the blocks return tuples. `replay`: a Reference whose recorded block
    outputs stand in for the candidate's first `start` blocks (`_unchanged_prefix`). `on_route`:
    called as `on_route(block index, experts_NK)` by each MoE block that runs (`capture_routing`).
    """
    layout = model_layout(model)
    routing = capture_routing(model, pred_index_N, on_route) if on_route is not None else contextlib.nullcontext()
    handles, as_tuple = [], []
    if keep_blocks is not None:
        def keep(_module, _args, out) -> None:
            as_tuple.append(not isinstance(out, torch.Tensor))
            keep_blocks.append((out if isinstance(out, torch.Tensor) else out[0]).detach().clone())
        handles = [block.register_forward_hook(keep) for block in layout.layers]
    try:
        with torch.no_grad(), routing, replay_prefix(layout, replay.block_outputs if start else [], start,
                                                     replay is not None and replay.blocks_as_tuple):
            fwd = head_inputs(model, input_ids_BT, attn_BT, pred_index_N, on_layer=on_layer)
    finally:
        for handle in handles:
            handle.remove()
    if keep_blocks is not None:
        keep_blocks.append(any(as_tuple))
    return fwd


def _block_states(layout: Layout) -> list[tuple]:
    """A signature of the embedding and of each decoder block: every submodule's class and hooks,
    every parameter's and buffer's identity and in-place version counter. Any perturbation by
    `mismatch.perturb` (it swaps parameters, modules or hooks) or in-place update (an optimizer
    step) changes it."""
    def state(module: nn.Module) -> tuple:
        mods = tuple((n, type(m), tuple(m._forward_pre_hooks), tuple(m._forward_hooks))
                     for n, m in module.named_modules())
        tensors = tuple((n, id(t), t._version) for n, t in
                        [*module.named_parameters(remove_duplicate=False), *module.named_buffers()])
        return mods, tensors
    return [state(layout.embed)] + [state(block) for block in layout.layers]


def _unchanged_prefix(ref: Reference, model: nn.Module, layout: Layout) -> int:
    """How many leading decoder blocks of `model` can replay `ref`'s recorded outputs: 0 unless
    `model` is the very model `ref` ran on, with the same embedding; then the blocks before the
    first one whose signature (`_block_states`) changed since."""
    if ref.block_outputs is None or ref.model_ref is None or ref.model_ref() is not model:
        return 0
    now = _block_states(layout)
    if len(now) != len(ref.block_states) or now[0] != ref.block_states[0]:
        return 0
    return next((i for i in range(1, len(now)) if now[i] != ref.block_states[i]), len(now)) - 1


@torch.no_grad()
def _verify_head(head: Head, fwd: HeadInputs, name: str) -> None:
    ours = head.logits(fwd.last_BD)
    if not torch.isfinite(fwd.last_logits_BV).all():
        return  # reported with its position by the chunked pass
    tol = 1e-3 * (1.0 + float(fwd.last_logits_BV.abs().max()))
    diff = float((ours - fwd.last_logits_BV).abs().max())
    if diff > tol:
        raise InputError(f"cannot reproduce {name}'s logits from its output head (max |Δ| = {diff:.3g}); "
                         "this architecture post-processes logits in a way mismatch does not support")


# ---------------------------------------------------------------- the reference side


@dataclass
class Reference:
    """The reference model's side of a probe, computed once and reusable across candidates.

    Holds the head inputs at the predicting positions (`[N, D]`), a private copy of the head,
    and (with `per_layer`) the fp32 hidden states of every captured layer at those positions.
    """

    name: str
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T] long
    scored: torch.Tensor  # [B, T] bool
    position_ids: torch.Tensor  # [B, T]
    head: Head
    head_input: torch.Tensor  # [N, D]
    layer_names: list[str]
    layer_hidden: list[torch.Tensor] | None  # per layer [N, D] fp32
    vocab_fingerprint: str | None = None
    logp: torch.Tensor | None = None  # [N, V] fp32 log p, with cache_logprobs=True
    logp_argmax: torch.Tensor | None = None  # [N] argmax of that cache
    block_outputs: list[torch.Tensor] | None = None  # per decoder block [B, T, D], keep_block_outputs=True
    blocks_as_tuple: bool = False  # the blocks return (hidden, ...) tuples
    block_states: list[tuple] | None = None  # `_block_states` of the model when it ran
    model_ref: weakref.ref | None = None  # the model it ran on (weak: the Reference does not keep it alive)
    expert_sets: dict[int, torch.Tensor] | None = None  # per MoE block index: [N, k] sorted expert ids, per_layer
    seq: torch.Tensor = field(init=False)  # [N]
    pos: torch.Tensor = field(init=False)  # [N]
    token: torch.Tensor = field(init=False)  # [N]
    pred_index: torch.Tensor = field(init=False)  # [N] flat indices into [B*T] of the predicting positions

    def __post_init__(self) -> None:
        seq_N, t_N = self.scored.nonzero(as_tuple=True)
        self.seq, self.pos, self.token = seq_N, self.position_ids[seq_N, t_N], self.input_ids[seq_N, t_N]
        self.pred_index = response_index(self.scored)


@torch.no_grad()
def reference(
    model: nn.Module | LM,
    input_ids: torch.Tensor | Batch,
    attention_mask: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    per_layer: bool = True,
    cache_logprobs: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    keep_block_outputs: bool = False,
) -> Reference:
    """Run the reference model once and keep what `probe` needs to score any candidate.

    Args:
        model: a `transformers` causal LM or an `LM`.
        input_ids, attention_mask, response_mask: `[B, T]`, see `score_mask`; or a `Batch` alone as
            `input_ids` (`mismatch.generate`'s: its three tensors).
        per_layer: also keep every layer's hidden states at the scored positions.
        cache_logprobs: also keep the reference's full-vocabulary log-probabilities (`N · V · 4`
            bytes: 400 MB for 2,048 tokens of a 49k vocabulary), so each later probe skips the
            reference head and its log_softmax: worth it for many candidates (isolation maps).
        chunk_tokens: rows per head matmul when filling that cache.
        keep_block_outputs: also keep every decoder block's full output (`L · B · T · D`
            elements in the model dtype: 141 MB for SmolLM2 on 8x256 tokens in fp32). A later
            `probe` of this same model object, perturbed in place from block `i` on (a per-layer
            isolation map), then replays blocks `0 .. i-1` from these instead of recomputing
            them: the same numbers bit for bit, about half the cost of a map. Which blocks are
            unchanged is detected, not trusted: class, hooks, identity and version counter of
            every parameter and buffer (`torch.Tensor._version`); only edits through `.data`
            escape it.

    Returns:
        A `Reference`, accepted by `probe` in place of the reference model.

    Raises:
        InputError: the model is currently perturbed in place, or see `score_mask`.
    """
    input_ids, attention_mask, response_mask = unpack(input_ids, attention_mask, response_mask)
    model, fingerprint, name = _unwrap(model)
    active = active_perturbations(model)
    if active:
        raise InputError(f"the reference {name} is perturbed in place ({', '.join(a.spec for a in active)}); compute "
                         "mismatch.reference(model, ...) before perturbing and pass that to probe")
    attn_BT, scored_BT, position_ids_BT = score_mask(input_ids, attention_mask, response_mask)
    layout = model_layout(model)
    head = Head.of(model, copy=True)
    _check_inputs(model, name, input_ids, position_ids_BT, head.vocab_size)
    layers, expert_sets = ([], {}) if per_layer else (None, None)  # per layer [N, D]; per MoE block [N, k]
    blocks: list | None = [] if keep_block_outputs else None
    states = _block_states(layout) if keep_block_outputs else None
    fwd = _forward(model, input_ids, attn_BT, response_index(scored_BT),
                   (lambda i, h: layers.append(h)) if per_layer else None, keep_blocks=blocks,
                   on_route=expert_sets.__setitem__ if per_layer else None)
    _verify_head(head, fwd, name)
    logp = _all_logprobs(head, fwd.rows_ND, chunk_tokens) if cache_logprobs else None
    return Reference(name=name, input_ids=input_ids, attention_mask=attn_BT, scored=scored_BT,
                     position_ids=position_ids_BT, head=head, head_input=fwd.rows_ND,
                     layer_names=layout.layer_names, layer_hidden=layers, vocab_fingerprint=fingerprint,
                     logp=logp, logp_argmax=None if logp is None else logp.argmax(-1),
                     block_outputs=blocks[:-1] if blocks else None, blocks_as_tuple=bool(blocks and blocks[-1]),
                     block_states=states, model_ref=weakref.ref(model) if keep_block_outputs else None,
                     expert_sets=expert_sets)


def _all_logprobs(head: Head, hidden_ND: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """`[N, V]` fp32 log-probs of every row (the reference cache)."""
    logp_NV = torch.empty((hidden_ND.shape[0], head.vocab_size), dtype=torch.float32, device=hidden_ND.device)
    for rows, logp_CV in logprob_chunks(head, hidden_ND, chunk_tokens):
        logp_NV[rows] = logp_CV
    return logp_NV


_build_reference = reference  # `probe` has an argument named `reference`


class _LayerStats:
    """Accumulates rel_l2 / cosine / sqnr_db of candidate vs reference hidden states and, per MoE
    block, router_topk_agree of their selected expert sets."""

    def __init__(self, ref: Reference) -> None:
        self.ref, self.rows, self.agree = ref, [], {}

    def route(self, block: int, experts_NK: torch.Tensor) -> None:
        """router_topk_agree = (1/N) Σ_n [set_cand(n) = set_ref(n)]: sorted ids compared row by row."""
        same_N = (experts_NK == self.ref.expert_sets[block]).all(dim=-1)
        self.agree[block] = float(same_N.double().mean())

    def layer_rows(self, start: int) -> list[dict]:
        """The per-layer rows, each MoE block's with its agreement: 1 exactly for the first `start`
        blocks, replayed from the reference bit for bit (their routers never ran)."""
        agree = {b: 1.0 for b in self.ref.expert_sets if b < start} | self.agree
        missing = sorted(set(self.ref.expert_sets) - set(agree))
        if missing:
            raise InputError(f"MoE block {missing[0]} of {self.ref.name} routed no token in the candidate")
        # block b's output is layer row index b + 1 (row 0 is the embedding)
        return [{**row, ROUTER_METRIC: agree.get(row["index"] - 1, math.nan)} for row in self.rows]

    def __call__(self, index: int, hidden_ND: torch.Tensor) -> None:
        h = self.ref.layer_hidden[index]
        err2 = float(((hidden_ND.double() - h.double()) ** 2).sum())
        ref2 = float((h.double() ** 2).sum())
        cosine = float(F.cosine_similarity(hidden_ND.double(), h.double(), dim=-1, eps=1e-12).mean())
        self.rows.append({
            "layer": self.ref.layer_names[index], "index": index,
            "rel_l2": math.sqrt(err2 / ref2) if ref2 > 0 else math.nan,
            "cosine": cosine,
            "sqnr_db": math.inf if err2 == 0 else 10.0 * math.log10(ref2 / err2),
        })


# ---------------------------------------------------------------- the probe


@dataclass(frozen=True)
class ProbeResult:
    """`per_token` (one row per scored token), `per_layer` (one row per layer), `summary`, and
    `notes`: one-line warnings about what was scored (e.g. a dump that may come from another tokenizer)."""

    per_token: pd.DataFrame
    per_layer: pd.DataFrame
    summary: dict[str, float]
    reference: str
    candidate: str
    notes: list[str] = field(default_factory=list)


def _check_finite(values_C: torch.Tensor, side: str, ref: Reference, rows: slice) -> None:
    bad = ~torch.isfinite(values_C)
    if bool(bad.any()):
        i = rows.start + int(bad.nonzero()[0])
        raise NumericsError(f"{side} produced NaN/Inf logits predicting token (seq {int(ref.seq[i])}, "
                            f"pos {int(ref.pos[i])})")


@torch.no_grad()  # not inference_mode: it breaks quanto's qint4 modules
def probe(
    reference: nn.Module | LM | Reference,
    candidate: nn.Module | LM,
    input_ids: torch.Tensor | Batch | None = None,
    attention_mask: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    per_layer: bool = True,
    clip: float = DEFAULT_CLIP,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> ProbeResult:
    """Compare a candidate LM with a reference LM on the same tokens.

    Args:
        reference: the reference model (`p`), an `LM`, or a `Reference` computed once by
            `mismatch.reference` (then `input_ids` may be None and the masks must be None).
        candidate: the candidate model (`q`), e.g. a quantized or perturbed copy, or an `ExternalLM`
            (an engine known by its logits; then `per_layer` must be False).
        input_ids: `[B, T]` token ids; attention_mask / response_mask `[B, T]` (see `score_mask`); or a
            `Batch` alone (`mismatch.generate`'s: its three tensors).
        per_layer: compare hidden states of every layer (needs both models to have the same
            number of layers and width).
        clip: importance ratios outside `[1/clip, clip]` count in `is_ratio_outside_frac`.
        chunk_tokens: tokens per chunk of full-vocabulary work; peak extra memory is about
            2 · chunk_tokens · V · 4 bytes (plus the reference's copy of the head). Larger chunks
            stream the head weights fewer times. It changes results only at fp32 rounding level
            (BLAS sums in another order for another row count).

    Returns:
        `ProbeResult` with `per_token` columns seq, pos, token, logp_ref, logp_cand, kl_fwd,
        kl_rev, tv, top1_agree, is_ratio, k3 (nats), `per_layer` columns layer, index, rel_l2,
        cosine, sqnr_db (dB), router_topk_agree (MoE blocks; NaN elsewhere), and `summary`.

    Raises:
        InputError, VocabMismatchError, NumericsError: see their messages.
    """
    if chunk_tokens < 1:
        raise InputError(f"chunk_tokens must be ≥ 1, got {chunk_tokens}")
    if not clip > 1.0:
        raise InputError(f"clip must be > 1, got {clip}")
    input_ids, attention_mask, response_mask = unpack(input_ids, attention_mask, response_mask)
    if isinstance(candidate, ExternalLM):
        return _probe_external(reference, candidate, input_ids, attention_mask, response_mask, per_layer, clip,
                               chunk_tokens)
    ref = _as_reference(reference, input_ids, attention_mask, response_mask, per_layer)
    cand_model, cand_fp, cand_name = _unwrap(candidate)
    head = Head.of(cand_model)
    _check_candidate(ref, cand_model, cand_fp, cand_name, head, per_layer)
    stats = _LayerStats(ref) if per_layer else None
    start = _unchanged_prefix(ref, cand_model, model_layout(cand_model))
    fwd = _forward(cand_model, ref.input_ids, ref.attention_mask, ref.pred_index, stats, replay=ref, start=start,
                   on_route=stats.route if stats else None)
    _verify_head(head, fwd, cand_name)
    tok = _token_metrics(ref, head, fwd.rows_ND, cand_name, chunk_tokens)
    return _result(ref, tok, stats.layer_rows(start) if stats else [], cand_name, clip)


def _result(ref: Reference, tok: dict[str, torch.Tensor], layer_rows: list[dict], cand_name: str, clip: float
            ) -> ProbeResult:
    """The `ProbeResult` of per-token metrics `[N]` (and per-layer rows) against `ref`."""
    columns = {"seq": ref.seq, "pos": ref.pos, "token": ref.token, **tok}
    per_token = pd.DataFrame({k: v.cpu().numpy() for k, v in columns.items()})[list(TOKEN_COLUMNS)]
    per_layer_df = pd.DataFrame(layer_rows, columns=list(LAYER_COLUMNS))
    return ProbeResult(per_token=per_token, per_layer=per_layer_df, summary=summarize(tok, ref.seq, clip),
                       reference=ref.name, candidate=cand_name)


def _check_candidate(ref: Reference, model: nn.Module, fingerprint: str | None, name: str, head: Head,
                     per_layer: bool) -> None:
    """The candidate shares the reference's vocabulary (and, for per_layer, its layers) and fits the inputs."""
    _check_vocab_size(ref, head.vocab_size, name)
    if ref.vocab_fingerprint and fingerprint and ref.vocab_fingerprint != fingerprint:
        raise VocabMismatchError(f"tokenizers of {ref.name} and {name} map tokens to different ids")
    _check_inputs(model, name, ref.input_ids, ref.position_ids, head.vocab_size)
    layer_names = model_layout(model).layer_names
    if per_layer and layer_names != ref.layer_names:
        raise InputError(f"per_layer needs the same layers: {ref.name} has {len(ref.layer_names)}, "
                         f"{name} has {len(layer_names)}; use per_layer=False")
    routed = sorted(b.index for b in routed_blocks(model)) if per_layer else []
    if per_layer and routed != sorted(ref.expert_sets):
        raise InputError(f"per_layer needs the same MoE blocks: {ref.name} routes in blocks {sorted(ref.expert_sets)}, "
                         f"{name} in {routed}; use per_layer=False")


def _check_vocab_size(ref: Reference, vocab_size: int, name: str) -> None:
    if vocab_size != ref.head.vocab_size:
        raise VocabMismatchError(f"vocabulary sizes differ: {ref.name} has {ref.head.vocab_size}, "
                                 f"{name} has {vocab_size}")


def _as_reference(reference: nn.Module | LM | Reference, input_ids, attention_mask, response_mask,
                  per_layer: bool) -> Reference:
    """`reference` itself when it is a `Reference` (checking the arguments agree with it), else a
    fresh one computed on the given inputs."""
    if not isinstance(reference, Reference):
        if input_ids is None:
            raise InputError("input_ids are required unless reference is a mismatch.Reference")
        return _build_reference(reference, input_ids, attention_mask, response_mask, per_layer)
    if input_ids is not None and not torch.equal(input_ids.to(reference.input_ids.device), reference.input_ids):
        raise InputError("input_ids differ from the ones the Reference was computed on")
    if attention_mask is not None or response_mask is not None:
        raise InputError("masks are fixed by the Reference; pass them to mismatch.reference()")
    if per_layer and reference.layer_hidden is None:
        raise InputError("per_layer=True needs a Reference computed with per_layer=True")
    return reference


def _token_metrics(ref: Reference, head: Head, hidden_ND: torch.Tensor, cand_name: str,
                   chunk_tokens: int) -> dict[str, torch.Tensor]:
    """Per-token metrics `[N]` of the candidate's head rows against the reference side.

    The elementwise work is memory-bound: `CACHE_ROWS` rows at a time keep its ~10 passes over
    `[rows, V]` in cache (2x faster on 2 cores than whole chunks), in buffers allocated once per
    call (`logprob_chunks(reuse=True)`, `token_metrics_(work_2RV=…)`)."""
    cand = logprob_chunks(head, hidden_ND, chunk_tokens, rows_per_pass=CACHE_ROWS, reuse=True)
    ref_side = (logprob_chunks(ref.head, ref.head_input, chunk_tokens, rows_per_pass=CACHE_ROWS, reuse=True)
                if ref.logp is None else None)
    work_2RV = torch.empty((2, min(CACHE_ROWS, hidden_ND.shape[0]), head.vocab_size), dtype=torch.float32,
                           device=hidden_ND.device)
    parts = [_scored(ref, at, None if ref_side is None else next(ref_side)[1], logp_cand, cand_name, work_2RV)
             for at, logp_cand in cand]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _scored(ref: Reference, at: slice, logp_ref: torch.Tensor | None, logp_cand: torch.Tensor,
            cand_name: str, work_2RV: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`token_metrics_` of the reference rows `at` (`logp_ref`, or the reference's cache when None)
    against the candidate's log-probs `[C, V]`, both sides checked finite."""
    if logp_ref is not None:
        metrics = token_metrics_(logp_ref, logp_cand, ref.token[at], work_2RV=work_2RV)
    else:  # the cache is shared by every candidate: read it, never write it
        metrics = token_metrics_(ref.logp[at], logp_cand, ref.token[at], ref_shared=True,
                                 argmax_ref_C=ref.logp_argmax[at], work_2RV=work_2RV)
    # a NaN/+Inf logit makes that row's log-probs NaN; -Inf logits (masked tokens) are fine
    _check_finite(metrics["logp_ref"], f"reference {ref.name}", ref, at)
    _check_finite(metrics["logp_cand"], f"candidate {cand_name}", ref, at)
    return metrics


def _probe_external(reference, cand: ExternalLM, input_ids, attention_mask, response_mask, per_layer: bool,
                    clip: float, chunk_tokens: int) -> ProbeResult:
    """`probe` of an engine: its logits, one sequence at a time, through the same metric code."""
    if per_layer:
        raise InputError(f"{cand.name} runs outside PyTorch: no per-layer metrics; use per_layer=False")
    ref = _as_reference(reference, input_ids, attention_mask, response_mask, per_layer=False)
    _check_vocab_size(ref, cand.vocab_size, cand.name)
    attn = ref.attention_mask.bool()
    if bool((attn.long().diff(dim=1).abs().sum(1) > 2).any()):
        raise InputError(f"{cand.name} needs each sequence's attended tokens contiguous (padding at the ends only)")
    if cand.context_length is not None and int(ref.position_ids.max()) + 1 > cand.context_length:
        raise InputError(f"sequence of {int(ref.position_ids.max()) + 1} tokens is longer than {cand.name}'s "
                         f"context of {cand.context_length}")
    parts = []
    for s in torch.unique(ref.seq).tolist():
        rows_s = (ref.seq == s).nonzero().squeeze(1)  # contiguous: the reference's rows are sequence-major
        logits_TV = cand.sequence_logits(ref.input_ids[s][attn[s]].tolist())
        for part in token_chunks(len(rows_s), chunk_tokens):
            at = slice(int(rows_s[part.start]), int(rows_s[part.stop - 1]) + 1)
            lq = torch.log_softmax(logits_TV[ref.pos[at] - 1].float(), dim=-1)
            lp = None if ref.logp is not None else torch.log_softmax(ref.head.logits(ref.head_input[at]), dim=-1)
            parts.append(_scored(ref, at, lp, lq, cand.name))
    tok = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return _result(ref, tok, [], cand.name, clip)
