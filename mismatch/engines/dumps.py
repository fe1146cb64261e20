"""Rollout dumps from inference engines: read, validate and write them.

A dump holds sampled responses with the engine's own log-probability of every response token.
Four record shapes are read, one record per JSONL line (or a JSON array; parquet for ours), the
shape found per record:

* **mismatch** (ours, written by `write_rollouts`): `prompt_token_ids` `[P]`, `response_token_ids`
  `[T]`, `response_logprobs` `[T]` (nats), optional `top_logprobs` (per response position a
  `{token_id: logprob}` map or `[[token_id, logprob], …]`), `response_text`, and `token_ids`
  (the whole sequence, as verl and slime keep it: it must be the prompt followed by the response).
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

* **prime-rl** token export (`trainer.enable_token_export`, schema version 1: one JSON line per
  exported sequence, `token_exports/step_S/rank_R.jsonl`; a step's directory reads every rank's file):
  `token_ids`, `position_ids` (restarting at 0 for each packed sample), `loss_mask`,
  `inference_logprobs` (the engine's), `trainer_logprobs`, `log_importance_ratio`, `mismatch_kl`, …
  per token. Each packed sample is one sequence: its prompt the tokens before its first loss-masked
  token, its response the loss-masked tokens (they must be one contiguous span, ending the sample or
  followed only by unmasked tokens). prime-rl does not export the sampling temperature (its trainer
  scales the logits by it): read as 1, and said so.
* **slime** debug rollout data (`--save-debug-rollout-data PATH`: `torch.save({"rollout_id", "samples":
  [Sample.to_dict(), …]})`, read with `torch.load(weights_only=True)`: containers and tensors only):
  each sample's `tokens` (prompt + response), `response_length`, `rollout_log_probs` (the engine's, one
  per response token) and `loss_mask` (tool tokens 0: a response with masked tokens inside is refused;
  trailing masked tokens are dropped). slime stores no sampling settings, but a top-p < 1 run records
  each token's nucleus (`rollout_top_p_token_ids`): found, it is said.

Log-probs that are not those of the sampling distribution: when the metadata, a record's request
(`sampling_params`, `request`) or slime's recorded nucleus shows top-p < 1, top-k or min-p, the engine's
log-probs are of the renormalized truncated distribution, and `log r` carries `−log S` of each step's kept
mass S (TRL #6789: a kept mass of 0.895 gave an IS ratio mean of 0.896): the dump says so in its `notes`,
which every score of it repeats. The dump is still read: the statistics then include that truncation.

A line `{"meta": {...}}` (parquet: the schema metadata key `mismatch_rollouts`) carries what the
engine knows: `vocab_size`, `vocab_fingerprint` (`mismatch.model.tokenizer.vocab_fingerprint`),
`tokenizer`, `engine`, `temperature`, `top_p`, `top_k`, `min_p`. The log-probs must be those of the
distribution the tokens were sampled from (temperature 1, no top-p/top-k truncation, for an unbiased
mismatch estimate).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mismatch.errors import InputError
from mismatch.files import atomic_write, atomic_write_text, trailing_number

POSITIVE_SLACK = 1e-6  # log-probs up to this above 0 are fp rounding of a near-certain token (read as 0)
META_KEY = "mismatch_rollouts"


@dataclass(frozen=True)
class DumpRecord:
    """One sampled response: token ids, the engine's log-prob of each response token (nats) and,
    where the engine gave them, its top-k log-probs per response position."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[dict[int, float], ...] | None = None
    text: str | None = None  # the response text the engine printed (a tokenizer round-trip check)
    where: str = ""  # "record 3 (line 4, vllm)": named in every error about it


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
        return sum(len(r.response_ids) for r in self.records)


