"""Rollout dumps from inference engines: read, validate and write them.

A dump holds sampled responses with the engine's own log-probability of every response token.
These record shapes are read (`SHAPES`), one record per JSONL line (or a JSON array; parquet for ours;
torch files for slime's), the shape found per record:

* **mismatch** (ours, written by `write_rollouts`): `prompt_token_ids` `[P]`, `response_token_ids`
  `[T]`, `response_logprobs` `[T]` (nats), optional `top_logprobs` (per response position a
  `{token_id: logprob}` map or `[[token_id, logprob], …]`), `response_text`, `token_ids`
  (the whole sequence, as verl and slime keep it: it must be the prompt followed by the response),
  `response_scored` (`[T]` booleans: the positions scored, `DumpRecord.scored`; absent: all) and
  `trainer_logprobs` (`[T]`, the trainer's own, where it logged them).
* **vLLM** `RequestOutput`: `prompt_token_ids` and `outputs[]` with `token_ids`, `text` and
  `logprobs` (per position `{token_id: Logprob | float}`; JSON turns the ids into strings). Each
  output is one sequence. vLLM returns the raw model's log-probs by default (`logprobs_mode`).
* **SGLang** `/generate` response: `meta_info.output_token_logprobs` (`[logprob, token_id, text]`
  triples or `{logprob, token_id}` maps), optional `meta_info.output_top_logprobs`, `text`; the
  prompt ids from `input_ids` or `prompt_token_ids` (the request's: SGLang does not echo them).
* **OpenAI-compatible** chat completion: `choices[].logprobs.content[]` with `token`, `logprob`,
  `top_logprobs[]`; token ids from `choices[].token_ids` (vLLM's `return_token_ids`), from
  `token_id:N` strings (vLLM's `return_tokens_as_token_ids`) or, failing both, from the model's
  tokenizer (a token string that decodes from exactly one id); the prompt ids from
  `prompt_token_ids` (vLLM's `return_token_ids`), which the OpenAI API itself does not return.

* **prime-rl** token export (`trainer.enable_token_export`, schema version 1, `src/prime_rl/trainer/rl/
  token_export.py` at 559b447: one JSON line per exported sequence, `token_exports/step_S/rank_R.jsonl`): per token
  `token_ids`, `position_ids`, `loss_mask`, `inference_logprobs` (the engine's), `trainer_logprobs` (both shifted
  right: index t holds log p(token t | tokens < t)), `rl_weights` / `ce_weights` / `ref_kl_weights` (a column of
  None: the batch has no such stream), `mismatch_kl`, …. A step's folder reads every rank's file, and only once
  prime-rl has touched its `STABLE` marker (after every rank flushed): a folder without one is refused, a rank
  file in one is read with a note. Scored are the tokens prime-rl measures its own `mismatch_kl` on
  (`prime_rl_measured`): loss-masked and, where the batch has weight streams, RL- or ref-KL-weighted; a
  CE-only sample (a frozen model's tokens) has none and is skipped, with a note. Each packed sample (its
  `position_ids` restart at 0) is one sequence: its prompt the tokens before its first scored token, its
  response from there to its last scored token, the unscored tokens inside (a multi-turn sample's tool output
  or user turns) context only (`DumpRecord.scored`). prime-rl does not export the sampling temperature (its
  trainer scales the logits by it): against a model the engine's log-probs are read as temperature 1, and
  said so; its `trainer_logprobs` are at that temperature too (vLLM's `processed_logprobs`, prime-rl's
  default), so scored from them (`score_rollouts(None, …)`) no model and no temperature is needed.
* **slime** debug rollout data (`--save-debug-rollout-data PATH`: `torch.save({"rollout_id", "samples":
  [Sample.to_dict(), …]})`) and train data (`--save-debug-train-data PATH`, format_version 2,
  `slime/observability/train_data_utils.py` at 624b824: one dict per training sample with its slice of every
  training column), read with `torch.load(weights_only=True)`: containers and tensors only. Per sample
  `tokens` (prompt + response), `response_length` (train data: `response_lengths`), `rollout_log_probs` (the
  engine's, one per response token), `loss_mask` (train data: `loss_masks`; tool tokens 0: context only,
  trailing ones dropped) and, in train data, the trainer's `log_probs` (at the rollout temperature, over the
  same nucleus when top-p < 1), which score it without a model. A sample with `remove_sample=True` (train
  data: a loss mask of 0s) is skipped, as slime trains on none of its tokens. slime stores no sampling
  settings, but a top-p < 1 run records each token's nucleus (`rollout_top_p_token_ids`): found, it is said.

Log-probs that are not those of the sampling distribution: when the metadata, a record's request
(`sampling_params`, `request`) or slime's recorded nucleus shows top-p < 1, top-k or min-p, the engine's
log-probs are of the renormalized truncated distribution, and `log r` carries `−log S` of each step's kept
mass S (TRL #6789: a kept mass of 0.895 gave an IS ratio mean of 0.896): the dump says so in its `notes`,
which every score of it repeats. The dump is still read: the statistics then include that truncation
(except where both sides are truncated alike: slime's train data scored from its trainer's `log_probs`).

A line `{"meta": {...}}` (parquet: the schema metadata key `mismatch_rollouts`) carries what the
engine knows: `vocab_size`, `vocab_fingerprint` (`mismatch.model.tokenizer.vocab_fingerprint`),
`tokenizer`, `engine`, `temperature`, `top_p`, `top_k`, `min_p`. The log-probs must be those of the
distribution the tokens were sampled from (temperature 1, no top-p/top-k truncation, for an unbiased
mismatch estimate).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mismatch.errors import InputError
from mismatch.files import atomic_write, atomic_write_text, trailing_number

POSITIVE_SLACK = 1e-6  # log-probs up to this above 0 are fp rounding of a near-certain token (read as 0)
META_KEY = "mismatch_rollouts"
STEP_DIR = re.compile(r"step_\d+")  # prime-rl's token_exports/step_S folder


@dataclass(frozen=True)
class DumpRecord:
    """One sampled response: token ids, the engine's log-prob of each response token (nats) and,
    where the engine gave them, its top-k log-probs per response position.

    `scored` marks the response positions the mismatch is measured on (None: every one). An unscored
    position (a tool's output or a user turn between two loss-masked turns, a token trained on that
    the policy did not sample) is context only: its `logprobs` (and `trainer_logprobs`) entry is 0.0
    and never read. A response starts and ends with a scored token: the prompt is everything before
    the first. `trainer_logprobs` are the trainer's own log p(y) per response position where the
    framework logged them (prime-rl's `trainer_logprobs`, slime's train data `log_probs`)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[dict[int, float], ...] | None = None
    text: str | None = None  # the response text the engine printed (a tokenizer round-trip check)
    where: str = ""  # "record 3 (line 4, vllm)": named in every error about it
    scored: tuple[bool, ...] | None = None
    trainer_logprobs: tuple[float, ...] | None = None

    @property
    def mask(self) -> tuple[bool, ...]:
        """Per response position, whether it is scored."""
        return self.scored if self.scored is not None else (True,) * len(self.response_ids)


