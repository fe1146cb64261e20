"""Score an engine's rollouts against the trainer's checkpoint, or against the trainer log-probs the dump
logged: `score_rollouts(model, rollouts)`, `score_rollouts(None, rollouts)`.

The engine sampled each response and logged `log q(y)` (its own log-probability of every response
token); the model scores the same tokens teacher-forced, `log p(y)`, in fp32 (the trainer's view), each
whole sequence as context and only its scored positions (`DumpRecord.scored`) as tokens. Without a model
(`model=None`) the trainer side is the `log p(y)` the dump logged (prime-rl's `trainer_logprobs`, slime's
train data `log_probs`): the same statistics, from the same code, as a model whose teacher-forced log-probs
are the logged ones; the result's `reference` says which side was used (`trainer_side`).
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

from mismatch.dumps.formats import TRAINER_FIELDS, DumpRecord, EngineDump, read_rollouts, temperature_notes
from mismatch.errors import InputError, NumericsError, VocabMismatchError
from mismatch.files import check_writable
from mismatch.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_CLIP
from mismatch.model.head import Head, head_inputs, logprob_chunks
from mismatch.metrics import ratio_columns, rollout_stats, sampled_summary, sampled_token_metrics
from mismatch.model.loader import LM, context_length, parse_dtype
from mismatch.pairs.load import load_member
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
LOGGED = "logged trainer log-probs"  # the `reference` of a result whose trainer side the dump logged starts with it


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
        resp[b, len(r.prompt_ids):len(seq)] = torch.tensor(r.mask)  # unscored positions: context only
    rows = head_inputs(lm.model, ids, attn, response_index(resp)).rows_ND
    seq_N, t_N = resp.nonzero(as_tuple=True)
    token_N = ids[seq_N, t_N]
    tops = [top for r in records for top, on in zip(r.top_logprobs or [None] * len(r.response_ids), r.mask) if on]
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
    token_dev, top_dev = token_N.to(rows.device), top_ids.to(rows.device)  # the head's device; columns stay on the CPU
    for at, logp_CV in logprob_chunks(Head.of(lm.model), rows, chunk_tokens):
        logp_N[at] = logp_CV.gather(-1, token_dev[at].unsqueeze(-1)).squeeze(-1).cpu()
        top_lp[at] = logp_CV.gather(-1, top_dev[at]).double().cpu()
    bad = ~torch.isfinite(logp_N)
    if bool(bad.any()):
        n = int(bad.nonzero()[0])
        raise NumericsError(f"{records[int(seq_N[n])].where}: {lm.name} produced NaN/Inf logits predicting "
                            f"response position {int(t_N[n]) - len(records[int(seq_N[n])].prompt_ids)}")
    kl_pq, kl_qp, mass = coarse_kl(top_lp, top_lq, top_mask, Head.of(lm.model).vocab_size)
    has = top_mask.any(-1)  # tokens without top-k get topk 0 and NaN
    nan = torch.full_like(kl_pq, float("nan"))
    return {"seq": seq_N + first_seq, "pos": t_N, "token": token_N, "logp_ref": logp_N,
            "logp_cand": torch.tensor(_scored(records, "logprobs"), dtype=torch.float32),
            "topk": top_mask.sum(-1), "topk_mass_cand": torch.where(has, mass, nan),
            "kl_fwd_topk": torch.where(has, kl_pq, nan), "kl_rev_topk": torch.where(has, kl_qp, nan)}


def _scored(records: list[DumpRecord] | tuple[DumpRecord, ...], name: str) -> list:
    """A per-response-position field of `records` (`logprobs`, `trainer_logprobs`, `response_ids`) at their scored
    positions, record after record."""
    return [v for r in records for v, on in zip(getattr(r, name), r.mask) if on]


def _model_columns(lm: LM, dump: EngineDump, check_text: bool, chunk_tokens: int, batch_tokens: int
                   ) -> dict[str, torch.Tensor]:
    """Per scored token, the trainer side recomputed: `lm` teacher-forced over each whole sequence."""
    check_dump(dump, lm, check_text=check_text)
    parts, first = [], 0
    for group in _batches(dump.records, batch_tokens):
        parts.append(_score_group(lm, [dump.records[i] for i in group], first, chunk_tokens))
        first += len(group)
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _logged_columns(dump: EngineDump) -> dict[str, torch.Tensor]:
    """Per scored token, the trainer side the dump logged: no model runs."""
    if not dump.records:
        raise InputError(f"{dump.source}: no rollout record")
    missing = next((r for r in dump.records if r.trainer_logprobs is None), None)
    if missing is not None:
        raise InputError(f"{missing.where}: no logged trainer log-probs (prime-rl's trainer_logprobs, slime's "
                         "--save-debug-train-data log_probs, our trainer_logprobs): give the trainer's checkpoint to "
                         "recompute them")
    seq = [s for s, r in enumerate(dump.records) for on in r.mask if on]
    pos = [len(r.prompt_ids) + t for r in dump.records for t, on in enumerate(r.mask) if on]
    return {"seq": torch.tensor(seq), "pos": torch.tensor(pos),
            "token": torch.tensor(_scored(dump.records, "response_ids")),
            "logp_ref": torch.tensor(_scored(dump.records, "trainer_logprobs"), dtype=torch.float32),
            "logp_cand": torch.tensor(_scored(dump.records, "logprobs"), dtype=torch.float32)}


def _logged_fields(dump: EngineDump) -> str:
    """Where the dump's trainer log-probs come from: `prime-rl trainer_logprobs`, `slime log_probs`, …"""
    return ", ".join(TRAINER_FIELDS[s] for s in dump.shapes if s in TRAINER_FIELDS)


