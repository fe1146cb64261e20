"""Restore puts back the very objects: the modules and `Parameter`s an optimizer or a caller holds,
not copies with equal values — so training after a probe updates the weights the model uses."""

import pytest
import torch

import mismatch
from mismatch.perturb import perturbed
from tests.conftest import random_ids
from tests.perturb.test_apply import ALL_SPECS, _params


@pytest.mark.parametrize("spec", _params(ALL_SPECS))
def test_restore_puts_back_the_same_module_and_parameter_objects(spec):
    lm = mismatch.load("tiny-llama")
    ids = random_ids(2, 8, seed=4)
    modules = dict(lm.model.named_modules())
    params = dict(lm.model.named_parameters())
    with perturbed(lm.model, spec, layers="all", calibration_ids=ids):
        pass
    assert all(m is modules[n] for n, m in lm.model.named_modules()) and dict(lm.model.named_modules()).keys() == modules.keys()
    assert all(p is params[n] for n, p in lm.model.named_parameters()) and dict(lm.model.named_parameters()).keys() == params.keys()


def test_an_optimizer_built_before_a_probe_still_trains_the_model_after_it():
    lm = mismatch.load("tiny-llama")
    ids = random_ids(2, 8, seed=5)
    opt = torch.optim.SGD(lm.model.parameters(), lr=0.1)
    with torch.no_grad():
        before = lm.model(ids).logits
    with perturbed(lm.model, "int4:group128", layers="all"):
        pass
    lm.model(ids).logits.square().mean().backward()
    opt.step()
    with torch.no_grad():
        assert not torch.equal(lm.model(ids).logits, before)  # the step moved the weights the model runs


def test_a_perturbed_model_says_so_and_its_new_weights_take_no_gradient():
    from mismatch.perturb import active_perturbations, is_perturbed

    lm = mismatch.load("tiny-llama")
    assert not is_perturbed(lm.model) and active_perturbations(lm.model) == ()
    with perturbed(lm.model, "int4:group128", layers="attn") as cand, perturbed(cand, "noise:0.1", layers="0"):
        snaps = active_perturbations(lm.model)
        assert is_perturbed(lm.model) and [(s.spec, s.layers) for s in snaps] == [("int4:group128", "attn"),
                                                                                   ("noise:0.1", "0")]
        swapped = lm.model.model.layers[0].self_attn.q_proj.weight
        assert not swapped.requires_grad
    from mismatch.perturb.apply import ACTIVE_PERTURBATIONS_KEY

    assert not is_perturbed(lm.model) and ACTIVE_PERTURBATIONS_KEY not in lm.model.__dict__
