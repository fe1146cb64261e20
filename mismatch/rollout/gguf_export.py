"""Write a `transformers` causal LM to a GGUF file that llama.cpp runs, with the `gguf` package.

Architectures: Llama (SmolLM2, `tiny-llama`), Qwen3 (`tiny-qwen3`, the `reverse-qwen3` pair) and GPT-2
(`tiny-gpt2`, the `sort-gpt2` pair; its Conv1D weights are transposed to llama.cpp's [out, in]). Weight
types: `f32`, `f16`, and llama.cpp's block formats `q8_0`, `q5_0`, `q5_1`, `q4_0`, `q4_1` (blocks of 32
along each row, one scale per block; quantized by the `gguf` package's reference implementation).
Like llama.cpp's own converter and quantizer:

* Llama's q/k projections are permuted from Hugging Face's rotate-half layout to the interleaved
  pairs llama.cpp's `llama` rope expects (Qwen3 uses the NeoX rope there: no permutation);
* norms and other 1-D tensors stay F32; a 2-D weight whose rows are not a multiple of the block
  size falls back to F16 (`gguf_types` says which type every tensor got);
* a tied output head is not written (llama.cpp then uses the token embedding).

The tokenizer goes in as a byte-level BPE (`gpt2`) vocabulary with its merges, or, for a tokenizer
without merges (the byte tokenizer of the tiny models and pairs), as llama.cpp's vocabulary-less
`none` model: llama.cpp never tokenizes here (`mismatch` passes token ids).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from mismatch.errors import InputError
from mismatch.files import atomic_write
from mismatch.model.loader import LM
from mismatch.rollout.spec import GGUF_WEIGHTS

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "GPT2LMHeadModel": "gpt2"}
GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # stored [in, out]: transposed for GGUF
WEIGHT_TYPES = tuple(w for w in GGUF_WEIGHTS if w != "gguf")  # f32, f16 and llama.cpp's block formats
BLOCK = 32  # values per block of every llama.cpp block format above


def _permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face Llama q/k rows (each head: first halves, then second halves of the rotary
    pairs) → llama.cpp's interleaved pairs, as llama.cpp's `convert_hf_to_gguf.py` permutes them."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise InputError(f"GGUF export supports plain rope only, not {params.get('rope_type')!r} scaling")
    return float(theta if theta is not None else 10000.0)


def _tokenizer_fields(writer, tokenizer, vocab_size: int) -> None:
    import gguf

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"] if hasattr(tokenizer, "backend_tokenizer") else {}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not merges:  # llama.cpp's BPE needs merges; without any, a vocabulary-less model (ids only)
        writer.add_tokenizer_model("none")
        return
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    special = set(tokenizer.all_special_ids)
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for add, token_id in ((writer.add_bos_token_id, tokenizer.bos_token_id), (writer.add_eos_token_id, tokenizer.eos_token_id),
                          (writer.add_pad_token_id, tokenizer.pad_token_id)):
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(False)  # mismatch passes whole token sequences, BOS included where the model uses one


def _hparams(writer, cfg, arch: str, name: str) -> None:
    writer.add_name(name)
    if arch == "gpt2":
        if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise InputError(f"GGUF export of GPT-2 needs the tanh GELU llama.cpp runs, not {cfg.activation_function}")
        writer.add_context_length(int(cfg.n_positions))
        writer.add_embedding_length(int(cfg.n_embd))
        writer.add_block_count(int(cfg.n_layer))
        writer.add_feed_forward_length(int(cfg.n_inner or 4 * cfg.n_embd))
        writer.add_head_count(int(cfg.n_head))
        writer.add_layer_norm_eps(float(cfg.layer_norm_epsilon))
        writer.add_vocab_size(int(cfg.vocab_size))
        return
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_context_length(int(cfg.max_position_embeddings))
    writer.add_embedding_length(int(cfg.hidden_size))
    writer.add_block_count(int(cfg.num_hidden_layers))
    writer.add_feed_forward_length(int(cfg.intermediate_size))
    writer.add_head_count(int(cfg.num_attention_heads))
    writer.add_head_count_kv(int(cfg.num_key_value_heads))
    writer.add_rope_freq_base(_rope_theta(cfg))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_rope_dimension_count(int(head_dim))
    writer.add_key_length(int(head_dim))
    writer.add_value_length(int(head_dim))
    writer.add_vocab_size(int(cfg.vocab_size))
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise InputError(f"GGUF export of {arch} with biases is not supported")


def _gguf_tensor(arch: str, cfg, hf_name: str, tensor: torch.Tensor) -> np.ndarray:
    """The fp32 array llama.cpp expects for a Hugging Face parameter (transposed, permuted)."""
    data = tensor.detach().to(torch.float32).numpy()
    base = hf_name.rsplit(".", 1)[0]
    if arch == "llama" and base.endswith(("q_proj", "k_proj")):
        data = _permute_rope(data, cfg.num_attention_heads if base.endswith("q_proj") else cfg.num_key_value_heads)
    if arch == "gpt2" and base.endswith(GPT2_CONV1D) and data.ndim == 2:
        data = data.T
    return np.ascontiguousarray(data)


def write_gguf(lm: LM, path: str | Path, weights: str = "f32") -> dict[str, str]:
    """Write `lm` to a GGUF file llama.cpp can run.

    Args:
        lm: a Llama- or Qwen3-architecture `LM` (its current weights, whatever they are).
        path: the file to write (complete or absent: written to a temporary name, then renamed).
        weights: the 2-D weights' type, one of `WEIGHT_TYPES`.

    Returns:
        `{gguf tensor name: type written}`.

    Raises:
        InputError: another architecture, rope scaling, biases, or an unknown weight type.
    """
    import gguf

    model = lm.model
    arch = ARCHITECTURES.get(type(model).__name__)
    if arch is None:
        raise InputError(f"GGUF export supports {', '.join(ARCHITECTURES)}; {lm.name} is {type(model).__name__}")
    if weights not in WEIGHT_TYPES:
        raise InputError(f"unknown GGUF weight type {weights!r}; one of {', '.join(WEIGHT_TYPES)}")
    written: dict[str, str] = {}
    atomic_write(path, lambda tmp: _write(gguf, lm, arch, weights, str(tmp), written))
    return written


def _write(gguf, lm: LM, arch: str, weights: str, path: str, written: dict[str, str]) -> None:
    """Write the GGUF file `path` of `lm`, recording each tensor's type in `written`."""
    model, cfg = lm.model, lm.model.config
    writer = gguf.GGUFWriter(path, arch)
    _hparams(writer, cfg, arch, lm.name)
    _tokenizer_fields(writer, lm.tokenizer, int(cfg.vocab_size))
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), int(cfg.num_hidden_layers))
    qtype = getattr(gguf.GGMLQuantizationType, weights.upper())
    for hf_name, tensor in model.named_parameters():  # a tied head is the embedding, listed once: not written
        base, suffix = hf_name.rsplit(".", 1)
        mapped = names.get_name(base)
        if mapped is None:
            raise InputError(f"GGUF export: no llama.cpp name for {hf_name}")
        data = _gguf_tensor(arch, cfg, hf_name, tensor)
        out_type = gguf.GGMLQuantizationType.F32
        if data.ndim == 2 and weights != "f32":
            out_type = qtype if weights == "f16" or data.shape[1] % BLOCK == 0 else gguf.GGMLQuantizationType.F16
        if out_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(f"{mapped}.{suffix}", data)
        else:
            writer.add_tensor(f"{mapped}.{suffix}", gguf.quants.quantize(data, out_type), raw_dtype=out_type)
        written[f"{mapped}.{suffix}"] = out_type.name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