@dataclass(frozen=True)
class EngineDump:
    """The records of one dump, in file order, and its metadata."""

    records: tuple[DumpRecord, ...]
    source: str
    shapes: tuple[str, ...]  # the record shapes found
    meta: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # one line each: what makes its log-probs other than temperature-1 sampling's

    @property
    def tokens(self) -> int:
        """The scored tokens."""
        return sum(sum(r.mask) for r in self.records)


def _int(value: Any, where: str, what: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        raise InputError(f"{where}: {what} {value!r} is not a token id") from None
    if isinstance(value, float) and value != out:
        raise InputError(f"{where}: {what} {value!r} is not a token id")
    return out


def _logprob(value: Any, where: str, at: str, what: str = "log-prob") -> float:
    if isinstance(value, dict):
        value = value.get("logprob")
    try:
        lp = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer too large for a float
        raise InputError(f"{where}: {what} at {at} is {str(value)[:40]}, not a number") from None
    if not math.isfinite(lp) or lp > POSITIVE_SLACK:
        raise InputError(f"{where}: {what} at {at} is {lp!r}; log-probs must be finite and ≤ 0")
    return min(lp, 0.0)


def _top(entries: Any, where: str, at: str) -> dict[int, float]:
    """A `{token_id: logprob}` map from a map or a list of `[id, lp]` / `[lp, id, text]` / dict entries.
    A token listed twice must carry the same log-prob both times."""
    if isinstance(entries, dict):
        pairs = [(_int(k, where, "top-k token id"), _logprob(v, where, at)) for k, v in entries.items()]
    else:
        pairs = [_top_entry(e, where, at) for e in entries or []]
    out: dict[int, float] = {}
    for token, lp in pairs:
        if out.setdefault(token, lp) != lp:
            raise InputError(f"{where}: token {token} is listed twice at {at}, with log-probs {out[token]!r} "
                             f"and {lp!r}")
    return out


def _top_entry(e: Any, where: str, at: str) -> tuple[int, float]:
    if isinstance(e, dict):
        return _int(e.get("token_id", e.get("id")), where, "top-k token id"), _logprob(e, where, at)
    if isinstance(e, (list, tuple)) and len(e) == 3:  # SGLang: [logprob, token_id, text]
        return _int(e[1], where, "top-k token id"), _logprob(e[0], where, at)
    if isinstance(e, (list, tuple)) and len(e) == 2:  # ours: [token_id, logprob]
        return _int(e[0], where, "top-k token id"), _logprob(e[1], where, at)
    raise InputError(f"{where}: cannot read the top-k entry {e!r} at {at}")


def _record(prompt: Any, response: Any, logprobs: list[float], top: list | None, text: str | None,
            where: str, full: Any = None, scored: Any = None, trainer: Any = None) -> DumpRecord:
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise InputError(f"{where}: no prompt token ids (a response needs at least one token before it)")
    if not isinstance(response, (list, tuple)) or not response:
        raise InputError(f"{where}: the response has no token")
    p_ids = tuple(_int(t, where, "prompt token id") for t in prompt)
    r_ids = tuple(_int(t, where, "response token id") for t in response)
    if len(logprobs) != len(r_ids):
        raise InputError(f"{where}: {len(r_ids)} response tokens but {len(logprobs)} log-probs")
    if full is not None and [_int(t, where, "token id") for t in full] != [*p_ids, *r_ids]:
        raise InputError(f"{where}: the sequence's token_ids are not its prompt followed by its response")
    mask = _scored_flags(scored, len(r_ids), where)
    on = mask or (True,) * len(r_ids)
    lps = tuple(_logprob(v, where, f"response position {i}") if m else 0.0
                for i, (v, m) in enumerate(zip(logprobs, on)))
    if trainer is not None:
        if len(trainer) != len(r_ids):
            raise InputError(f"{where}: {len(r_ids)} response tokens but {len(trainer)} trainer log-probs")
        trainer = tuple(_logprob(v, where, f"response position {i}", "trainer log-prob") if m else 0.0
                        for i, (v, m) in enumerate(zip(trainer, on)))
    tops = None
    if top is not None:
        if len(top) != len(r_ids):
            raise InputError(f"{where}: {len(r_ids)} response tokens but {len(top)} top-k entries")
        # sorted by token id: the sums over them then do not depend on the engine's listing order
        tops = tuple(dict(sorted(_top(t, where, f"response position {i}").items())) for i, t in enumerate(top))
    return DumpRecord(p_ids, r_ids, lps, tops, text, where, mask, trainer)


def _scored_flags(scored: Any, n: int, where: str) -> tuple[bool, ...] | None:
    """The scored flags of an `n`-token response, None when every position is scored."""
    if scored is None:
        return None
    if len(scored) != n:
        raise InputError(f"{where}: {n} response tokens but {len(scored)} scored flags")
    mask = tuple(bool(m) for m in scored)
    if not any(mask):
        raise InputError(f"{where}: no response position is scored")
    if not (mask[0] and mask[-1]):
        raise InputError(f"{where}: the response must start and end with a scored token (the prompt is everything "
                         "before the first)")
    return None if all(mask) else mask


def _turns(ids: list, scored: list[bool], logprobs: list, trainer: list | None, where: str) -> list[DumpRecord]:
    """The record of one sequence whose scored tokens are marked per token over the whole sequence (a
    framework's loss mask, in one or several turns): the prompt everything before the first scored token,
    the response from it to the last scored one (the tokens after it are context of nothing: dropped);
    no record when none is scored."""
    on = [i for i, m in enumerate(scored) if m]
    if not on:
        return []
    first, end = on[0], on[-1] + 1
    return [_record(ids[:first], ids[first:end], logprobs[first:end], None, None, where, scored=scored[first:end],
                    trainer=None if trainer is None else trainer[first:end])]


def _ours(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    return [_record(rec.get("prompt_token_ids"), rec.get("response_token_ids"), list(rec.get("response_logprobs") or []),
                    rec.get("top_logprobs"), rec.get("response_text"), where, rec.get("token_ids"),
                    rec.get("response_scored"), rec.get("trainer_logprobs"))]


def _vllm(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    out = []
    for j, o in enumerate(rec["outputs"]):
        w = f"{where}, output {j}"
        if not o.get("logprobs"):
            raise InputError(f"{w}: no per-token log-probs (sample with SamplingParams(logprobs=0) or more)")
        ids = o.get("token_ids") or []
        if len(o["logprobs"]) != len(ids):
            raise InputError(f"{w}: {len(ids)} response tokens but {len(o['logprobs'])} log-prob entries")
        lps, tops = [], []
        for i, (tok, pos) in enumerate(zip(ids, o["logprobs"])):
            top = _top(pos, w, f"response position {i}")
            if int(tok) not in top:
                raise InputError(f"{w}: the log-probs at response position {i} lack the sampled token {tok}")
            lps.append(top[int(tok)])
            tops.append(top)
        has_top = any(len(t) > 1 for t in tops)
        out.append(_record(rec.get("prompt_token_ids"), ids, lps, tops if has_top else None, o.get("text"), w))
    return out


def _sglang(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    meta = rec["meta_info"]
    ids, lps = [], []
    for i, e in enumerate(meta["output_token_logprobs"]):
        if isinstance(e, dict):
            lp, tok = e.get("logprob"), e.get("token_id", e.get("id"))
        elif isinstance(e, (list, tuple)) and len(e) >= 2:
            lp, tok = e[0], e[1]
        else:
            raise InputError(f"{where}: cannot read output_token_logprobs entry {i}: {e!r}")
        ids.append(tok)
        lps.append(lp)
    if rec.get("output_ids") is not None and [int(t) for t in rec["output_ids"]] != [int(t) for t in ids]:
        raise InputError(f"{where}: output_ids differ from the token ids of output_token_logprobs")
    top = meta.get("output_top_logprobs")
    top = None if not top or all(t is None for t in top) else [t or [] for t in top]
    prompt = rec.get("input_ids", rec.get("prompt_token_ids"))
    return [_record(prompt, ids, lps, top, rec.get("text"), where)]


def _openai_token(token: str, where: str, tokenizer, ids_of: dict) -> int:
    if token.startswith("token_id:"):
        return _int(token[len("token_id:"):], where, "token id")
    if tokenizer is None:
        raise InputError(f"{where}: token strings need the model's tokenizer to map them to ids")
    if not ids_of:
        by_text: dict[str, list[int]] = {}
        for i in range(len(tokenizer)):
            by_text.setdefault(tokenizer.decode([i]), []).append(i)
        ids_of.update(by_text)
    found = ids_of.get(token, [])
    if len(found) != 1:
        why = "no token" if not found else f"{len(found)} tokens"
        raise InputError(f"{where}: the token string {token!r} decodes from {why} of the model's tokenizer; "
                         "dump with vLLM's return_tokens_as_token_ids or return_token_ids")
    return found[0]


def _openai(rec: dict, where: str, tokenizer, ids_of: dict | None = None) -> list[DumpRecord]:
    ids_of = {} if ids_of is None else ids_of
    out = []
    for j, choice in enumerate(rec["choices"]):
        w = f"{where}, choice {j}"
        content = (choice.get("logprobs") or {}).get("content")
        if not content:
            raise InputError(f"{w}: no logprobs.content (request logprobs=true)")
        lps = [c.get("logprob") for c in content]
        given = choice.get("token_ids")
        ids = given if given is not None else [_openai_token(c["token"], w, tokenizer, ids_of) for c in content]
        tops = None
        if any(c.get("top_logprobs") for c in content):
            tops = [{_openai_token(t["token"], w, tokenizer, ids_of): t["logprob"] for t in c.get("top_logprobs") or []}
                    for c in content]
        text = (choice.get("message") or {}).get("content", choice.get("text"))
        prompt = rec.get("prompt_token_ids", choice.get("prompt_token_ids"))
        out.append(_record(prompt, ids, lps, tops, text, w))
    return out


PRIME_RL_SCHEMA = 1  # the prime-rl token export schema version read
SLIME_TRAIN_FORMAT = 2  # the slime train data (--save-debug-train-data) format_version read


def _stream(rec: dict, name: str, n: int, where: str) -> list[float] | None:
    """A prime-rl component weight stream (`rl_weights`, `ref_kl_weights`) of an `n`-token sequence; None where
    the batch had none (the exporter writes a column of None: `token_export.py` `_optional_tensor_to_floats`)."""
    values = rec.get(name)
    if values is None or all(v is None for v in values):
        return None
    if len(values) != n:
        raise InputError(f"{where}: {name} has {len(values)} values for {n} tokens")
    if any(v is None for v in values):
        raise InputError(f"{where}: {name} has a null (non-finite) weight")
    return [float(v) for v in values]


def prime_rl_measured(loss_mask: list, rl: list[float] | None, ref_kl: list[float] | None) -> list[bool]:
    """The tokens prime-rl measures its `mismatch_kl` on (`src/prime_rl/trainer/rl/train.py` ~498–506 at 559b447):
    the loss-masked ones and, where the batch carries a weight stream, of those only the RL- or ref-KL-weighted:
    the policy's samples. A token weighted by `ce_weights` alone (a frozen model's, distilled by cross-entropy)
    has no sampling log-prob. No stream at all (`rl` and `ref_kl` None): every loss-masked token."""
    if rl is None and ref_kl is None:
        return [bool(m) for m in loss_mask]
    sampled = [w != 0 for w in rl] if rl is not None else [bool(m) for m in loss_mask]
    if ref_kl is not None:
        sampled = [s or w != 0 for s, w in zip(sampled, ref_kl)]
    return [bool(m) and s for m, s in zip(loss_mask, sampled)]


def _prime_rl(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    version = rec.get("schema_version")
    if version != PRIME_RL_SCHEMA:
        raise InputError(f"{where}: prime-rl token export schema version {version!r}; this reads version "
                         f"{PRIME_RL_SCHEMA}")
    ids, mask, lps, trainer = rec["token_ids"], rec["loss_mask"], rec["inference_logprobs"], rec.get("trainer_logprobs")
    n = len(ids)
    positions = rec.get("position_ids") or list(range(n))
    if not n == len(mask) == len(lps) == len(positions) == (n if trainer is None else len(trainer)):
        raise InputError(f"{where}: token_ids, loss_mask, inference_logprobs, trainer_logprobs and position_ids differ "
                         "in length")
    if not any(mask):
        raise InputError(f"{where}: no loss-masked token to score")
    measured = prime_rl_measured(mask, _stream(rec, "rl_weights", n, where), _stream(rec, "ref_kl_weights", n, where))
    starts = [i for i, p in enumerate(positions) if int(p) == 0] or [0]  # packed samples restart at 0
    if starts[0] != 0:
        starts = [0, *starts]
    out = []
    for k, (lo, hi) in enumerate(zip(starts, [*starts[1:], n])):
        w = f"{where}, sample {k}"
        if any(lps[i] is None for i in range(lo, hi) if measured[i]):
            raise InputError(f"{w}: inference_logprobs has a null (non-finite) value at a scored token")
        out += _turns(ids[lo:hi], measured[lo:hi], lps[lo:hi], None if trainer is None else trainer[lo:hi], w)
    return out


def _slime_sequence(tokens: list, length: int, mask: Any, engine: list, trainer: list | None, what: tuple[str, str],
                    where: str) -> list[DumpRecord]:
    """One slime sample: `tokens` (prompt + response), the response's `length`, its loss mask (None: all 1) and
    the engine's (and the trainer's) log-probs of its tokens; `what` names the length and mask fields."""
    if not 0 < length < len(tokens):
        raise InputError(f"{where}: {what[0]} {length} of {len(tokens)} tokens (a prompt and a response needed)")
    mask = [1] * length if mask is None else [int(m) for m in mask]
    if len(mask) != length:
        raise InputError(f"{where}: {length} response tokens but {len(mask)} {what[1]} entries")
    if len(engine) != length:
        raise InputError(f"{where}: {length} response tokens but {len(engine)} rollout_log_probs")
    if trainer is not None and len(trainer) != length:
        raise InputError(f"{where}: {length} response tokens but {len(trainer)} log_probs")
    pad = [0.0] * (len(tokens) - length)
    return _turns(tokens, [False] * len(pad) + [m != 0 for m in mask], pad + engine,
                  None if trainer is None else pad + trainer, where)


def _slime(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    if rec.get("remove_sample"):  # slime zeroes its loss mask (`slime/ray/rollout.py` _convert_samples_to_train_data)
        return []
    return _slime_sequence(list(rec["tokens"]), int(rec["response_length"]), rec.get("loss_mask"),
                           [float(v) for v in rec["rollout_log_probs"] or []], None, ("response_length", "loss_mask"),
                           where)


def _slime_train(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    if rec.get("rollout_log_probs") is None:
        raise InputError(f"{where}: no rollout_log_probs (the engine's log-probs): slime keeps them when its rollout "
                         "returns log-probs")
    return _slime_sequence(list(rec["tokens"]), int(rec["response_lengths"]), rec.get("loss_masks"),
                           [float(v) for v in rec["rollout_log_probs"]], [float(v) for v in rec["log_probs"]],
                           ("response_lengths", "loss_masks"), where)


TRUNCATING = {"top_p": lambda v: v is not None and float(v) < 1.0, "top_k": lambda v: v is not None and int(v) > 0,
              "min_p": lambda v: v is not None and float(v) > 0.0}  # sampler settings that truncate the support


def truncation(settings: Any) -> str | None:
    """The truncating sampler settings in `settings` (a dict: a dump's metadata, a request's
    `sampling_params`), as `top_p 0.9, top_k 50`; None when it has none."""
    if not isinstance(settings, dict):
        return None
    found = []
    for key, truncates in TRUNCATING.items():
        try:
            if truncates(settings.get(key)):
                found.append(f"{key} {settings[key]}")
        except (TypeError, ValueError):
            found.append(f"{key} {settings[key]!r}")
    return ", ".join(found) or None


TRUNCATION_BIAS = ("so its log-probs are of the renormalized truncated distribution and log r carries −log S of "
                   "each step's kept mass S: the statistics include that truncation, which the calibrated limits "
                   "(temperature 1, no truncation) do not")
NUCLEUS = "slime recorded each token's top-p nucleus (rollout_top_p_token_ids): top-p < 1"


def _record_truncation(rec: dict) -> str | None:
    """What a record shows of a truncated sampler, and what it does to the statistics: its request's settings,
    or slime's recorded nucleus. slime's trainer renormalizes its `log_probs` over that same nucleus
    (`slime/backends/megatron_utils/loss.py` get_rollout_top_p_logprob_kwargs, its top-p replay), so train
    data scored from them compares two distributions truncated alike."""
    for settings in (rec.get("sampling_params"), (rec.get("request") or {}).get("sampling_params")
                     if isinstance(rec.get("request"), dict) else None, rec.get("request")):
        found = truncation(settings)
        if found:
            return f"its request says {found}, {TRUNCATION_BIAS}"
    nucleus = rec.get("rollout_top_p_token_ids")
    if nucleus is not None and len(nucleus) > 0:
        if "log_probs" in rec:
            return (f"{NUCLEUS}; slime's trainer renormalizes its log_probs over the same nucleus (top-p replay), so "
                    "scored from them (no model) both sides are truncated alike, while a model's recomputation is not: "
                    "its log r carries −log S of each step's kept mass S")
        return f"{NUCLEUS}, {TRUNCATION_BIAS}"
    return None


SHAPES = {  # shape name → (is it this shape?, reader)
    "mismatch": (lambda r: "response_token_ids" in r, _ours),
    "vllm": (lambda r: isinstance(r.get("outputs"), list), _vllm),
    "sglang": (lambda r: isinstance(r.get("meta_info"), dict) and "output_token_logprobs" in r["meta_info"], _sglang),
    "openai": (lambda r: isinstance(r.get("choices"), list), _openai),
    "prime-rl": (lambda r: "inference_logprobs" in r and "token_ids" in r and "loss_mask" in r, _prime_rl),
    "slime-train": (lambda r: "log_probs" in r and "response_lengths" in r and "tokens" in r, _slime_train),
    "slime": (lambda r: "rollout_log_probs" in r and "response_length" in r and "tokens" in r, _slime),
}
TRAINER_FIELDS = {"mismatch": "trainer_logprobs", "prime-rl": "prime-rl trainer_logprobs",
                  "slime-train": "slime log_probs"}  # shape → the field its trainer log-probs come from
SKIPPED = {  # shape → why a record of it can have no token to score
    "prime-rl": "no loss-masked token its trainer measures mismatch on (a CE-only sample: a frozen model's tokens, "
                "weighted by ce_weights alone), skipped as prime-rl's mismatch_kl skips them",
    "slime": "remove_sample=True or no loss-masked token: slime trains on none of their tokens",
    "slime-train": "no loss-masked token (slime zeroes a removed sample's loss mask): slime trains on none of them",
}
TEMPERATURE_UNRECORDED = {  # shape → why its log-probs are read as temperature 1
    "prime-rl": "prime-rl's token export does not record the sampling temperature (its orchestrator's "
                "sampling.temperature): its log-probs are read as temperature-1 sampling's",
    "slime": "slime's rollout data does not record the sampling temperature (--rollout-temperature): its "
             "log-probs are read as temperature-1 sampling's",
    "slime-train": "slime's train data does not record the sampling temperature (--rollout-temperature): its "
                   "rollout_log_probs are read as temperature-1 sampling's",
}


def temperature_notes(source: str, shapes: tuple[str, ...]) -> list[str]:
    """The notes of a dump without a recorded temperature whose shapes cannot record one: against a model (at
    temperature 1) their log-probs are read as temperature 1's. Their trainers log their own log-probs at the
    sampling temperature (prime-rl and slime divide the logits by it), so scored from those the notes do not apply."""
    return [f"{source}: {TEMPERATURE_UNRECORDED[s]}" for s in shapes if s in TEMPERATURE_UNRECORDED]


def parse_record(rec: Any, where: str, tokenizer=None, _ids_of: dict | None = None) -> tuple[str, list[DumpRecord]]:
    """The shape of one decoded record and its sequences (a vLLM or OpenAI record may hold several)."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    for shape, (matches, reader) in SHAPES.items():
        if matches(rec):
            w = f"{where}, {shape}"
            try:
                return shape, (_openai(rec, w, tokenizer, _ids_of) if shape == "openai" else reader(rec, w, tokenizer))
            except InputError:
                raise
            except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:  # a field missing,
                # of the wrong kind, or a number out of range
                raise InputError(f"{w}: malformed record ({type(exc).__name__}: {exc})") from None
    raise InputError(f"{where}: not a rollout record (keys {sorted(rec)[:6]}); expected the mismatch schema, a "
                     "vLLM, SGLang or OpenAI-compatible output, a prime-rl token export or slime debug data")


def _json_records(path: Path) -> list[tuple[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); a dump is JSONL, JSON or .parquet") from None
    if path.suffix == ".json" or text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        data = data if isinstance(data, list) else [data]
        return [(f"record {i}", rec) for i, rec in enumerate(data)]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((f"record {len(out)} (line {n})", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
    return out


def _torch_refusal(exc: Exception) -> str:
    """What `torch.load(weights_only=True)` refused, in whole words: the object it would not unpickle (its
    message's `Unsupported global: GLOBAL name` clause), else its first sentence. Never torch's advice to load
    with `weights_only=False`, which runs the file's code."""
    text = " ".join(str(exc).split())
    found = re.search(r"Unsupported (global: GLOBAL \S+|operand \S+)", text)
    if found:
        return f"{type(exc).__name__}: {found.group(0)}"
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _torch_records(path: Path) -> list[tuple[str, Any]]:
    """The samples of a slime debug file, loaded with `weights_only=True` (containers, numbers, strings and
    tensors only: no code runs; tensors as lists): rollout data (`torch.save` of `{"rollout_id", "samples"}`)
    or train data (`{"format_version": 2, "rollout_id", "rank", "samples", "dp_shards"}`, samples sorted into
    rollout order: `slime/observability/train_data_utils.py` `_build_dump_payload`)."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, … for what it will not load safely
        raise InputError(f"{path}: not a torch file holding only containers and tensors ({_torch_refusal(exc)})"
                         ) from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise InputError(f"{path}: not slime's rollout data (a dict with a `samples` list)")
    version = data.get("format_version")
    if version is not None and version != SLIME_TRAIN_FORMAT:
        raise InputError(f"{path}: slime train data format_version {version!r}; this reads version "
                         f"{SLIME_TRAIN_FORMAT}")

    def plain(value):
        return value.tolist() if isinstance(value, torch.Tensor) else value

    rollout = data.get("rollout_id", "?")
    return [(f"rollout {rollout}, sample {i}", {k: plain(v) for k, v in rec.items()} if isinstance(rec, dict) else rec)
            for i, rec in enumerate(data["samples"])]


def _parquet_records(path: Path) -> tuple[Any, list[tuple[str, Any]]]:
    """(metadata, records) of a parquet dump. Parquet stores `{token_id: logprob}` maps as structs
    with a field for every id of the column, so the ids a position does not list read back as None:
    they are dropped."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
    raw_meta = (table.schema.metadata or {}).get(META_KEY.encode())
    try:
        meta = json.loads(raw_meta) if raw_meta else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError(f"{path}: its {META_KEY} metadata is not JSON") from None
    records = table.to_pylist()
    for rec in records:
        tops = rec.get("top_logprobs")
        if isinstance(tops, list):
            rec["top_logprobs"] = [{k: v for k, v in t.items() if v is not None} if isinstance(t, dict) else t
                                   for t in tops]
    return meta, [(f"record {i} (row {i})", rec) for i, rec in enumerate(records)]


def read_rollouts(path: str | Path, tokenizer=None) -> EngineDump:
    """Read a rollout dump (JSONL, JSON array or parquet; shapes in this module's docstring).

    Args:
        path: the file.
        tokenizer: the model's tokenizer; needed only for OpenAI-compatible records whose tokens are
            strings.

    Returns:
        An `EngineDump` whose records are validated: integer ids, a non-empty prompt and response,
        one finite log-prob ≤ 0 per response token.

    Raises:
        InputError: a missing or unreadable file, or a bad record (one line naming the record).
    """
    path = Path(path)
    files = sorted(path.glob("rank_*.jsonl"), key=lambda f: trailing_number(f.stem)) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise InputError(f"rollouts file not found: {path}" + (" (a directory: prime-rl's step_S/ with rank_R.jsonl "
                                                                "files)" if path.is_dir() else ""))
    if path.is_dir() and not (path / "STABLE").exists():
        raise InputError(f"{path}: no STABLE marker: prime-rl marks a step STABLE once every rank has written it, so "
                         "this one is still being written (or its run stopped first); read a finished step")
    if path.suffix == ".parquet":
        raw_meta, records = _parquet_records(path)
    elif path.suffix in (".pt", ".pth"):
        raw_meta, records = None, _torch_records(path)
    else:
        raw_meta, records = None, []
        for f in files:
            part = _json_records(f)
            records += [(f"{f.name} {where}" if len(files) > 1 else where, rec) for where, rec in part]
        if records and isinstance(records[0][1], dict) and set(records[0][1]) == {"meta"}:
            raw_meta = records.pop(0)[1]["meta"]
    if raw_meta is not None and not isinstance(raw_meta, dict):
        raise InputError(f"{path}: the metadata must be an object of fields, got {str(raw_meta)[:40]!r}")
    meta = dict(raw_meta or {})
    shapes, out, ids_of, truncated, skipped = [], [], {}, {}, {}
    for where, rec in records:
        shape, seqs = parse_record(rec, where, tokenizer, ids_of)
        shapes.append(shape)
        out.extend(seqs)
        if not seqs:
            skipped.setdefault(shape, []).append(where)
        found = _record_truncation(rec)
        if found:
            truncated.setdefault(found, []).append(where)
    notes = []
    for shape, where in skipped.items():
        notes.append(f"{path}: {len(where)} of {len(records)} records ({where[0]}{', …' if len(where) > 1 else ''}) "
                     f"have no token to score: {SKIPPED.get(shape, 'no sequence in them')}")
    if not out:
        raise InputError(f"{path}: no rollout record" + (f" with a token to score ({notes[0]})" if notes else ""))
    in_meta = truncation(meta)
    if in_meta:
        notes.append(f"{path}: its metadata says {in_meta}, {TRUNCATION_BIAS}")
    for found, where in truncated.items():
        notes.append(f"{path}: {len(where)} of {len(records)} records ({where[0]}, …): {found}")
    shapes = tuple(dict.fromkeys(shapes))
    if "prime-rl" in shapes and not path.is_dir() and STEP_DIR.fullmatch(path.parent.name) \
            and not (path.parent / "STABLE").exists():
        notes.append(f"{path}: its step folder has no STABLE marker: prime-rl may still be writing this step (still "
                     "being written, or its run stopped first), so its records may be partial")
    if "temperature" not in meta:
        notes += temperature_notes(str(path), shapes)
    return EngineDump(tuple(out), str(path), shapes, meta, tuple(notes))


def write_rollouts(path: str | Path, records: list[DumpRecord], meta: dict[str, Any] | None = None) -> Path:
    """Write records in the mismatch schema: `.parquet`, else JSONL (a `{"meta": …}` first line).
    The file appears complete or not at all (written to a temporary name, then renamed)."""
    path = Path(path)
    rows = [{"prompt_token_ids": list(r.prompt_ids), "response_token_ids": list(r.response_ids),
             "response_logprobs": list(r.logprobs),
             **({"top_logprobs": [sorted(t.items()) for t in r.top_logprobs]} if r.top_logprobs is not None else {}),
             **({"response_text": r.text} if r.text is not None else {}),
             **({"response_scored": list(r.scored)} if r.scored is not None else {}),
             **({"trainer_logprobs": list(r.trainer_logprobs)} if r.trainer_logprobs is not None else {})}
            for r in records]
    if path.suffix == ".parquet":
        keys = list(dict.fromkeys(k for r in rows for k in r))  # every row's fields, inferred over all rows
        table = pa.Table.from_pydict({k: [r.get(k) for r in rows] for k in keys})
        return atomic_write(path, lambda tmp: pq.write_table(
            table.replace_schema_metadata({META_KEY: json.dumps(meta or {})}), tmp))
    lines = ([json.dumps({"meta": meta})] if meta else []) + [json.dumps(r) for r in rows]
    return atomic_write_text(path, "\n".join(lines) + "\n")
