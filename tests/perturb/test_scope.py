"""Layer scopes select exactly the intended modules, on two architecture families."""

import pytest

from mismatch.errors import InputError
from mismatch.perturb.scope import select

LLAMA_BLOCK = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
GPT2_BLOCK = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


def _expected(prefix, block, layers):
    return [f"{prefix}.{i}.{name}" for i in layers for name in block]


@pytest.mark.parametrize("spec,prefix,block,n,head", [
    ("tiny-llama", "model.layers", LLAMA_BLOCK, 3, "lm_head"),
    ("tiny-gpt2", "transformer.h", GPT2_BLOCK, 2, "lm_head"),
])
def test_scopes(tiny, spec, prefix, block, n, head):
    m = tiny(spec).model
    everything = _expected(prefix, block, range(n))
    assert select(m, "linear") == everything
    assert select(m, "all") == [*everything, head]
    assert select(m, "lm_head") == [head]
    assert select(m, "attn") == [x for x in everything if ".attn." in x or ".self_attn." in x]
    assert select(m, "mlp") == [x for x in everything if ".mlp." in x]
    assert select(m, "1") == _expected(prefix, block, [1])
    assert select(m, "0-1") == _expected(prefix, block, [0, 1])
    assert select(m, r"\.1\..*(c_proj|o_proj)") == [x for x in _expected(prefix, block, [1])
                                                     if x.endswith(("c_proj", "o_proj"))]
    assert set(select(m, "attn")) | set(select(m, "mlp")) == set(everything)


def test_bad_scopes(tiny):
    m = tiny("tiny-llama").model
    with pytest.raises(InputError, match="out of range.*3 decoder blocks"):
        select(m, "0-5")
    with pytest.raises(InputError, match="selects no linear module"):
        select(m, "nothing_matches_this")
    with pytest.raises(InputError, match="unknown layer scope"):
        select(m, "(unclosed")
    with pytest.raises(InputError, match="empty"):
        select(m, " ")
