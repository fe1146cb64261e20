"""Score an engine's rollouts against the trainer's checkpoint: `score_rollouts(model, rollouts)`.

The engine sampled each response and logged `log q(y)` (its own log-probability of every response
token); the model scores the same tokens teacher-forced, `log p(y)`, in fp32 (the trainer's view).
The per-token and summary statistics are those of the probes on sampled tokens
(`mismatch.metrics.sampled_summary`), the admission check's (`mismatch_*`) and the frameworks'
(`mismatch.metrics.rollout_stats`: verl, slime, NeMo RL): one metric code for every source.

Where the engine also logged its top-k log-probs, each token gets a truncated KL: both distributions
coarsened to the engine's top-k tokens plus one "rest" outcome. Merging outcomes never increases a KL
divergence (log-sum inequality), so `kl_fwd_topk` ≤ KL(p‖q) and `kl_rev_topk` ≤ KL(q‖p) token by
token: the estimate is biased low, by what the two distributions disagree on inside the rest.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from mismatch.engines.dumps import DumpRecord, EngineDump, read_rollouts
from mismatch.errors import InputError, NumericsError, VocabMismatchError
from mismatch.files import check_writable
from mismatch.model.head import Head, head_inputs, logprob_chunks
from mismatch.metrics import ratio_columns, rollout_stats, sampled_summary, sampled_token_metrics
from mismatch.model.loader import LM, context_length
from mismatch.pairs.registry import load_member
from mismatch.model.positions import response_index
from mismatch.probes.core import LAYER_COLUMNS, ProbeResult
from mismatch.results import write_frame
from mismatch.model.generate import pad_id
from mismatch.model.tokenizer import vocab_fingerprint

BATCH_TOKENS = 8192  # padded tokens per forward pass (B · T)
TOKEN_COLUMNS = ("seq", "pos", "token", "logp_ref", "logp_cand", "is_ratio", "k3")
TOPK_COLUMNS = ("topk", "topk_mass_cand", "kl_fwd_topk", "kl_rev_topk")
DOUBT_NATS = 3.0  # mean log q − log p per token above which a dump without a tokenizer check is doubted
REST_TOL = 1e-5  # a rest mass below this is rounding (fp32 log-probs of up to ~20 listed tokens): merged


def check_dump(dump: EngineDump, lm: LM, *, check_text: bool = True) -> None:
    """Raise a one-line error when `dump` cannot have come from `lm`'s tokenizer and context, or was
    not sampled at temperature 1: the metadata's vocabulary size or fingerprint differ or its
    `temperature` is not 1, a token id lies outside the vocabulary, a sequence is longer than the
    context, or (with `check_text`) a response's ids do not decode to the text the engine printed
    (`_same_text`)."""
    if not dump.records:
        raise InputError(f"{dump.source}: no rollout record")
    vocab = Head.of(lm.model).vocab_size
    meta = dump.meta
    if "vocab_size" in meta and _meta_number(meta, "vocab_size", dump.source) != vocab:
        raise VocabMismatchError(f"{dump.source}: written for a vocabulary of {meta['vocab_size']}, "
                                 f"{lm.name} has {vocab}")
    if meta.get("vocab_fingerprint") and meta["vocab_fingerprint"] != vocab_fingerprint(lm.tokenizer):
        raise VocabMismatchError(f"{dump.source}: written with another tokenizer than {lm.name}'s "
                                 f"(vocab fingerprint {meta['vocab_fingerprint']})")
    if "temperature" in meta and _meta_number(meta, "temperature", dump.source) != 1:
        raise InputError(f"{dump.source}: sampled at temperature {meta['temperature']}; the mismatch is measured "
                         "on log-probs of temperature-1 sampling (the trainer's distribution)")
    limit = context_length(lm.model)
    for r in dump.records:
        ids = r.prompt_ids + r.response_ids + tuple(t for top in r.top_logprobs or () for t in top)
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise VocabMismatchError(f"{r.where}: token id {bad} is outside {lm.name}'s vocabulary of {vocab}")
        if limit is not None and len(r.prompt_ids) + len(r.response_ids) > limit:
            raise InputError(f"{r.where}: {len(r.prompt_ids) + len(r.response_ids)} tokens, longer than "
                             f"{lm.name}'s context of {limit}")
        if check_text and r.text is not None and not _same_text(lm.tokenizer, r):
            decoded = lm.tokenizer.decode(list(r.response_ids), skip_special_tokens=True)
            raise VocabMismatchError(f"{r.where}: the response ids decode to {decoded[:40]!r} with {lm.name}'s "
                                     f"tokenizer, the engine printed {r.text[:40]!r}: another tokenizer?")


def _meta_number(meta: dict, key: str, source: str) -> float:
    try:
        return float(meta[key])
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{source}: metadata {key} {str(meta[key])[:40]!r} is not a number") from None


def _same_text(tokenizer, r: DumpRecord) -> bool:
    """Whether the engine's printed text is what the response ids decode to, or a prefix of it (a
    stop string may cut the text). The ids are decoded after the prompt, as engines detokenize, and
    with and without special tokens; leading whitespace is ignored (SentencePiece decoders drop
    the space a response starts with when it is decoded alone)."""
    text = r.text.lstrip()
    for skip in (True, False):
        full = tokenizer.decode(list(r.prompt_ids + r.response_ids), skip_special_tokens=skip)
        prompt = tokenizer.decode(list(r.prompt_ids), skip_special_tokens=skip)
        alone = tokenizer.decode(list(r.response_ids), skip_special_tokens=skip)
        after = full[len(prompt):] if full.startswith(prompt) else alone
        if any(d.lstrip().startswith(text) for d in (after, alone)):
            return True
    return False


def _batches(records: tuple[DumpRecord, ...], batch_tokens: int) -> list[list[int]]:
    """Consecutive record indices, grouped so each group's padded size stays ≤ batch_tokens."""
    groups: list[list[int]] = []
    width = 0
    for i, r in enumerate(records):
        n = len(r.prompt_ids) + len(r.response_ids)
        if groups and max(width, n) * (len(groups[-1]) + 1) <= batch_tokens:
            groups[-1].append(i)
            width = max(width, n)
        else:
            groups.append([i])
            width = n
    return groups