def _int(value: Any, where: str, what: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        raise InputError(f"{where}: {what} {value!r} is not a token id") from None
    if isinstance(value, float) and value != out:
        raise InputError(f"{where}: {what} {value!r} is not a token id")
    return out


def _logprob(value: Any, where: str, at: str) -> float:
    if isinstance(value, dict):
        value = value.get("logprob")
    try:
        lp = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer too large for a float
        raise InputError(f"{where}: log-prob at {at} is {str(value)[:40]}, not a number") from None
    if not math.isfinite(lp) or lp > POSITIVE_SLACK:
        raise InputError(f"{where}: log-prob at {at} is {lp!r}; log-probs must be finite and ≤ 0")
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
            where: str, full: Any = None) -> DumpRecord:
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
    lps = tuple(_logprob(v, where, f"response position {i}") for i, v in enumerate(logprobs))
    tops = None
    if top is not None:
        if len(top) != len(r_ids):
            raise InputError(f"{where}: {len(r_ids)} response tokens but {len(top)} top-k entries")
        # sorted by token id: the sums over them then do not depend on the engine's listing order
        tops = tuple(dict(sorted(_top(t, where, f"response position {i}").items())) for i, t in enumerate(top))
    return DumpRecord(p_ids, r_ids, lps, tops, text, where)


