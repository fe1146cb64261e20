"""Mixture-of-experts: scopes find the fused experts and routers, every torch-native format rounds each
expert as its own linear layer (checked against slow per-expert loops), restore is bitwise, and the
backends that cannot quantize 3-D experts refuse by name."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig, Llama4ForCausalLM, Llama4TextConfig

import mismatch
from mismatch.errors import InputError
from mismatch.perturb import perturb_, perturbed
from mismatch.perturb.scope import select
from tests.conftest import MOE_FAMILIES, random_ids, slow_fp8_round, slow_int_round
from tests.perturb.test_apply import _assert_restored, _state

ATTN = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
NATIVE = ["fp8-e4m3:tensor", "fp8-e4m3:channel", "fp8-e4m3:block128", "fp8-e5m2:channel", "int8:channel",
          "int4:group32", "int4:group128", "dtype:bf16", "dtype:fp16", "noise:0.05"]
TENSORS = ("gate_up_proj", "down_proj")


def _experts(model, block):
    return model.model.layers[block].mlp.experts


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_scopes_find_experts_and_keep_routers_out_by_default(tiny, family):
    m = tiny(family).model
    block = [*ATTN, "mlp.experts"]
    linear = [f"model.layers.{i}.{n}" for i in range(2) for n in block]
    routers = [f"model.layers.{i}.mlp.gate" for i in range(2)]
    assert select(m, "linear") == linear
    assert select(m, "all") == [*linear, "lm_head"]
    assert select(m, "experts") == [n for n in linear if n.endswith("experts")]
    assert select(m, "mlp") == select(m, "experts")
    assert select(m, "attn") == [n for n in linear if ".self_attn." in n]
    assert select(m, "router") == routers
    assert select(m, "1") == linear[5:]  # the isolation map's scope: block 1's linears and experts, no router
    assert set(select(m, r"layers\.0\.mlp")) == {"model.layers.0.mlp.experts", "model.layers.0.mlp.gate"}  # on request


def test_a_scope_of_a_kind_the_model_lacks_says_so(tiny):
    dense = tiny("tiny-llama").model
    with pytest.raises(InputError, match="'experts' selects no MoE experts module: LlamaForCausalLM has no MoE"):
        select(dense, "experts")
    with pytest.raises(InputError, match="'router' selects no MoE router: LlamaForCausalLM has no MoE router"):
        select(dense, "router")


@pytest.mark.parametrize("spec", NATIVE)
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_every_expert_tensor_changes_and_restore_is_bitwise(tiny, family, spec):
    lm = mismatch.load(family)  # a private copy: this test perturbs it
    ids = random_ids(2, 12, seed=3)
    before = _state(lm.model)
    routers = [lm.model.model.layers[i].mlp.gate.weight for i in range(2)]
    with torch.no_grad():
        clean = lm.model(ids).logits
        with perturbed(lm.model, spec) as cand:
            for block in range(2):
                experts = _experts(cand, block)
                for name in TENSORS:
                    new, old = getattr(experts, name), before[0][f"model.layers.{block}.mlp.experts.{name}"]
                    assert new.shape == old.shape
                    changed = [not torch.equal(new[e].float(), old[e]) for e in range(experts.num_experts)]
                    assert all(changed), (block, name, changed)
                assert cand.model.layers[block].mlp.gate.weight is routers[block]  # the router stays as it was
            pert = cand(ids).logits
    assert torch.isfinite(pert).all() and not torch.equal(pert, clean)
    _assert_restored(lm.model, before)
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, clean)


SLOW = {"int8:channel": lambda w: slow_int_round(w, 8, None), "int4:group32": lambda w: slow_int_round(w, 4, 32),
        "int4:group128": lambda w: slow_int_round(w, 4, 128),  # down_proj's 160 columns: a group of 128, one of 32
        "fp8-e4m3:tensor": lambda w: slow_fp8_round(w, "e4m3", "tensor"),
        "fp8-e4m3:channel": lambda w: slow_fp8_round(w, "e4m3", "channel"),
        "fp8-e5m2:channel": lambda w: slow_fp8_round(w, "e5m2", "channel"),
        "fp8-e4m3:block128": lambda w: slow_fp8_round(w, "e4m3", "block128")}  # 320×64 and 64×160: edge tiles


@pytest.mark.parametrize("spec", list(SLOW))
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_per_expert_rounding_equals_a_slow_per_expert_loop(tiny, family, spec):
    """Qwen3-MoE and Mixtral store expert e as `[out, in]` (`F.linear(x, gate_up_proj[e])` in their
    modeling files): each expert's matrix is rounded alone. The same fp32 operations run per element in
    the same order, so the results are equal bit for bit."""
    model, clean = mismatch.load(family).model, tiny(family).model  # perturb a private copy, read the shared one
    with perturbed(model, spec, layers="experts") as cand:
        for block in range(2):
            for name in TENSORS:
                w_EOI = getattr(_experts(clean, block), name).detach()
                expected = torch.stack([SLOW[spec](w_EOI[e]) for e in range(w_EOI.shape[0])])
                assert torch.equal(getattr(_experts(cand, block), name), expected), (block, name)


def test_noise_scales_each_expert_by_its_own_rms():
    """noise: W_e ← W_e + σ·rms(W_e)·ε. Over n ≥ 10,240 entries per expert matrix, rms(ε) has relative
    standard error 1/√(2n) ≤ 0.7%, so rms(ΔW_e)/rms(W_e) lies within σ·(1 ± 0.05) (7 standard errors);
    a scale shared by the stack (one expert 100x larger) would make the others' change ~35x too large."""
    clean = mismatch.load("tiny-qwen3-moe").model
    model = mismatch.load("tiny-qwen3-moe").model
    with torch.no_grad():
        _experts(model, 0).down_proj[3] *= 100.0  # one expert 100x larger: a per-tensor rms would swamp the others
        _experts(clean, 0).down_proj[3] *= 100.0
    with perturbed(model, "noise:0.1", layers="experts") as cand:
        for name in TENSORS:
            new, old = getattr(_experts(cand, 0), name), getattr(_experts(clean, 0), name).detach()
            for e in range(old.shape[0]):
                ratio = float((new[e] - old[e]).pow(2).mean().sqrt() / old[e].pow(2).mean().sqrt())
                assert abs(ratio / 0.1 - 1) < 0.05, (name, e, ratio)


