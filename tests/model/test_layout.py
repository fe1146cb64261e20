"""Layout: the modules of three families, hooks that leave nothing behind, the one head-input
capture, the head map and the one chunked log-softmax, each against the model's own outputs."""

import pytest
import torch

import mismatch
from mismatch.errors import InputError
from mismatch.model.head import Head, head_inputs, is_identity_warp, logprob_chunks, token_chunks, warp
from mismatch.model.layout import capture, model_layout, replay_prefix
from mismatch.model.positions import position_ids, response_index, scorable
from tests.conftest import FAMILIES, random_ids

BLOCKS = {"tiny-llama": ("model.layers", "model.norm"), "tiny-qwen3": ("model.layers", "model.norm"),
          "tiny-gpt2": ("transformer.h", "transformer.ln_f")}


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_finds_the_families_modules(tiny, family):
    model = tiny(family).model
    layout = model_layout(model)
    modules = dict(model.named_modules())
    blocks, norm = BLOCKS[family]
    assert layout.layers is modules[blocks] and layout.final_norm is modules[norm]
    assert layout.head is model.get_output_embeddings() and layout.embed is model.get_input_embeddings()
    n = model.config.num_hidden_layers
    assert layout.layer_names == ["embed", *(f"layers.{i}" for i in range(n)), "final_norm"]
    assert layout.modules() == [layout.embed, *layout.layers, layout.final_norm]


