"""llama.cpp as a mismatch source: GGUF export, logits, sampling, probes and OPD rollouts.

These run llama.cpp itself (the optional `engines` extra, `make engines`); without it they skip.
"""

import numpy as np
import pytest
import torch

import mismatch
from mismatch.rollout.gguf_export import write_gguf
from mismatch.model.loader import LM
from mismatch.rollout.spec import RolloutSpec
from mismatch.model.generate import generate

pytestmark = pytest.mark.engines
llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp is not installed (the engines extra: make engines)")

from mismatch.rollout.llamacpp import LlamaCpp, engine_rollout, open_engine  # noqa: E402

PROMPTS = ["hello there", "abc", "the quick brown fox jumps", "2+2="]


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].double()


def _kl(lp, lq):
    return (lp.exp() * (lp - lq)).sum(-1)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3"])
def test_an_f32_export_agrees_with_transformers_to_fp32_rounding(tmp_path, family):
    lm = mismatch.load(family)
    write_gguf(lm, tmp_path / "m.gguf", "f32")
    engine = LlamaCpp(tmp_path / "m.gguf", name="e", n_ctx=128, kv="f32")
    ids = [1] + torch.randint(3, 259, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    z_hf, z_cpp = _hf_logits(lm.model, ids), engine.sequence_logits(ids).double()
    assert z_cpp.shape == (len(ids), 259)
    assert float((z_hf - z_cpp).abs().max()) <= 1e-4 * (1 + float(z_hf.abs().max()))
    # and through the probes, on a left-padded batch of unequal lengths (positions from the first real token)
    batch = generate(lm, PROMPTS, max_new_tokens=12, temperature=1.0, seed=1)
    res = mismatch.probe(lm, engine, batch.input_ids, batch.attention_mask, batch.response_mask, per_layer=False)
    assert res.summary["top1_agree"] == 1.0 and abs(res.summary["kl_fwd_mean"]) < 1e-7  # fp32 metric rounding
    assert res.summary["logp_abs_diff_max"] < 1e-4


def test_the_weight_types_order_the_mismatch_and_match_an_independent_q8_0(tmp_path):
    lm = mismatch.load("tiny-llama")
    ids = [1] + list(range(40, 100))
    lp = _hf_logits(lm.model, ids).log_softmax(-1)
    kls = {}
    for weights in ("f32", "f16", "q8_0", "q4_1", "q4_0"):
        types = write_gguf(lm, tmp_path / f"{weights}.gguf", weights)
        assert types["blk.0.attn_q.weight"] == weights.upper() and types["blk.0.attn_norm.weight"] == "F32"
        z = LlamaCpp(tmp_path / f"{weights}.gguf", name=weights, n_ctx=128, kv="f32").sequence_logits(ids)
        kls[weights] = float(_kl(lp, z.double().log_softmax(-1)).mean())
    assert kls["f32"] < 1e-9 < kls["f16"] < kls["q8_0"] < kls["q4_1"]
    assert kls["q8_0"] < kls["q4_0"]
    # Q8_0 read back equals blocks of 32 rounded with their own absmax/127 scale (an fp16 number)
    import gguf

    reader = gguf.GGUFReader(str(tmp_path / "q8_0.gguf"))
    stored = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    w = lm.model.model.layers[1].mlp.down_proj.weight.detach().double().numpy()
    blocks = w.reshape(-1, 32)
    d = (np.abs(blocks).max(1, keepdims=True) / 127).astype(np.float16).astype(np.float64)
    ours = (np.clip(np.round(blocks / np.where(d == 0, 1, d)), -127, 127) * d).reshape(w.shape)
    theirs = gguf.quants.dequantize(stored.data, stored.tensor_type).reshape(w.shape)
    step = np.repeat(d, 32, 1).reshape(w.shape)
    assert np.all(np.abs(theirs - ours) <= step * 1.0001)  # at most one step apart (rounding ties)
    assert np.mean(theirs == ours.astype(np.float32)) > 0.99


def test_sampled_log_probs_are_the_engines_own_and_the_seed_fixes_the_tokens(tmp_path):
    lm = mismatch.load("tiny-qwen3")
    engine = open_engine(lm, "f32", "f32", path=tmp_path / "q.gguf")
    ro = engine_rollout(engine, lm.tokenizer, PROMPTS, max_new_tokens=16, seed=7)
    again = engine_rollout(engine, lm.tokenizer, PROMPTS, max_new_tokens=16, seed=7)
    other = engine_rollout(engine, lm.tokenizer, PROMPTS, max_new_tokens=16, seed=8)
    assert torch.equal(ro.batch.input_ids, again.batch.input_ids) and torch.equal(ro.logprobs, again.logprobs)
    assert not torch.equal(ro.batch.input_ids, other.batch.input_ids)
    for b in range(len(PROMPTS)):  # each sampled token's log-prob = log-softmax of llama.cpp's logits, re-evaluated
        attn, resp = ro.batch.attention_mask[b].bool(), ro.batch.response_mask[b].bool()
        ids = ro.batch.input_ids[b][attn].tolist()
        n_prompt = int((attn & ~resp).sum())
        lq = engine.sequence_logits(ids).double().log_softmax(-1)[n_prompt - 1:-1]
        want = lq.gather(-1, torch.tensor(ids[n_prompt:])[:, None]).squeeze(-1)
        assert ro.logprobs[b][resp].double().tolist() == pytest.approx(want.tolist(), abs=1e-4)
        eos = lm.tokenizer.eos_token_id
        assert eos not in ids[n_prompt:-1]  # a response ends at its first EOS


def test_the_engine_as_a_probe_spec_and_a_bad_use_are_clear(tmp_path):
    lm = mismatch.load("tiny-llama")
    batch = generate(lm, PROMPTS, max_new_tokens=10, temperature=1.0, seed=2)
    results = mismatch.probe_candidates(lm, batch, ["engine:llama.cpp,q8_0", "int8:channel"], ["linear"],
                                        per_layer=True)
    engine, torch_int8 = results
    assert (engine.perturb, engine.layers) == ("engine:llama.cpp,q8_0", "all") and engine.result.per_layer.empty
    assert engine.result.summary["kl_fwd_mean"] > 1e-5 and not torch_int8.result.per_layer.empty
    with pytest.raises(mismatch.InputError, match="not a perturbation kind: another engine runs the model"):
        with mismatch.perturbed(lm.model, "engine:llama.cpp,f32"):
            pass
    with pytest.raises(mismatch.InputError, match="not loaded from a GGUF file"):
        open_engine(lm, "gguf")
    with pytest.raises(mismatch.InputError, match="no per-layer metrics"):
        mismatch.probe(lm, open_engine(lm, "f32"), batch.input_ids, batch.attention_mask, batch.response_mask)
    with pytest.raises(mismatch.InputError, match="GGUF export supports LlamaForCausalLM"):
        write_gguf(LM(torch.nn.Module(), lm.tokenizer, "plain"), tmp_path / "g.gguf")
    assert str(RolloutSpec.parse("engine:llama.cpp").engine) == "engine:llama.cpp,f32"


def test_opd_with_llama_cpp_rollouts_scores_the_engines_tokens(tmp_path):
    from mismatch.opd import OPDConfig, train

    cfg = OPDConfig(pair="reverse-qwen3", rollout="engine:llama.cpp,f32,kv-f32", steps=2, batch_size=4,
                    eval_every=2, eval_prompts=8, train_prompts=16)
    rows = train(cfg)
    per_step = {(r["step"], r["metric"]): r["value"] for r in rows}
    for step in (1, 2):  # the engine's log-probs of its own tokens vs the trained student's: fp32 rounding apart
        assert abs(per_step[step, "mismatch_kl"]) < 1e-5 and per_step[step, "mismatch_logp_abs_diff_max"] < 1e-3
        assert per_step[step, "refresh_s"] > 0 and per_step[step, "tokens"] > 0
    with pytest.raises(ValueError, match="re-exported from the trained weights"):
        OPDConfig(pair="reverse-qwen3", rollout="engine:llama.cpp,f32", top_p=0.9)


def test_gpt2_exports_and_differs_only_by_llama_cpps_fp16_gelu_table(tmp_path):
    """llama.cpp evaluates GELU through a table of fp16 values (x rounded to fp16, GELU(x) stored in fp16):
    GPT-2 does not agree to fp32 rounding, and emulating that table in transformers removes most of the gap."""
    from transformers.activations import NewGELUActivation

    lm = mismatch.load("tiny-gpt2")
    write_gguf(lm, tmp_path / "g.gguf", "f32")
    ids = [1] + list(range(40, 100))
    z_cpp = LlamaCpp(tmp_path / "g.gguf", name="g", n_ctx=128, kv="f32").sequence_logits(ids).double()
    z_hf = _hf_logits(lm.model, ids)
    gap = float((z_hf - z_cpp).abs().max())
    assert float(_kl(z_hf.log_softmax(-1), z_cpp.log_softmax(-1)).mean()) < 1e-6 and gap < 1e-2

    class TableGelu(torch.nn.Module):
        def forward(self, x):
            y = NewGELUActivation()(x.half().float()).half().float()
            return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))

    emulated = mismatch.load("tiny-gpt2")
    for block in emulated.model.transformer.h:
        block.mlp.act = TableGelu()
    assert float((_hf_logits(emulated.model, ids) - z_cpp).abs().max()) < gap / 3
