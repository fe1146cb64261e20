"""Resolve a model spec to a Hugging Face causal LM and its tokenizer, offline.

Specs (see `list_models()`):
  * a built-in (`mismatch.model.catalog.BUILTIN_MODELS`): `smollm2-135m`, the real pretrained
    SmolLM2-135M-Instruct weights (`mismatch.model.smollm2`), and `tiny-llama`, `tiny-qwen3`, `tiny-gpt2`,
    `tiny-qwen3-moe`, `tiny-mixtral`, tiny random-init models for tests (`mismatch.model.tiny`);
  * a local directory holding a Hugging Face checkpoint (`config.json`, weights, tokenizer);
  * a hub id (`org/name`) resolved from the local Hugging Face cache only.

Nothing here touches the network: every load asks transformers for local files only
(`local_files_only=True`; no environment variable is set), and a spec that is not available locally raises `ModelNotAvailableError` naming what is missing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError
from transformers.utils import logging as hf_logging
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from mismatch.model.catalog import builtin_loader, list_models, locate, unknown_model  # noqa: F401  (list_models: re-exported)
from mismatch.errors import InputError, ModelNotAvailableError, of_type
from mismatch.model.device import is_balanced, resolve_device, spread
from mismatch.files import read_json
from mismatch.registry import Registry

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


@dataclass(frozen=True)
class LM:
    """A causal LM with its tokenizer and the spec it was loaded from (`name`, as the caller gave it:
    `PAIR:student` too), and `source`: the built-in name, checkpoint directory or hub id its weights were
    read from (None: built in memory)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source: str | None = None


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map `"fp32" | "bf16" | "fp16"` (or a `torch.dtype`) to a floating `torch.dtype`."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise InputError(f"dtype must be a floating dtype, got {dtype}")
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise InputError(f"unknown dtype {dtype!r}; valid: fp32, bf16, fp16") from None




def context_length(model: PreTrainedModel) -> int | None:
    """Largest number of positions the model was configured for, or None if it has no limit."""
    cfg = model.config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None










# ---------------------------------------------------------------- local checkpoints


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")


def _load_local(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not (path / "config.json").is_file():
        raise ModelNotAvailableError(f"{path} is not a Hugging Face checkpoint: no config.json in it")
    if not isinstance(read_json(path / "config.json", "checkpoint config"), dict):
        raise InputError(f"{path / 'config.json'} is not a JSON object (a model config)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotAvailableError(f"cannot load the model in {path}: {str(exc).strip().splitlines()[0]}") from None
    except SafetensorError as exc:  # a truncated or corrupt weights file (a copy cut short, a full disk)
        raise ModelNotAvailableError(f"cannot load the model in {path}: a weights file is truncated or corrupt "
                                     f"(safetensors: {str(exc).strip().splitlines()[0]})") from None
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelNotAvailableError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): copy the "
                                     "tokenizer's files beside the weights")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelNotAvailableError(f"{path} has no loadable tokenizer ({str(exc).strip().splitlines()[0]})") from None
    if len(tokenizer) == 0:  # transformers builds an empty tokenizer when no tokenizer file is there
        raise ModelNotAvailableError(f"{path} has no tokenizer (no tokenizer.json, tokenizer.model or vocabulary "
                                     "files): copy the tokenizer's files beside the weights")
    return model, tokenizer


def _load_hub_cache(repo_id: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    found = try_to_load_from_cache(repo_id, "config.json")  # present: `locate` checked it
    try:
        return _load_local(Path(found).parent, dtype)
    except OSError as exc:
        raise ModelNotAvailableError(
            f"'{repo_id}' is only partly in the local Hugging Face cache: {str(exc).splitlines()[0]}"
        ) from None


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Inside the block, transformers' progress bars ("Loading weights", "Writing model shards") and
    info logs are off; after it, they are as the caller had them (the caller's settings are theirs)."""
    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity(max(level, hf_logging.ERROR))
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def quiet_transformers() -> None:
    """Turn transformers' progress bars and info logs off for this process (the CLI's own)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


# the kinds of spec (`locate`'s) a higher layer resolves: the pairs register `pair` (`PAIR:student`, `PAIR:teacher`),
# so `load` takes them without this layer knowing any pair
RESOLVERS: Registry[Callable[..., LM]] = Registry("model spec kind", InputError)


def register_resolver(kind: str, resolve: Callable[..., LM]) -> None:
    """Let `load` take the specs `locate` calls `kind`: `resolve(spec, *, dtype, seed, device) -> LM`."""
    RESOLVERS.register(kind, resolve)


def load(spec: str, *, dtype: str | torch.dtype = torch.float32, seed: int = 0,
         device: str | torch.device = "cpu") -> LM:
    """Load a causal LM and its tokenizer from local files only: `mismatch.load`.

    Args:
        spec: a built-in name (`list_models()`), a local checkpoint directory, a hub id present in the
            local Hugging Face cache, or a kind a higher layer registered (`register_resolver`): a pair's model,
            `PAIR:student` / `PAIR:teacher` (`mismatch.pairs.load.load_member`).
        dtype: parameter dtype (`"fp32"` default, `"bf16"`, `"fp16"` or a `torch.dtype`).
        seed: initialisation seed of the tiny random-init models (ignored otherwise).
        device: where the model lives: `"cpu"` (default), `"cuda"`, `"cuda:N"`, `"auto"`, or `"balanced"` (a
            checkpoint larger than one GPU, spread over every CUDA device; `mismatch.model.device.spread`);
            weights are read on the CPU and moved once.

    Returns:
        `LM(model, tokenizer, name)` with the model in eval mode on `device`.

    Raises:
        ModelNotAvailableError: the spec cannot be resolved without the network.
        InputError: an unknown device, or CUDA asked for where none is present.
    """
    of_type(spec, (str, os.PathLike), "a model spec")
    spec = os.fspath(spec)
    if not spec.strip():
        raise InputError("model spec must be a non-empty string")
    where = locate(spec)  # the one resolution rule, and its errors
    if where in RESOLVERS:
        return RESOLVERS[where](spec, dtype=dtype, seed=seed, device=device)
    resolve_device(device)  # before reading any weights: a wrong device fails at once
    with quiet_loading():
        lm = _load(spec, where, parse_dtype(dtype), seed)
    place(lm.model, device)
    return lm


def place(model: PreTrainedModel, device: str | torch.device) -> None:
    """Move a model read on the CPU to `device` (`resolve_device`), or spread it over every CUDA device for
    `"balanced"` (`mismatch.model.device.spread`)."""
    if is_balanced(device):
        spread(model)
    elif (where := resolve_device(device)).type != "cpu":
        model.to(where)


def _load(spec: str, where: str, dtype: torch.dtype, seed: int) -> LM:
    """The model `spec` names, read from where `locate` found it."""
    if where == "builtin":
        model, tokenizer = builtin_loader(spec)(dtype, seed)
    elif where == "directory":
        model, tokenizer = _load_local(Path(spec).expanduser(), dtype)
    elif where == "hub cache":
        model, tokenizer = _load_hub_cache(spec, dtype)
    else:  # PAIR:ROLE of no registered pair, or with no resolver registered (`mismatch.load` registers the pairs')
        raise unknown_model(spec)
    model.eval()
    return LM(model=model, tokenizer=tokenizer, name=spec, source=spec)
