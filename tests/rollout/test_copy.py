"""The rollout copy: stale weights from a ring, perturbations re-applied on refresh."""

import copy

import pytest
import torch

from mismatch.rollout.copy import RolloutCopy
from mismatch.perturb.rounding import round_fp8


def _fake_step(model, step):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * step)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_ring_serves_weights_k_steps_old(tiny, k):
    student = copy.deepcopy(tiny("tiny-llama").model)
    saved = [copy.deepcopy(student.state_dict())]
    ring = RolloutCopy(student, None, k)
    assert (ring.model is student) == (k == 0)  # stale:0 without a perturbation is the student
    for step in range(1, 7):
        _fake_step(student, step)
        saved.append(copy.deepcopy(student.state_dict()))
        ring.refresh()
        want = max(0, step - k)
        assert ring.served_version == want
        for name, tensor in ring.model.state_dict().items():
            assert torch.equal(tensor, saved[want][name]), (step, name)


def test_clean_rollout_is_the_student_itself(tiny):
    student = copy.deepcopy(tiny("tiny-llama").model)
    ring = RolloutCopy(student, None, 0)
    assert ring.model is student
    ring.refresh()
    assert ring.served_version == 1


def test_perturbation_is_reapplied_to_the_served_weights(tiny):
    student = copy.deepcopy(tiny("tiny-llama").model)
    ring = RolloutCopy(student, "fp8-e4m3:channel", 2)
    name = "model.layers.0.mlp.down_proj.weight"
    for step in range(1, 5):
        _fake_step(student, step)
        ring.refresh()
    # after 4 steps with K = 2 the copy holds the student's step-2 weights, FP8-rounded
    reference = copy.deepcopy(tiny("tiny-llama").model)
    for step in range(1, 3):
        _fake_step(reference, step)
    w = reference.state_dict()[name]
    assert torch.equal(dict(ring.model.named_parameters())[name], round_fp8(w, "e4m3", "channel"))
    assert not torch.equal(dict(student.named_parameters())[name], w)


def test_the_copy_takes_a_perturbation_or_engine_and_a_valid_lag():
    with pytest.raises(ValueError, match="staleness must be ≥ 0"):
        RolloutCopy(torch.nn.Linear(2, 2), None, -1)
    with pytest.raises(ValueError, match="perturbation or engine"):
        RolloutCopy(torch.nn.Linear(2, 2), "stale:2", 0)
