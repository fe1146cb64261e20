"""Ordering sanity on the real SmolLM2 weights."""

import pytest

import mismatch
from mismatch.model.generate import teacher_forced
from mismatch.perturb import perturbed

pytestmark = pytest.mark.smollm2


@pytest.fixture(scope="module")
def ref_and_model(smollm2):
    batch = teacher_forced(smollm2, [
        "The capital of France is Paris. It is known for the Eiffel Tower and the Louvre museum.",
        "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    ])
    return mismatch.reference(smollm2, batch.input_ids, batch.attention_mask, batch.response_mask,
                              per_layer=False), smollm2.model


def _kl(ref_and_model, spec, seed=0):
    ref, model = ref_and_model
    with perturbed(model, spec, seed=seed) as cand:
        return mismatch.probe(ref, cand, per_layer=False).summary["kl_fwd_mean"]


def test_fp8_channel_is_closer_than_int4(ref_and_model):
    fp8, int4 = _kl(ref_and_model, "fp8-e4m3:channel"), _kl(ref_and_model, "int4:group128")
    assert 0 < fp8 < int4


def test_noise_kl_grows_with_sigma(ref_and_model):
    kls = [_kl(ref_and_model, f"noise:{s}") for s in (0.001, 0.003, 0.01, 0.03)]
    assert 0 < kls[0] < kls[1] < kls[2] < kls[3]
    assert _kl(ref_and_model, "noise:0") == 0.0