def test_layout_rejects_a_model_without_a_head():
    with pytest.raises(InputError, match="not a causal LM"):
        model_layout(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3"])
def test_head_inputs_and_layer_rows_equal_the_models_hidden_states(family):
    model = mismatch.load(family).model  # its own copy: output_hidden_states installs hooks for good
    ids = random_ids(2, 9)
    attn = torch.ones_like(ids)
    attn[1, :3] = 0  # left padding
    index = response_index(scorable(attn))
    seen = {}
    with torch.no_grad():
        got = head_inputs(model, ids, attn, index, on_layer=lambda i, h: seen.__setitem__(i, h))
        full = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn), output_hidden_states=True)
    B, T = ids.shape
    flat = [h.reshape(B * T, -1)[index] for h in full.hidden_states]
    n = model.config.num_hidden_layers
    assert torch.equal(got.rows_ND, flat[-1])  # the head's input is the final norm's output
    assert torch.equal(seen[0], flat[0]) and torch.equal(seen[n + 1], flat[-1])
    for i in range(1, n):  # transformers returns block outputs 0..L-2, then the normed last one
        assert torch.equal(seen[i], flat[i]), i
    # the head ran on one row per sequence: equal to fp32 rounding (BLAS sums in another order)
    torch.testing.assert_close(got.last_logits_BV, full.logits[:, -1, :].float(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(Head.of(model).logits(got.last_BD), got.last_logits_BV, atol=1e-5)


def test_capture_removes_its_hooks_even_when_the_pass_raises(tiny):
    model = tiny("tiny-llama").model
    layout = model_layout(model)
    count = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())  # noqa: E731
    before = count()
    with pytest.raises(RuntimeError, match="boom"):
        with capture(layout, lambda i, h: None, lambda h: None):
            assert count() == before + len(layout.modules()) + 1
            raise RuntimeError("boom")
    assert count() == before


def test_head_inputs_rejects_a_head_fed_another_shape(tiny):
    model = tiny("tiny-llama").model
    handle = model_layout(model).head.register_forward_pre_hook(lambda m, a: (a[0][:, :1],))
    try:
        with pytest.raises(InputError, match="feeds its head"):
            head_inputs(model, random_ids(1, 4), torch.ones(1, 4, dtype=torch.long), torch.tensor([0]))
    finally:
        handle.remove()


def test_replay_prefix_swaps_blocks_back(tiny):
    model = tiny("tiny-llama").model
    layout = model_layout(model)
    originals = list(layout.layers)
    ids = random_ids(1, 5)
    with torch.no_grad():
        outs = []
        handles = [b.register_forward_hook(lambda m, a, o: outs.append(o if isinstance(o, torch.Tensor) else o[0]))
                   for b in layout.layers]
        ref = model(input_ids=ids).logits
        for h in handles:
            h.remove()
        calls = []
        pre = [b.register_forward_pre_hook(lambda m, a, i=i: calls.append(i)) for i, b in enumerate(layout.layers)]
        with replay_prefix(layout, outs, 2, as_tuple=False):
            replayed = model(input_ids=ids).logits
        for h in pre:
            h.remove()
    assert torch.equal(ref, replayed) and calls == [2]  # blocks 0 and 1 did not run
    assert list(layout.layers) == originals


def test_head_post_processing_and_private_copy(tiny):
    model = tiny("tiny-llama").model
    h = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    plain = h @ model.lm_head.weight.T
    live, copy = Head.of(model), Head.of(model, copy=True)
    assert torch.equal(live.logits(h), plain) and torch.equal(copy.logits(h), plain)
    assert copy.weight is not model.lm_head.weight and copy.module is None
    scaled = Head(model.lm_head.weight, None, None, plain.shape[1], softcap=5.0, scale=2.0)
    assert torch.allclose(scaled.logits(h), torch.tanh(2.0 * plain / 5.0) * 5.0)


@pytest.mark.parametrize("chunk,rows_per_pass", [(1, None), (3, None), (4, 2), (1000, 3)])
def test_logprob_chunks_cover_every_row_once_and_equal_log_softmax(tiny, chunk, rows_per_pass):
    model = tiny("tiny-gpt2").model
    h = torch.randn(10, model.config.n_embd, generator=torch.Generator().manual_seed(1))
    full = torch.log_softmax(h @ model.lm_head.weight.T, dim=-1)
    pieces = list(logprob_chunks(Head.of(model), h, chunk, rows_per_pass=rows_per_pass))
    assert [r.start for r, _ in pieces] == sorted(r.start for r, _ in pieces)
    assert sum(r.stop - r.start for r, _ in pieces) == 10
    assert max(r.stop - r.start for r, _ in pieces) <= min(chunk, rows_per_pass or chunk)
    torch.testing.assert_close(torch.cat([lp for _, lp in pieces]), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk,rows_per_pass", [(3, None), (4, 2), (1000, 3)])
def test_logprob_chunks_reuse_one_buffer_and_give_the_same_bits(tiny, chunk, rows_per_pass):
    model = tiny("tiny-gpt2").model
    h = torch.randn(10, model.config.n_embd, generator=torch.Generator().manual_seed(1))
    fresh = [(r, lp.clone()) for r, lp in logprob_chunks(Head.of(model), h, chunk, rows_per_pass=rows_per_pass)]
    reused, pointers = [], set()
    for r, lp in logprob_chunks(Head.of(model), h, chunk, rows_per_pass=rows_per_pass, reuse=True):
        pointers.add(lp.data_ptr())
        reused.append((r, lp.clone()))  # consumed before the next piece overwrites it
    assert len(pointers) == 1 and len(reused) == len(fresh) > 1
    for (r0, a), (r1, b) in zip(fresh, reused):
        assert r0 == r1 and torch.equal(a, b)


def test_warp_temperature_and_top_p():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert is_identity_warp(1.0, None) and is_identity_warp(0.0, 1.0) and not is_identity_warp(0.7, None)
    assert warp(z) is z
    assert torch.equal(warp(z, 0.5), z / 0.5)
    p = torch.softmax(z, -1)[0]  # 0.64, 0.24, 0.09, 0.03: top-p 0.8 keeps the first two
    kept = torch.isfinite(warp(z, 1.0, 0.8))[0].tolist()
    assert kept == [True, True, False, False] and float(p[:1].sum()) < 0.8 <= float(p[:2].sum())
    assert [(s.start, s.stop) for s in token_chunks(7, 3)] == [(0, 3), (3, 6), (6, 7)]


def test_positions_rules():
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert scorable(attn).tolist() == [[False, False, False, True, True], [False, True, True, False, False]]
    assert position_ids(attn).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    assert response_index(scorable(attn)).tolist() == [2, 3, 5, 6]


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_dropping_blocks_gives_the_model_built_without_them(spec):
    """A model with block 1 dropped computes what a model built with one block fewer computes from the kept
    weights (an independent construction: a fresh config, the state dict renamed), with and without the KV
    cache — the renumbered `layer_idx` is what keeps generation's cache right."""
    import copy

    from transformers import AutoModelForCausalLM

    from mismatch.model.layout import drop_layers

    lm = mismatch.load(spec)
    pruned = drop_layers(copy.deepcopy(lm.model), (1,))
    config = copy.deepcopy(lm.model.config)
    config.num_hidden_layers -= 1
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:1] + config.layer_types[2:]
    fresh = AutoModelForCausalLM.from_config(config).eval()
    prefix = model_layout(lm.model).layers
    rename = {}
    for name, tensor in lm.model.state_dict().items():
        parts = name.split(".")
        idx = next((i for i, p in enumerate(parts[:-1]) if p.isdigit() and ".".join(parts[:i]).endswith(("layers", "h"))), None)
        if idx is None:
            rename[name] = tensor
        elif int(parts[idx]) != 1:
            parts[idx] = str(int(parts[idx]) - (int(parts[idx]) > 1))
            rename[".".join(parts)] = tensor
    fresh.load_state_dict(rename, strict=True)
    assert len(prefix) == len(model_layout(pruned).layers) + 1 and pruned.config.num_hidden_layers == len(prefix) - 1
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        assert torch.equal(pruned(ids).logits, fresh(ids).logits)
        out = pruned.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        want = fresh.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(out, want)
    with pytest.raises(InputError, match="cannot drop"):
        drop_layers(copy.deepcopy(lm.model), (len(prefix),))
