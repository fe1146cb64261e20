"""Tiny random-init real `transformers` models with a 259-token byte-level tokenizer, deterministic from `seed`,
for tests: Llama, Qwen3, GPT-2 and the mixture-of-experts Qwen3-MoE and Mixtral."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MixtralConfig, Qwen3Config, Qwen3MoeConfig

from mismatch.model.device import seeded
from mismatch.model.tokenizer import byte_tokenizer

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


def tiny_loader(family: str) -> Callable[[torch.dtype, int], tuple]:
    """The loader of the tiny random-init model of `family`: `(dtype, seed) -> (model, tokenizer)`."""
    def load_tiny(dtype: torch.dtype, seed: int):
        config = _tiny_config(family)
        with seeded(seed, torch.device("cpu")):  # deterministic init, global RNG untouched
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        return model.to(dtype), byte_tokenizer()

    return load_tiny


load_llama, load_qwen3, load_gpt2 = tiny_loader("llama"), tiny_loader("qwen3"), tiny_loader("gpt2")
load_qwen3_moe, load_mixtral = tiny_loader("qwen3-moe"), tiny_loader("mixtral")
