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