def coarse_kl(logp_K: torch.Tensor, logq_K: torch.Tensor, mask_K: torch.Tensor, vocab_size: int | None = None
              ) -> tuple[torch.Tensor, ...]:
    """KL divergences of two distributions coarsened to K listed tokens plus one "rest" outcome.

    A rest mass is 1 − the listed mass. Where the listed tokens are the whole vocabulary (K ==
    `vocab_size`) there is no rest outcome: both residues are fp32 rounding and are dropped, so the
    result is the full KL of the listed log-probs. Otherwise, where either side's rest is below
    `REST_TOL` (rounding can put a listed mass at or above 1), the rest outcome is merged into the
    listed token q rates highest: a further coarsening, so still a lower bound, and no log of a
    rounding residue.

    Args:
        logp_K, logq_K: `[N, K]` log-probs (nats) of the listed tokens under p and q (any value where
            `mask_K` is False).
        mask_K: `[N, K]` which entries are listed (distinct token ids).
        vocab_size: the vocabulary's size V; a row listing V tokens has no rest outcome.

    Returns:
        `(kl_pq, kl_qp, mass_q)`, each `[N]` float64: KL(p̄‖q̄), KL(q̄‖p̄) of the coarsened
        distributions (lower bounds of the full ones) and q's listed mass.
    """
    lq_listed = torch.where(mask_K, logq_K.double(), -math.inf)
    p, q = torch.where(mask_K, logp_K.double(), -math.inf).exp(), lq_listed.exp()
    mass_q = q.sum(-1)
    complete = mask_K.sum(-1) == (-1 if vocab_size is None else vocab_size)  # [N]: no rest outcome
    p_rest = torch.where(complete, 0.0, 1.0 - p.sum(-1))
    q_rest = torch.where(complete, 0.0, 1.0 - mass_q)
    merge = ((p_rest < REST_TOL) | (q_rest < REST_TOL)) & ~complete
    top = lq_listed.argmax(-1, keepdim=True)  # q's most likely listed token takes the rest where merged
    p = p.scatter_add(-1, top, torch.where(merge, p_rest.clamp(min=0.0), 0.0).unsqueeze(-1))
    q = q.scatter_add(-1, top, torch.where(merge, q_rest.clamp(min=0.0), 0.0).unsqueeze(-1))
    p_rest, q_rest = torch.where(merge, 0.0, p_rest), torch.where(merge, 0.0, q_rest)
    tiny = torch.finfo(torch.float64).tiny

    def kl(a, b, a_rest, b_rest):
        listed = torch.where(a > 0, a * (a.clamp(min=tiny).log() - b.clamp(min=tiny).log()), 0.0).sum(-1)
        rest = torch.where(a_rest > 0, a_rest * (a_rest.clamp(min=tiny).log() - b_rest.clamp(min=tiny).log()), 0.0)
        return (listed + rest).clamp(min=0.0)  # ≥ 0 in exact arithmetic

    return kl(p, q, p_rest, q_rest), kl(q, p, q_rest, p_rest), mass_q


