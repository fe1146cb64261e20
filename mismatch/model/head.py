"""The output head and every log-probability computation: head input rows → fp32 logits → log-probs.

`head_inputs(...)` is the one place that runs a model keeping only its head's input rows at chosen
positions (no `[B, T, V]` logits); `Head` maps those rows to fp32 logits (with the family's logit
post-processing) and `logprob_chunks(...)` is the one chunked "head → warp → fp32 log-softmax"
loop that probes, rollouts and OPD share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from mismatch.errors import InputError
from mismatch.model.device import model_device
from mismatch.model.layout import capture, model_layout
from mismatch.model.positions import position_ids

CACHE_ROWS = 16  # rows per pass of elementwise work over [rows, V] fp32 (metrics, OPD losses): stays in cache


@dataclass(frozen=True)
class Head:
    """The map from the head's input `[N, D]` to fp32 logits, with any logit post-processing.

    Either a private copy of an `nn.Linear` head's weights (the reference side: immune to a
    later in-place perturbation of the model) or the live head module itself (the candidate
    side: its hooks and quantized forward run, as in the model). Known post-processing: Gemma's
    `final_logit_softcapping` (cap·tanh(z/cap)), Cohere's `logit_scale` (z·s) and Granite's
    `logits_scaling` (z/s). `reference()`/`probe()` check this map against the model's own output
    on one position per sequence, so an architecture doing something else fails loudly.
    """

    weight: torch.Tensor | None  # [V, D] private copy, or None for a live module
    bias: torch.Tensor | None  # [V]
    module: nn.Module | None
    vocab_size: int
    softcap: float | None = None
    scale: float = 1.0

    @classmethod
    def of(cls, model: nn.Module, *, copy: bool = False) -> Head:
        """The head of `model`: its live module, or (`copy`) a private copy of its weights."""
        head = model_layout(model).head
        cfg = model.config
        scale = float(getattr(cfg, "logit_scale", None) or 1.0)
        if getattr(cfg, "logits_scaling", None):
            scale /= float(cfg.logits_scaling)
        post = dict(softcap=getattr(cfg, "final_logit_softcapping", None), scale=scale)
        vocab = getattr(head, "out_features", None) or head.weight.shape[0]
        if not copy:
            return cls(None, None, head, vocab, **post)
        if type(head) is not nn.Linear:
            raise InputError(f"reference head of {type(model).__name__} is {type(head).__name__}, "
                             "not a plain nn.Linear; probe the unperturbed model as the reference")
        bias = None if head.bias is None else head.bias.detach().clone()
        return cls(head.weight.detach().clone(), bias, None, vocab, **post)

    def logits(self, hidden_ND: torch.Tensor) -> torch.Tensor:
        """fp32 logits `[N, V]`; the matmul runs in the head's own dtype, like the model's."""
        if self.module is not None:
            z = self.module(hidden_ND).float()
        else:
            z = F.linear(hidden_ND.to(self.weight.dtype), self.weight, self.bias).float()
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


def token_chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices of at most `size` rows covering `range(n)`."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def is_identity_warp(temperature: float = 1.0, top_p: float | None = None) -> bool:
    """Whether `warp(…, temperature, top_p)` leaves logits unchanged (sampling from the policy itself)."""
    return temperature in (0.0, 1.0) and (top_p is None or top_p >= 1.0)


def warp(logits_CV: torch.Tensor, temperature: float = 1.0, top_p: float | None = None) -> torch.Tensor:
    """The sampling distribution's logits: temperature then nucleus filtering with the same
    `transformers` warpers `generate` uses (filtered tokens get -inf). temperature 0 = 1 here."""
    if is_identity_warp(temperature, top_p):
        return logits_CV
    if temperature not in (0.0, 1.0):
        logits_CV = TemperatureLogitsWarper(temperature)(None, logits_CV)
    if top_p is not None and top_p < 1.0:
        logits_CV = TopPLogitsWarper(top_p)(None, logits_CV)
    return logits_CV


def logprob_chunks(head: Head, hidden_ND: torch.Tensor, chunk_tokens: int, *, rows_per_pass: int | None = None,
                   temperature: float = 1.0, top_p: float | None = None, reuse: bool = False
                   ) -> Iterator[tuple[slice, torch.Tensor]]:
    """fp32 log-probabilities `log_softmax(warp(head(h)))` of `hidden_ND` rows, chunk by chunk.

    The head runs on `chunk_tokens` rows at a time (its weights are streamed once per chunk); the
    log-softmax, and whatever the caller does with each yielded piece before asking for the next,
    runs on `rows_per_pass` rows at a time (default: the whole chunk), so elementwise passes over
    `[rows, V]` can stay in cache. At most one `[chunk_tokens, V]` logits tensor exists at a time.
    Gradients flow when `hidden_ND` carries them. The chunking never changes a row's value beyond
    fp32 rounding of the head matmul (BLAS sums rows in another order for another row count).

    With `reuse` (no gradients: the head runs under no_grad), every piece is written into one
    `[rows_per_pass, V]` buffer, which the next piece overwrites: the caller consumes a piece before
    asking for the next. The values are the same bits; what it saves is a fresh multi-megabyte
    tensor per piece, which the C allocator may map and page-fault anew each time (measured: the
    elementwise work up to 3× slower).

    Yields:
        `(rows, logp_CV)`: the slice of `hidden_ND` rows and their `[C, V]` fp32 log-probs.
    """
    buffer_RV = None
    for rows in token_chunks(hidden_ND.shape[0], chunk_tokens):
        with torch.set_grad_enabled(torch.is_grad_enabled() and not reuse):  # not across a yield
            z_CV = warp(head.logits(hidden_ND[rows]), temperature, top_p)
        per_pass = rows_per_pass or z_CV.shape[0]
        if reuse and buffer_RV is None:
            buffer_RV = torch.empty((min(per_pass, hidden_ND.shape[0]), z_CV.shape[1]), dtype=z_CV.dtype,
                                    device=z_CV.device)
        for part in token_chunks(z_CV.shape[0], per_pass):
            at = slice(rows.start + part.start, rows.start + part.stop)
            if reuse:  # torch.log_softmax's own kernel, written into the buffer
                yield at, torch._log_softmax(z_CV[part], -1, False, out=buffer_RV[:part.stop - part.start])
            else:
                yield at, torch.log_softmax(z_CV[part], dim=-1)
        del z_CV  # before the next chunk's logits exist


@dataclass(frozen=True)
class HeadInputs:
    """What one forward pass leaves for the chunked head: its input rows and a check sample."""

    rows_ND: torch.Tensor  # head inputs at the requested positions, model dtype
    last_BD: torch.Tensor  # head inputs at each sequence's last position (no grad)
    last_logits_BV: torch.Tensor  # the model's own fp32 logits there


MIN_SHARED_PREFIX = 16  # tokens: a shorter common prefix is not worth a separate pass


def shared_prefix(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> tuple[int, torch.Tensor]:
    """`(P, first_B)`: the number of leading attended tokens every row shares (the same token ids right
    after each row's left padding: a system prompt, a context every prompt carries) and each row's
    first attended position. P stops before each row's last attended token, so every row keeps at least
    one token of its own."""
    attn_BT = attention_mask_BT.bool()
    first_B = attn_BT.int().argmax(1)
    counts_B = attn_BT.sum(1)
    limit = int(counts_B.min()) - 1
    if input_ids_BT.shape[0] < 2 or limit < 1:
        return 0, first_B
    span = torch.arange(limit, device=input_ids_BT.device)
    rows_BP = input_ids_BT.gather(1, first_B[:, None] + span[None, :])
    same_P = (rows_BP == rows_BP[:1]).all(0) & attn_BT.gather(1, first_B[:, None] + span[None, :]).all(0)
    differs = (~same_P).nonzero()
    return (int(differs[0]) if len(differs) else limit), first_B


def head_inputs(model: nn.Module, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                index_N: torch.Tensor, *, on_layer: Callable[[int, torch.Tensor], None] | None = None,
                share_prefix: bool = False) -> HeadInputs:
    """Run `model` once, keeping its output head's input rows `[N, D]` at flat positions `index_N`.

    The model's own head runs on the last position only, so no `[B, T, V]` logits exist; apply
    `Head.logits` (or `logprob_chunks`) to the rows. Positions count from each sequence's first
    attended token (`positions.position_ids`). Gradients flow when the caller has them enabled
    (OPD's student), not under `torch.no_grad()` (probes, rollouts, teacher scoring).

    Args:
        model: a causal LM; input_ids_BT / attention_mask_BT: `[B, T]`.
        index_N: flat indices into `[B*T]` (`positions.response_index`).
        on_layer: called as `on_layer(index, hidden_ND)` with fp32 rows at `index_N` of the
            embedding (0), each decoder block (1..L) and the final norm (L+1).
        share_prefix: when every row starts with the same ≥ `MIN_SHARED_PREFIX` tokens before any
            requested position (`shared_prefix`: a teacher's context turns), run them once and every
            row's own tokens after them on that KV cache. The same numbers up to fp32 rounding
            (attention and matmul sums over other shapes), at a fraction of the cost when the prefix is
            much of each row; with gradients enabled they flow through the repeated cache into the one
            prefix pass, so each prefix weight gets the sum over rows in one backward (OPD's student
            with a system prompt: ~a quarter of SmolLM2's trunk FLOPs per step).

    The batch may lie on the CPU: it is moved to the model's device (a no-op where it is there), and the
    rows come back on that device.

    Raises:
        InputError: the model feeds its head something other than `[B, T, D]`.
    """
    device = model_device(model)
    input_ids_BT, attention_mask_BT, index_N = (t.to(device) for t in (input_ids_BT, attention_mask_BT, index_N))
    if share_prefix:
        P, first_B = shared_prefix(input_ids_BT, attention_mask_BT)
        T = input_ids_BT.shape[1]
        if len(index_N):  # every requested position stays out of the prefix (identical prompts share more)
            P = min(P, int((index_N % T - first_B[index_N // T]).min()))
        if P >= MIN_SHARED_PREFIX:
            return _head_inputs_after_prefix(model, input_ids_BT, attention_mask_BT, index_N, P, first_B, on_layer)
    return _capture_rows(model, input_ids_BT, index_N, on_layer, attention_mask=attention_mask_BT,
                         position_ids=position_ids(attention_mask_BT), use_cache=False)


def _capture_rows(model: nn.Module, input_ids_BT: torch.Tensor, index_N: torch.Tensor,
                  on_layer: Callable[[int, torch.Tensor], None] | None, **model_kwargs) -> HeadInputs:
    """One forward of `model` on `input_ids_BT` (`model_kwargs`: its mask, positions, cache), keeping
    the head's input rows at flat positions `index_N` into `[B*T]` (and each layer's, for `on_layer`);
    the model's own head runs on the last position only."""
    layout = model_layout(model)
    B, T = input_ids_BT.shape
    kept: dict[str, torch.Tensor] = {}

    def on_head_input(hidden_BTD: torch.Tensor) -> torch.Tensor:
        if hidden_BTD.shape[:2] != (B, T):
            raise InputError(f"{type(model).__name__} feeds its head {tuple(hidden_BTD.shape)}, expected [{B}, {T}, D]")
        kept["rows"] = hidden_BTD.reshape(B * T, -1).index_select(0, index_N)  # [N, D]
        kept["last"] = hidden_BTD[:, -1, :].detach().clone()  # [B, D]
        return hidden_BTD[:, -1:, :]  # the model's own head only runs on the last position

    layer_hook = None
    if on_layer is not None:
        def layer_hook(index: int, hidden_BTD: torch.Tensor) -> None:
            on_layer(index, hidden_BTD.reshape(B * T, -1).index_select(0, index_N).float())

    with capture(layout, layer_hook, on_head_input):
        out = model(input_ids=input_ids_BT, **model_kwargs)
    return HeadInputs(kept["rows"], kept["last"], out.logits[:, -1, :].detach().float())


def _head_inputs_after_prefix(model: nn.Module, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                              index_N: torch.Tensor, P: int, first_B: torch.Tensor,
                              on_layer: Callable[[int, torch.Tensor], None] | None) -> HeadInputs:
    """`head_inputs` when every row starts with the same P tokens: one pass over them with a KV cache,
    repeated for every row, then one pass over the window `[B, W]` that holds each row's own tokens
    (positions T − W … T − 1, the rest of each row masked), so a position t of the batch is window
    position t − (T − W) in every row."""
    from transformers import DynamicCache

    B, T = input_ids_BT.shape
    start = int(first_B.min()) + P  # the window: from the earliest first own token to the end
    W = T - start
    row_start_B = first_B + P
    dev = input_ids_BT.device
    window_mask_BW = attention_mask_BT[:, start:].clone()
    window_mask_BW[torch.arange(W, device=dev)[None, :] + start < row_start_B[:, None]] = 0  # another row's prefix span
    prefix_ids = input_ids_BT[:1, int(first_B[0]):int(first_B[0]) + P]
    cache = DynamicCache()
    model(input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids),
          position_ids=torch.arange(P, device=dev)[None, :], cache=cache, use_cache=True)
    cache.batch_repeat_interleave(B)
    mask_BL = torch.cat([torch.ones((B, P), dtype=attention_mask_BT.dtype, device=dev), window_mask_BW], 1)
    positions_BW = position_ids(mask_BL)[:, P:]
    window_index_N = (index_N // T) * W + index_N % T - start
    return _capture_rows(model, input_ids_BT[:, start:], window_index_N, on_layer, attention_mask=mask_BL,
                         position_ids=positions_BW, cache=cache, use_cache=True,
                         cache_position=torch.arange(P, P + W, device=dev))
