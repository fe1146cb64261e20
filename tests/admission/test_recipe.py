"""Mixed-precision recipes: a block made fragile on purpose is found, kept, and the verified check passes."""

from mismatch.admission import CalibrationSettings, Pipeline  # noqa: F401
import re

import pytest
import torch

import mismatch
from mismatch.admission import check
from mismatch.admission.recipe import exact_scope, exports, module_groups
from mismatch.perturb import select

PROMPTS = ["the cat sat on", "a b c d e f", "hello there you", "sort 3 1 2 9", "x y z", "one two three"]
FRAGILE = [f"model.layers.1.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "mlp.gate_proj", "mlp.up_proj")]


def _fragile_llama():
    """tiny-llama whose block 1 reads input channel 5 nowhere (its norms zero it) yet stores 1e3 there in
    q/k/v/gate/up: the function is unchanged, but a per-channel absmax scale now rounds every other
    weight of those rows to zero."""
    lm = mismatch.load("tiny-llama", seed=1)
    block = lm.model.model.layers[1]
    with torch.no_grad():
        block.input_layernorm.weight[5] = 0.0
        block.post_attention_layernorm.weight[5] = 0.0
        for name in FRAGILE:
            lm.model.get_submodule(name).weight[:, 5] = 1e3
    return lm


def test_module_groups_keep_fused_shards_together_and_scopes_are_exact():
    lm = mismatch.load("tiny-llama")
    names = select(lm.model, "1")
    groups = module_groups(names)
    assert [len(g) for g in groups] == [3, 1, 2, 1]  # q/k/v, o, gate/up, down
    assert select(lm.model, exact_scope(groups[0])) == groups[0]
    assert select(lm.model, exact_scope(names)) == names


def test_a_fragile_block_is_kept_and_the_verified_recipe_passes():
    lm = _fragile_llama()
    rest = [n for n in select(lm.model, "linear") if n not in FRAGILE]
    common = dict(calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=10), seed=0)
    full = check(lm, "int8:channel", thresholds={"mismatch_kl": 1e9}, **common)
    without = check(lm, "int8:channel", layers=exact_scope(rest), thresholds={"mismatch_kl": 1e9}, **common)
    limit = 3 * max(without.decisions[0].high, 1e-4)
    assert full.decisions[0].low > limit, (full.decisions[0], limit)  # the fragile block dominates
    got = check(lm, "int8:channel", thresholds={"mismatch_kl": limit}, **common)
    assert got.status == "reject" and got.recipe is not None
    recipe = got.recipe
    assert set(FRAGILE) <= set(recipe["kept"])
    assert recipe["verified_status"] == "admit" and recipe["verified_value"] <= limit
    assert recipe["kept_fraction"] < 0.5 and 8 < recipe["bits_per_weight"] < 16
    assert recipe["vllm_ignored_layers"] == recipe["kept"]
    assert recipe["llmcompressor_ignore"][0] == "lm_head" and set(recipe["kept"]) <= set(recipe["llmcompressor_ignore"])
    # the recipe's scope reproduces the rollout copy: the format on every other module
    assert select(lm.model, recipe["layers"]) == [n for n in select(lm.model, "linear") if n not in recipe["kept"]]
    assert recipe["isolation"]["block 1"] == max(v for k, v in recipe["isolation"].items() if k.startswith("block"))


def test_an_admitted_format_keeps_nothing_and_the_check_is_its_verification():
    lm = mismatch.load("tiny-llama")
    got = check(lm, "int8:channel", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=6), thresholds={"mismatch_kl": 10.0}, recipe=True)
    recipe = got.recipe
    assert got.status == "admit" and recipe["kept"] == [] and recipe["verifications"] == 0
    assert (recipe["verified_status"], recipe["verified_value"]) == (got.status, got.decisions[0].value)
    assert recipe["layers"] == "linear" and recipe["vllm_ignored_layers"] == [] and recipe["llmcompressor_ignore"] == ["lm_head"]
    assert recipe["kept_fraction"] == 0.0 and recipe["bits_per_weight"] == 8.0


def _vllm_skips(prefix, ignored):
    """vLLM's `quant_utils.is_layer_skipped` for a `FusedMoE` prefix (`…experts`) or a plain layer: an
    experts layer is skipped when an ignored name holding `experts` contains its prefix, others on exact names."""
    if "experts" in prefix:
        return any(prefix in name for name in ignored if "experts" in name)
    return prefix in ignored


def _llmc_ignores(name, ignore):
    """compressed-tensors' `match_name`: `re:` patterns with re.match, other entries exact."""
    return any(re.match(t[3:], name) if t.startswith("re:") else t == name for t in ignore)


@pytest.mark.parametrize("family,moe", [("tiny-qwen3-moe", "mlp"), ("tiny-mixtral", "block_sparse_moe")])
def test_moe_exports_name_experts_and_routers_as_vllm_and_llmcompressor_do(family, moe):
    model = mismatch.load(family).model
    groups = module_groups(select(model, "0"))
    assert groups[-1] == ["model.layers.0.mlp.experts"] and [len(g) for g in groups] == [3, 1, 1]
    kept = ["model.layers.0.self_attn.o_proj", "model.layers.0.mlp.experts"]
    rest = [n for n in select(model, "linear") if n not in kept]
    vllm, llmc = exports(model, kept, rest)
    assert vllm == ["model.layers.0.self_attn.o_proj", f"model.layers.0.{moe}.experts",
                    f"model.layers.0.{moe}.gate", f"model.layers.1.{moe}.gate"]
    assert _vllm_skips(f"model.layers.0.{moe}.experts", vllm) and not _vllm_skips(f"model.layers.1.{moe}.experts", vllm)
    assert llmc[:2] == ["lm_head", r"re:.*mlp\.gate$"]  # as llm-compressor's MoE examples spell the routers
    # llm-compressor unfuses the experts into per-expert linears for calibration: those are ignored, block 1's not
    for name, ignored in [("model.layers.0.mlp.experts", True), ("model.layers.0.mlp.experts.7.down_proj", True),
                          ("model.layers.1.mlp.experts.0.gate_proj", False), ("model.layers.0.mlp.gate", True),
                          ("model.layers.1.mlp.gate", True), ("model.layers.0.self_attn.o_proj", True),
                          ("model.layers.0.self_attn.q_proj", False), ("lm_head", True)]:
        assert bool(_llmc_ignores(name, llmc)) == ignored, name
    # a scope that quantizes the routers leaves them out of both lists
    vllm, llmc = exports(model, [], select(model, "router"))
    assert vllm == [] and llmc == ["lm_head"]