def _tiny_gpt_oss():
    """A tiny random-init GPT-OSS: experts stored transposed, `gate_up_proj` `[E, D, 2I]`, `down_proj`
    `[E, I, D]`, with biases; the router is `mlp.router`."""
    config = GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          max_position_embeddings=128, initializer_range=0.2, vocab_size=259,
                          tie_word_embeddings=False, layer_types=["sliding_attention", "full_attention"],
                          sliding_window=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def test_transposed_experts_round_per_output_channel_of_each_expert():
    """GPT-OSS computes `x @ gate_up_proj[e]`: expert e is `[in, out]`, so its output channels are the
    stored matrix's columns; rounding the transpose with the slow loop gives the same bits."""
    model, clean = _tiny_gpt_oss(), _tiny_gpt_oss()
    assert select(model, "router") == ["model.layers.0.mlp.router", "model.layers.1.mlp.router"]
    before = _state(model)
    for spec in ("int4:group32", "fp8-e4m3:block128"):
        with perturbed(model, spec, layers="experts") as cand:
            for name in TENSORS:
                w_EIO = getattr(clean.model.layers[1].mlp.experts, name).detach()
                expected = torch.stack([SLOW[spec](w_EIO[e].t()).t() for e in range(w_EIO.shape[0])])
                assert torch.equal(getattr(cand.model.layers[1].mlp.experts, name), expected), (spec, name)
    with perturbed(model, "dtype:bf16", layers="linear") as cand:  # biases cast with their experts
        assert cand.model.layers[0].mlp.experts.down_proj_bias.dtype == torch.bfloat16
        with torch.no_grad():
            assert torch.isfinite(cand(random_ids(1, 10)).logits).all()
    _assert_restored(model, before)


