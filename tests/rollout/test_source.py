"""open_source: one rollout-source interface over a perturbed model and an engine; the numbers are the
ones the direct paths give (the model perturbed by hand, the engine opened by hand)."""

import importlib.util

import pytest
import torch

import mismatch
from mismatch.rollout.source import open_source
from mismatch.model.generate import generate
from mismatch.perturb import is_perturbed, perturbed


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_perturbation_source_is_the_model_perturbed_in_place_then_restored():
    lm = mismatch.load("tiny-llama")
    batch = generate(lm, ["abc", "hello"], max_new_tokens=6)
    ref = mismatch.reference(lm, batch.input_ids, batch.attention_mask, batch.response_mask)
    before = _state(lm.model)
    with open_source(lm, "int8:channel", "mlp", seed=1) as source:
        assert is_perturbed(source.candidate.model) and not source.whole_model
        got = mismatch.probe(ref, source.candidate).summary
        sampled = source.generate(["abc"], max_new_tokens=5, seed=3)
    assert not is_perturbed(lm.model) and all(torch.equal(v, before[k]) for k, v in lm.model.state_dict().items())
    with perturbed(lm.model, "int8:channel", layers="mlp", seed=1) as cand:  # the direct path
        want = mismatch.probe(ref, mismatch.LM(cand, lm.tokenizer, lm.name)).summary
        direct = generate(mismatch.LM(cand, lm.tokenizer, lm.name), ["abc"], max_new_tokens=5, temperature=1.0, seed=3)
    assert got == want and got["kl_fwd_mean"] > 0
    assert torch.equal(sampled.input_ids, direct.input_ids)


@pytest.mark.engines
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama.cpp not installed (`make engines`)")
def test_an_engine_source_runs_the_whole_model_and_is_closed_after(monkeypatch):
    from mismatch.rollout.llamacpp import LlamaCpp

    closed, close = [], LlamaCpp.close
    monkeypatch.setattr(LlamaCpp, "close", lambda self: (closed.append(self), close(self)))
    lm = mismatch.load("tiny-llama")
    with open_source(lm, "engine:llama.cpp,f32", "mlp") as source:  # the scope is the engine's: the whole model
        assert source.whole_model and source.candidate is source.engine
        samples = source.sample(["abc", "hello"], max_new_tokens=4, seed=0)
        engine = source.engine
    assert samples.logprobs[samples.batch.response_mask.bool()].le(0).all()
    assert samples.batch.response_mask.sum() > 0
    assert closed == [engine]