def trainer_side(result: ProbeResult) -> str:
    """`"logged"` when the trainer side of a `score_rollouts` result is the log-probs its dump logged (no
    model ran), else `"recomputed"` (a model teacher-forced)."""
    return "logged" if result.reference.startswith(LOGGED) else "recomputed"


def score_rollouts(model: str | LM | None, rollouts: str | Path | EngineDump, *, clip: float = DEFAULT_CLIP,
                   check_text: bool = True, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, batch_tokens: int = BATCH_TOKENS,
                   out: str | Path | None = None, ref_dtype: str = "fp32", device: str = "cpu") -> ProbeResult:
    """Score an engine's sampled rollouts, with its own log-probs, against the trainer's: `model`
    teacher-forced, or without a model the trainer log-probs the dump logged.

    Args:
        model: the trainer's checkpoint (anything `mismatch.load` takes, or an `LM`), which recomputes
            the trainer side; None: the dump's logged trainer log-probs are the trainer side (prime-rl's
            `trainer_logprobs`, slime's `--save-debug-train-data` `log_probs`: both at the sampling
            temperature, as the engine's), and no model runs.
        rollouts: a dump file (`mismatch.dumps.formats`: JSONL/JSON/parquet in the mismatch schema or
            as vLLM, SGLang or OpenAI-compatible servers emit it, prime-rl's token export, slime's
            debug data) or an `EngineDump`.
        clip: IS ratios outside `[1/clip, clip]` count in `is_ratio_outside_frac`.
        check_text: check that each response's ids decode to the text the engine printed.
        chunk_tokens, batch_tokens: rows per head matmul; padded tokens per forward pass.
        out: also write `per_token` there (`.parquet` or `.csv`, complete or not at all).
        ref_dtype: the precision a model spec is loaded in, the trainer's (`fp32`, `bf16`, `fp16`); the log-probs
            are computed in fp32 from its hidden states either way. Ignored for an `LM` and without a model.
        device: where a model spec is loaded (`"cpu"`, `"cuda[:N]"`, `"auto"`); the columns come back on the CPU.

    Returns:
        A `ProbeResult` with `per_token` columns seq (record order), pos (position in prompt +
        response), token, logp_ref (the trainer's log p(y)), logp_cand (the engine's log q(y)),
        is_ratio = p(y)/q(y), k3, one row per scored token, plus topk, topk_mass_cand, kl_fwd_topk,
        kl_rev_topk where a model scored an engine's top-k (NaN where it gave none); an empty
        `per_layer`; `summary`: the sampled-token statistics under the probes' names, `mismatch_*`
        (the admission check's) and the frameworks' names, with `kl_fwd_topk_mean` etc. when top-k
        log-probs were scored; `reference`: the model's name, or `LOGGED` and the field
        (`trainer_side` says which).

    Raises:
        InputError, VocabMismatchError, NumericsError: one line naming the record.
    """
    if not clip > 1.0:
        raise InputError(f"clip must be > 1, got {clip}")
    if out is not None and Path(out).suffix not in (".parquet", ".csv"):
        raise InputError(f"the per-token table's file must end in .parquet or .csv, got {out}")
    if out is not None:
        check_writable(out, "per-token table", folder=False)
    lm = None if model is None else model if isinstance(model, LM) else load_member(model, dtype=parse_dtype(ref_dtype),
                                                                                     device=device)
    tokenizer = None if lm is None else lm.tokenizer  # OpenAI-compatible token strings need it
    dump = rollouts if isinstance(rollouts, EngineDump) else read_rollouts(rollouts, tokenizer)
    cols = _logged_columns(dump) if lm is None else _model_columns(lm, dump, check_text, chunk_tokens, batch_tokens)
    lp, lq, seq = cols["logp_ref"], cols["logp_cand"], cols["seq"]
    cols["is_ratio"], cols["k3"] = ratio_columns(lp, lq)
    summary = {**sampled_summary(lp, lq, seq, clip),
               **{f"mismatch_{k}": v for k, v in sampled_token_metrics(lp, lq, clip).items()},
               **rollout_stats(lp, lq, seq)}
    has = cols["topk"] > 0 if "topk" in cols else torch.zeros(0, dtype=torch.bool)
    if bool(has.any()):  # the top-k columns and their means only where the engine logged top-k
        summary.update({"topk_tokens": float(has.sum()), **{f"{k}_mean": float(cols[k][has].mean())
                                                            for k in TOPK_COLUMNS[1:]}})
    names = [*TOKEN_COLUMNS, *(TOPK_COLUMNS if bool(has.any()) else ())]
    per_token = pd.DataFrame({k: cols[k].numpy() for k in names})
    if out is not None:
        write_frame(per_token, Path(out))
    source = f"{dump.source} ({', '.join(dump.shapes)}{', ' + dump.meta['engine'] if dump.meta.get('engine') else ''})"
    if lm is None:
        reference, notes = f"{LOGGED} ({_logged_fields(dump)})", _logged_notes(dump)
    else:
        reference = lm.name
        notes = [*dump.notes, *_tokenizer_doubt(dump, lm, summary, check_text)]
        if any(r.trainer_logprobs is not None for r in dump.records):
            notes.append(f"{dump.source}: the trainer side is recomputed by {lm.name} teacher-forced; the trainer "
                         f"log-probs the dump logged ({_logged_fields(dump)}) are not used (score it without a model "
                         "to use them)")
    return ProbeResult(per_token=per_token, per_layer=pd.DataFrame(columns=list(LAYER_COLUMNS)), summary=summary,
                       reference=reference, candidate=source, notes=notes)


def _logged_notes(dump: EngineDump) -> list[str]:
    """The dump's notes that hold for its logged trainer side: its trainer's log-probs are at the sampling
    temperature, as the engine's, so the notes reading them as temperature 1 are dropped."""
    at_one = set(temperature_notes(dump.source, dump.shapes))
    notes = [n for n in dump.notes if n not in at_one]
    if any(r.top_logprobs for r in dump.records):
        notes.append(f"{dump.source}: the engine's top-k log-probs are not scored without a model (the truncated KL "
                     "needs the trainer's distribution)")
    return notes


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