@torch.no_grad()
def _score_group(lm: LM, records: list[DumpRecord], first_seq: int, chunk_tokens: int) -> dict[str, torch.Tensor]:
    """Per-token columns of consecutive records, scored by `lm` in one forward pass."""
    B, T = len(records), max(len(r.prompt_ids) + len(r.response_ids) for r in records)
    ids = torch.full((B, T), pad_id(lm.tokenizer), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    resp = torch.zeros((B, T), dtype=torch.bool)
    for b, r in enumerate(records):
        seq = r.prompt_ids + r.response_ids
        ids[b, :len(seq)] = torch.tensor(seq)
        attn[b, :len(seq)] = 1
        resp[b, len(r.prompt_ids):len(seq)] = True
    rows = head_inputs(lm.model, ids, attn, response_index(resp)).rows_ND
    seq_N, t_N = resp.nonzero(as_tuple=True)
    token_N = ids[seq_N, t_N]
    tops = [top for r in records for top in (r.top_logprobs or [None] * len(r.response_ids))]
    K = max((len(t) for t in tops if t), default=0)
    top_ids = torch.zeros((len(tops), max(K, 1)), dtype=torch.long)
    top_lq = torch.zeros((len(tops), max(K, 1)), dtype=torch.float64)
    top_mask = torch.zeros((len(tops), max(K, 1)), dtype=torch.bool)
    for n, t in enumerate(tops):
        if t:
            top_ids[n, :len(t)] = torch.tensor(list(t.keys()))
            top_lq[n, :len(t)] = torch.tensor(list(t.values()), dtype=torch.float64)
            top_mask[n, :len(t)] = True
    logp_N = torch.empty(len(tops), dtype=torch.float32)
    top_lp = torch.zeros_like(top_lq)
    for at, logp_CV in logprob_chunks(Head.of(lm.model), rows, chunk_tokens):
        logp_N[at] = logp_CV.gather(-1, token_N[at].unsqueeze(-1)).squeeze(-1)
        top_lp[at] = logp_CV.gather(-1, top_ids[at]).double()
    bad = ~torch.isfinite(logp_N)
    if bool(bad.any()):
        n = int(bad.nonzero()[0])
        raise NumericsError(f"{records[int(seq_N[n])].where}: {lm.name} produced NaN/Inf logits predicting "
                            f"response position {int(t_N[n]) - len(records[int(seq_N[n])].prompt_ids)}")
    kl_pq, kl_qp, mass = coarse_kl(top_lp, top_lq, top_mask, Head.of(lm.model).vocab_size)
    has = top_mask.any(-1)  # tokens without top-k get topk 0 and NaN
    nan = torch.full_like(kl_pq, float("nan"))
    return {"seq": seq_N + first_seq, "pos": t_N, "token": token_N, "logp_ref": logp_N,
            "logp_cand": torch.tensor([lp for r in records for lp in r.logprobs], dtype=torch.float32),
            "topk": top_mask.sum(-1), "topk_mass_cand": torch.where(has, mass, nan),
            "kl_fwd_topk": torch.where(has, kl_pq, nan), "kl_rev_topk": torch.where(has, kl_qp, nan)}


def score_rollouts(model: str | LM, rollouts: str | Path | EngineDump, *, clip: float = 2.0,
                   check_text: bool = True, chunk_tokens: int = 1024, batch_tokens: int = BATCH_TOKENS,
                   out: str | Path | None = None) -> ProbeResult:
    """Score an engine's sampled rollouts, with its own log-probs, against `model` teacher-forced.

    Args:
        model: the trainer's checkpoint: anything `mismatch.load` takes, or an `LM`.
        rollouts: a dump file (`mismatch.engines.dumps`: JSONL/JSON/parquet in the mismatch schema or
            as vLLM, SGLang or OpenAI-compatible servers emit it) or an `EngineDump`.
        clip: IS ratios outside `[1/clip, clip]` count in `is_ratio_outside_frac`.
        check_text: check that each response's ids decode to the text the engine printed.
        chunk_tokens, batch_tokens: rows per head matmul; padded tokens per forward pass.
        out: also write `per_token` there (`.parquet` or `.csv`, complete or not at all).

    Returns:
        A `ProbeResult` with `per_token` columns seq (record order), pos (position in prompt +
        response), token, logp_ref (the model's log p(y)), logp_cand (the engine's log q(y)),
        is_ratio = p(y)/q(y), k3, plus topk, topk_mass_cand, kl_fwd_topk, kl_rev_topk (NaN where
        the engine gave no top-k); an empty `per_layer`; and `summary`: the sampled-token
        statistics under the probes' names, `mismatch_*` (the admission check's) and the
        frameworks' names, with `kl_fwd_topk_mean` etc. when top-k log-probs were present.

    Raises:
        InputError, VocabMismatchError, NumericsError: one line naming the record.
    """
    if not clip > 1.0:
        raise InputError(f"clip must be > 1, got {clip}")
    if out is not None and Path(out).suffix not in (".parquet", ".csv"):
        raise InputError(f"the per-token table's file must end in .parquet or .csv, got {out}")
    if out is not None:
        check_writable(out, "per-token table", folder=False)
    lm = model if isinstance(model, LM) else load_member(model)
    dump = rollouts if isinstance(rollouts, EngineDump) else read_rollouts(rollouts, lm.tokenizer)
    check_dump(dump, lm, check_text=check_text)
    parts, first = [], 0
    for group in _batches(dump.records, batch_tokens):
        parts.append(_score_group(lm, [dump.records[i] for i in group], first, chunk_tokens))
        first += len(group)
    cols = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    lp, lq, seq = cols["logp_ref"], cols["logp_cand"], cols["seq"]
    cols["is_ratio"], cols["k3"] = ratio_columns(lp, lq)
    summary = {**sampled_summary(lp, lq, seq, clip),
               **{f"mismatch_{k}": v for k, v in sampled_token_metrics(lp, lq, clip).items()},
               **rollout_stats(lp, lq, seq)}
    has = cols["topk"] > 0
    if bool(has.any()):  # the top-k columns and their means only where the engine logged top-k
        summary.update({"topk_tokens": float(has.sum()), **{f"{k}_mean": float(cols[k][has].mean())
                                                            for k in TOPK_COLUMNS[1:]}})
    names = [*TOKEN_COLUMNS, *(TOPK_COLUMNS if bool(has.any()) else ())]
    per_token = pd.DataFrame({k: cols[k].numpy() for k in names})
    if out is not None:
        write_frame(per_token, Path(out))
    source = f"{dump.source} ({', '.join(dump.shapes)}{', ' + dump.meta['engine'] if dump.meta.get('engine') else ''})"
    return ProbeResult(per_token=per_token, per_layer=pd.DataFrame(columns=list(LAYER_COLUMNS)), summary=summary,
                       reference=lm.name, candidate=source,
                       notes=[*dump.notes, *_tokenizer_doubt(dump, lm, summary, check_text)])


def _tokenizer_doubt(dump: EngineDump, lm: LM, summary: dict[str, float], check_text: bool) -> list[str]:
    """A warning when nothing in the dump could show it was tokenized by `lm`'s tokenizer (no text checked,
    no vocabulary fingerprint) and the model rates its tokens far below what the engine did: a mean
    log q(y) − log p(y) above `DOUBT_NATS` is what ids of another vocabulary look like (6 nats seen), not
    a rollout format (int4 on SmolLM2: 0.96)."""
    checked = dump.meta.get("vocab_fingerprint") or (check_text and any(r.text is not None for r in dump.records))
    if checked or summary["mismatch_kl"] <= DOUBT_NATS:
        return []
    return [f"{dump.source}: {lm.name} rates the dump's tokens {summary['mismatch_kl']:.2g} nats/token below the engine "
            "and the dump has no text or vocabulary fingerprint to check: it may come from another tokenizer"]