def _ours(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    return [_record(rec.get("prompt_token_ids"), rec.get("response_token_ids"), list(rec.get("response_logprobs") or []),
                    rec.get("top_logprobs"), rec.get("response_text"), where, rec.get("token_ids"))]


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


def _masked_span(mask: list, where: str) -> tuple[int, int] | None:
    """`(first, end)` of the loss-masked positions, which must be contiguous; None when none is masked."""
    on = [i for i, m in enumerate(mask) if m]
    if not on:
        return None
    first, end = on[0], on[-1] + 1
    if len(on) != end - first:
        raise InputError(f"{where}: masked tokens inside the response (a multi-turn or tool sample): only a "
                         "contiguous loss-masked response is read")
    return first, end


def _prime_rl(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    version = rec.get("schema_version")
    if version != PRIME_RL_SCHEMA:
        raise InputError(f"{where}: prime-rl token export schema version {version!r}; this reads version "
                         f"{PRIME_RL_SCHEMA}")
    ids, mask, lps = rec["token_ids"], rec["loss_mask"], rec["inference_logprobs"]
    positions = rec.get("position_ids") or list(range(len(ids)))
    if not len(ids) == len(mask) == len(lps) == len(positions):
        raise InputError(f"{where}: token_ids, loss_mask, inference_logprobs and position_ids differ in length")
    starts = [i for i, p in enumerate(positions) if int(p) == 0] or [0]  # packed samples restart at 0
    if starts[0] != 0:
        starts = [0, *starts]
    out = []
    for k, (lo, hi) in enumerate(zip(starts, [*starts[1:], len(ids)])):
        w = f"{where}, sample {k}"
        span = _masked_span(mask[lo:hi], w)
        if span is None:
            continue  # nothing trained on in this sample (prompt-only packing remainder)
        first, end = lo + span[0], lo + span[1]
        if None in lps[first:end]:
            raise InputError(f"{w}: inference_logprobs has a null (non-finite) value at a loss-masked token")
        out.append(_record(ids[lo:first], ids[first:end], lps[first:end], None, None, w))
    if not out:
        raise InputError(f"{where}: no loss-masked token to score")
    return out


def _slime(rec: dict, where: str, tokenizer) -> list[DumpRecord]:
    tokens, length = list(rec["tokens"]), int(rec["response_length"])
    if not 0 < length < len(tokens):
        raise InputError(f"{where}: response_length {length} of {len(tokens)} tokens (a prompt and a response needed)")
    lps = [float(v) for v in rec["rollout_log_probs"] or []]
    mask = rec.get("loss_mask")
    mask = [1] * length if mask is None else [int(m) for m in mask]
    if len(mask) != length:
        raise InputError(f"{where}: {length} response tokens but {len(mask)} loss_mask entries")
    span = _masked_span(mask, where)
    if span is None or span[0] != 0:
        raise InputError(f"{where}: the response does not start with a loss-masked token")
    end = span[1]
    prompt, response = tokens[:-length], tokens[-length:]
    if len(lps) != length:
        raise InputError(f"{where}: {length} response tokens but {len(lps)} rollout_log_probs")
    return [_record(prompt, response[:end], lps[:end], None, None, where)]


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


def _record_truncation(rec: dict) -> str | None:
    """What a record shows of a truncated sampler: its request's settings, or slime's recorded nucleus."""
    for settings in (rec.get("sampling_params"), (rec.get("request") or {}).get("sampling_params")
                     if isinstance(rec.get("request"), dict) else None, rec.get("request")):
        found = truncation(settings)
        if found:
            return f"its request says {found}"
    nucleus = rec.get("rollout_top_p_token_ids")
    if nucleus is not None and len(nucleus) > 0:
        return "slime recorded each token's top-p nucleus (rollout_top_p_token_ids): top-p < 1"
    return None


SHAPES = {  # shape name → (is it this shape?, reader)
    "mismatch": (lambda r: "response_token_ids" in r, _ours),
    "vllm": (lambda r: isinstance(r.get("outputs"), list), _vllm),
    "sglang": (lambda r: isinstance(r.get("meta_info"), dict) and "output_token_logprobs" in r["meta_info"], _sglang),
    "openai": (lambda r: isinstance(r.get("choices"), list), _openai),
    "prime-rl": (lambda r: "inference_logprobs" in r and "token_ids" in r and "loss_mask" in r, _prime_rl),
    "slime": (lambda r: "rollout_log_probs" in r and "response_length" in r and "tokens" in r, _slime),
}
TEMPERATURE_UNRECORDED = {  # shape → why its log-probs are read as temperature 1
    "prime-rl": "prime-rl's token export does not record the sampling temperature (its orchestrator's "
                "sampling.temperature): its log-probs are read as temperature-1 sampling's",
    "slime": "slime's rollout data does not record the sampling temperature (--rollout-temperature): its "
             "log-probs are read as temperature-1 sampling's",
}


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
    raise InputError(f"{where}: not a rollout record (keys {sorted(rec)[:6]}); expected the mismatch schema or a "
                     "vLLM, SGLang or OpenAI-compatible output")


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


def _torch_records(path: Path) -> list[tuple[str, Any]]:
    """The samples of a slime debug rollout file (`torch.save` of `{"rollout_id", "samples"}`), loaded with
    `weights_only=True`: containers, numbers, strings and tensors only (no code runs); tensors as lists."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, … for what it will not load safely
        raise InputError(f"{path}: not a torch file holding only containers and tensors "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise InputError(f"{path}: not slime's rollout data (a dict with a `samples` list)")

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
    shapes, out, ids_of, truncated = [], [], {}, {}
    for where, rec in records:
        shape, seqs = parse_record(rec, where, tokenizer, ids_of)
        shapes.append(shape)
        out.extend(seqs)
        found = _record_truncation(rec)
        if found:
            truncated.setdefault(found, []).append(where)
    if not out:
        raise InputError(f"{path}: no rollout record")
    notes = []
    in_meta = truncation(meta)
    bias = ("so its log-probs are of the renormalized truncated distribution and log r carries −log S of each "
            "step's kept mass S: the statistics include that truncation, which the calibrated limits (temperature 1, "
            "no truncation) do not")
    if in_meta:
        notes.append(f"{path}: its metadata says {in_meta}, {bias}")
    for found, where in truncated.items():
        notes.append(f"{path}: {len(where)} of {len(records)} records ({where[0]}, …): {found}, {bias}")
    shapes = tuple(dict.fromkeys(shapes))
    if "temperature" not in meta:
        notes += [f"{path}: {TEMPERATURE_UNRECORDED[s]}" for s in shapes if s in TEMPERATURE_UNRECORDED]
    return EngineDump(tuple(out), str(path), shapes, meta, tuple(notes))


def write_rollouts(path: str | Path, records: list[DumpRecord], meta: dict[str, Any] | None = None) -> Path:
    """Write records in the mismatch schema: `.parquet`, else JSONL (a `{"meta": …}` first line).
    The file appears complete or not at all (written to a temporary name, then renamed)."""
    path = Path(path)
    rows = [{"prompt_token_ids": list(r.prompt_ids), "response_token_ids": list(r.response_ids),
             "response_logprobs": list(r.logprobs),
             **({"top_logprobs": [sorted(t.items()) for t in r.top_logprobs]} if r.top_logprobs is not None else {}),
             **({"response_text": r.text} if r.text is not None else {})} for r in records]
    if path.suffix == ".parquet":
        keys = list(dict.fromkeys(k for r in rows for k in r))  # every row's fields, inferred over all rows
        table = pa.Table.from_pydict({k: [r.get(k) for r in rows] for k in keys})
        return atomic_write(path, lambda tmp: pq.write_table(
            table.replace_schema_metadata({META_KEY: json.dumps(meta or {})}), tmp))
    lines = ([json.dumps({"meta": meta})] if meta else []) + [json.dumps(r) for r in rows]
    return atomic_write_text(path, "\n".join(lines) + "\n")