def test_the_router_scope_quantizes_the_routers_only(tiny):
    lm = mismatch.load("tiny-mixtral")
    before = _state(lm.model)
    with perturbed(lm.model, "int4:group32", layers="router") as cand:
        w = before[0]["model.layers.0.mlp.gate.weight"]
        assert torch.equal(cand.model.layers[0].mlp.gate.weight, slow_int_round(w, 4, 32))
        state = cand.state_dict()
        assert all(torch.equal(state[k], v) for k, v in before[0].items() if ".mlp.gate." not in k)
    with perturbed(lm.model, "dtype:bf16", layers="router") as cand:  # a router returns a tuple: cast back
        with torch.no_grad():
            assert torch.isfinite(cand(random_ids(1, 10)).logits).all()
    _assert_restored(lm.model, before)


@pytest.mark.parametrize("spec,layers,tensor", [
    ("bnb-int8", "linear", r"model\.layers\.0\.mlp\.experts\.gate_up_proj \[8, 320, 64\]"),
    ("bnb-nf4", "experts", r"model\.layers\.0\.mlp\.experts\.gate_up_proj"),
    ("quanto-int8", "linear", r"model\.layers\.0\.mlp\.experts\.gate_up_proj \[8, 320, 64\]"),
    ("quanto-fp8", "router", r"model\.layers\.0\.mlp\.gate\.weight \[8, 64\]"),
])
def test_backends_refuse_experts_and_routers_by_name(spec, layers, tensor):
    lm = mismatch.load("tiny-qwen3-moe")
    before = _state(lm.model)
    with pytest.raises(InputError, match=f"{spec} quantizes nn.Linear layers only, not {tensor}") as err:
        perturb_(lm.model, spec, layers=layers)
    assert "\n" not in str(err.value)
    _assert_restored(lm.model, before)
    assert not mismatch.perturb.is_perturbed(lm.model)


def test_backends_run_on_the_attention_of_an_moe_model():
    lm = mismatch.load("tiny-qwen3-moe")
    ids = random_ids(1, 10)
    with torch.no_grad(), perturbed(lm.model, "quanto-int8", layers="attn") as cand:
        assert torch.isfinite(cand(ids).logits).all()


def test_w8a8_refuses_fused_experts_and_runs_on_attention(tiny):
    lm = mismatch.load("tiny-mixtral")
    before = _state(lm.model)
    with pytest.raises(InputError, match=r"cannot round activations inside the fused experts model\.layers\.0"):
        perturb_(lm.model, "fp8-e4m3:channel,w8a8")
    _assert_restored(lm.model, before)
    with torch.no_grad(), perturbed(lm.model, "fp8-e4m3:channel,w8a8", layers="attn") as cand:
        assert torch.isfinite(cand(random_ids(1, 10)).logits).all()
    _assert_restored(lm.model, before)


def test_experts_of_unrecorded_layout_are_refused_by_name_not_skipped():
    """Llama-4's experts hold 3-D tensors outside transformers' shared experts interface (no `is_transposed`):
    a scope holding them is refused naming the tensor; attention alone still runs, and the probe reports
    hidden-state metrics without a router row for it."""
    config = Llama4TextConfig(hidden_size=64, intermediate_size=96, intermediate_size_mlp=128, num_local_experts=4,
                              num_experts_per_tok=1, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, vocab_size=259, max_position_embeddings=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Llama4ForCausalLM(config).eval()
    with pytest.raises(InputError, match=r"cannot perturb model\.layers\.0\.feed_forward\.experts\.gate_up_proj "
                                         r"\[4, 64, 192\]: Llama4TextExperts does not record"):
        select(model, "linear")
    assert all(".self_attn." in n for n in select(model, "attn"))
    ids = random_ids(1, 8)
    ref = mismatch.reference(model, ids)
    with perturbed(model, "int8:channel", layers="attn") as cand:
        rows = mismatch.probe(ref, cand).per_layer
    assert rows["router_topk_agree"].isna().all() and rows["rel_l2"].iloc[1] > 0
