"""oneDNN-packed linear layers for decoding: same function as the default path within fp32
rounding, checked against an fp64 computation, on a real (random-init) Llama whose matrices are
large enough to be packed; exact restore; weights re-read on every entry."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mismatch.model.packed_linear import MIN_PACKED_ELEMENTS, onednn_available, packable, packed_linears
from mismatch.model.loader import LM
from mismatch.model.generate import generate
from mismatch.model.tokenizer import byte_tokenizer

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear ops")


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def test_packs_exactly_the_large_fp32_linears(llama):
    expected = sum(m.weight.numel() >= MIN_PACKED_ELEMENTS for m in _linears(llama))
    assert 0 < expected < len(_linears(llama))  # k/v projections (256×128) stay unpacked
    with torch.no_grad(), packed_linears(llama, rows=3) as n:
        assert n == expected
        assert sum("forward" in m.__dict__ for m in llama.modules()) == expected
    assert not any("forward" in m.__dict__ for m in llama.modules())  # restored
    with packed_linears(llama) as n:  # autograd on: nothing changes
        assert n == 0
    half = copy.deepcopy(llama.model.layers[0].mlp.up_proj).to(torch.bfloat16)
    assert not packable(half)


def test_logits_within_fp32_rounding_of_an_fp64_computation(llama):
    ids = torch.randint(0, 512, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = copy.deepcopy(llama).double()(ids).logits
        default = llama(ids).logits
        with packed_linears(llama, rows=3):
            packed = llama(ids).logits
    scale = exact.abs().max().item()
    err_default = (default.double() - exact).abs().max().item()
    err_packed = (packed.double() - exact).abs().max().item()
    assert err_packed <= 1e-5 * scale
    assert err_packed <= 8 * err_default + 1e-7 * scale  # the same size of rounding error
    assert not torch.equal(packed, default) or err_default == 0  # it did take another path


def test_greedy_tokens_equal_the_default_path_and_weights_are_reread(llama):
    lm = LM(llama, _tokenizer(), "llama")
    prompts = ["abc", "hello", "x y z"]
    with_pack = generate(lm, prompts, max_new_tokens=12)
    with torch.no_grad():
        ids = with_pack.input_ids
        for row in range(len(prompts)):  # the default path's greedy choice at every response position
            attended = with_pack.attention_mask[row].bool()
            seq = ids[row][attended]  # unpadded prompt + response
            response = with_pack.response_mask[row][attended].bool()
            logits = llama(seq.unsqueeze(0)).logits[0]
            positions = response.nonzero().squeeze(-1)
            assert len(positions) == 12
            assert torch.equal(logits[positions - 1].argmax(-1), seq[positions])
    # the packed copy is taken on entry: changed weights are seen by the next block
    layer = llama.model.layers[1].mlp.down_proj
    saved = layer.weight.detach().clone()
    x = torch.randn(2, 512)
    try:
        with torch.no_grad():
            layer.weight.mul_(-2.0)
            with packed_linears(llama):
                y = layer(x)
            torch.testing.assert_close(y, x @ layer.weight.T, rtol=1e-5, atol=1e-5)
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)


def _tokenizer():
    tokenizer = byte_tokenizer()  # a real fast tokenizer, ids < 512
    tokenizer.eos_token = None  # 12 tokens in every response: no early stop
    return tokenizer
