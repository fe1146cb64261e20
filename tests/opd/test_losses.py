"""OPD losses: hand-computed values, gradients against autograd on explicit formulas, chunking."""

import copy
import math

import pytest
import torch

import mismatch
from mismatch.opd.losses import (
    LOSS_REGISTRY,
    LOSSES,
    Loss,
    full_fkl,
    full_rkl,
    pg_rkl,
    pg_rkl_is,
    register_loss,
    tis_weights,
    token_loss,
)
from mismatch.opd.trainer import loss_backward, teacher_hidden
from mismatch.model.positions import position_ids
from mismatch.model.generate import sample


def test_pg_rkl_value_and_gradient_by_hand():
    logp_s = torch.tensor([math.log(0.5), math.log(0.25)], requires_grad=True)
    logp_t = torch.tensor([math.log(0.25), math.log(0.5)])
    terms = pg_rkl(logp_s, logp_t)
    # A = log πT − log πS = [−log 2, +log 2]; ℓ = −A · log πS
    expected = [-(-math.log(2)) * math.log(0.5), -(math.log(2)) * math.log(0.25)]
    assert terms.tolist() == pytest.approx(expected, rel=1e-6)
    terms.sum().backward()
    # the advantage is held constant: dℓ/dlogπS = −A exactly
    assert logp_s.grad.tolist() == pytest.approx([math.log(2), -math.log(2)], rel=1e-6)


def test_pg_rkl_is_value_and_gradient_by_hand():
    """Tinker's importance-sampling loss on the sampled-token reverse KL: value −w·A, gradient −w·A with
    A = log πT − log πR (the sampler's log-probs) and w = πS/πR, truncated at the TIS cap."""
    logp_s = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.4)], dtype=torch.float64, requires_grad=True)
    logp_t = torch.tensor([math.log(0.25), math.log(0.5), math.log(0.4)], dtype=torch.float64)
    logp_r = torch.tensor([math.log(0.125), math.log(0.5), math.log(0.1)], dtype=torch.float64)
    w = [0.5 / 0.125, 0.25 / 0.5, 0.4 / 0.1]  # 4, 0.5, 4
    a = [math.log(0.25 / 0.125), math.log(0.5 / 0.5), math.log(0.4 / 0.1)]
    for cap, weights in ((None, w), (2.0, [min(x, 2.0) for x in w])):
        logp_s.grad = None
        terms = pg_rkl_is(logp_s, logp_t, logp_r, cap)
        assert terms.tolist() == pytest.approx([-x * y for x, y in zip(weights, a)], rel=1e-12)
        terms.sum().backward()
        assert logp_s.grad.tolist() == pytest.approx([-x * y for x, y in zip(weights, a)], rel=1e-12)
    # Tinker's form −exp(log πS − log πR)·A has the same value and gradient without a cap
    plain = logp_s.detach().clone().requires_grad_()
    (-(torch.exp(plain - logp_r) * (logp_t - logp_r))).sum().backward()
    assert plain.grad.tolist() == pytest.approx([-x * y for x, y in zip(w, a)], rel=1e-12)


def test_pg_rkl_is_on_the_students_own_samples_is_pg_rkl_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    ls = torch.log_softmax(torch.randn(6, 13, generator=gen), -1).requires_grad_()
    lt = torch.log_softmax(torch.randn(6, 13, generator=gen), -1)
    y = torch.randint(0, 13, (6,), generator=gen)
    own = ls.detach().gather(-1, y[:, None]).squeeze(-1)
    grads = []
    for name, rollout in (("pg-rkl", None), ("pg-rkl-is", own), ("pg-rkl-is", None)):
        ls.grad = None
        terms = token_loss(name, ls, lt, y, rollout, 2.0)
        terms.sum().backward()
        grads.append((terms.detach(), ls.grad.clone()))
    (_, g0), *rest = grads
    assert all(torch.equal(g, g0) for _, g in rest)  # the same update, bit for bit
    assert torch.equal(rest[0][0], rest[1][0])  # None: the student's own log-probs


def test_full_kls_by_hand_and_gradients_by_finite_differences():
    p_s = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    p_t = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)
    ls, lt = p_s.log(), p_t.log()
    rkl = sum(a * math.log(a / b) for a, b in zip(p_s[0].tolist(), p_t[0].tolist()))
    fkl = sum(b * math.log(b / a) for a, b in zip(p_s[0].tolist(), p_t[0].tolist()))
    assert float(full_rkl(ls, lt)) == pytest.approx(rkl, rel=1e-12)
    assert float(full_fkl(ls, lt)) == pytest.approx(fkl, rel=1e-12)
    # gradient w.r.t. the student's logits against central finite differences (float64)
    z = torch.tensor([[0.3, -0.2, 0.9]], dtype=torch.float64, requires_grad=True)
    for fn in (full_rkl, full_fkl):
        z.grad = None
        fn(torch.log_softmax(z, -1), lt).sum().backward()
        eps = 1e-6
        for v in range(3):
            dz = torch.zeros_like(z)
            dz[0, v] = eps
            num = (fn(torch.log_softmax(z + dz, -1), lt) - fn(torch.log_softmax(z - dz, -1), lt)) / (2 * eps)
            assert float(z.grad[0, v]) == pytest.approx(float(num.detach()), rel=1e-6, abs=1e-9)


def test_tis_weights_truncate_and_carry_no_gradient():
    logp_s = torch.log(torch.tensor([0.5, 0.1, 0.9], requires_grad=True))
    logp_r = torch.log(torch.tensor([0.1, 0.1, 0.3]))
    w = tis_weights(logp_s, logp_r, cap=2.0)
    assert w.tolist() == pytest.approx([2.0, 1.0, 2.0])  # 5 → 2, 1, 3 → 2
    assert not w.requires_grad
    same = tis_weights(logp_r, logp_r, cap=2.0)
    assert torch.equal(same, torch.ones(3))


def test_unknown_loss():
    with pytest.raises(ValueError, match="unknown loss 'kl'.*pg-rkl") as info:
        token_loss("kl", torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))
    assert str(info.value) == "unknown loss 'kl'; valid: pg-rkl, pg-rkl-is, full-rkl, full-fkl"


def test_loss_registry():
    assert LOSSES == tuple(LOSS_REGISTRY) == ("pg-rkl", "pg-rkl-is", "full-rkl", "full-fkl")
    assert {name: loss.full_vocab for name, loss in LOSS_REGISTRY.items()} == {
        "pg-rkl": False, "pg-rkl-is": False, "full-rkl": True, "full-fkl": True}
    assert [name for name, loss in LOSS_REGISTRY.items() if loss.weighted] == ["pg-rkl-is"]
    assert all(loss.name == name and loss.description and "\n" not in loss.description
               for name, loss in LOSS_REGISTRY.items())
    with pytest.raises(ValueError, match="'pg-rkl' is already registered"):
        register_loss(Loss(name="pg-rkl", per_token=pg_rkl, full_vocab=False, description="again"))
    with pytest.raises(TypeError):
        LOSS_REGISTRY["x"] = LOSS_REGISTRY["pg-rkl"]  # read-only view


def test_token_loss_is_the_registered_formula_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    ls = torch.log_softmax(torch.randn(5, 11, generator=gen), -1)
    lt = torch.log_softmax(torch.randn(5, 11, generator=gen), -1)
    y = torch.randint(0, 11, (5,), generator=gen)
    rows = torch.arange(5)
    assert torch.equal(token_loss("pg-rkl", ls, lt, y), pg_rkl(ls[rows, y], lt[rows, y]))
    assert torch.equal(token_loss("full-rkl", ls, lt, y), full_rkl(ls, lt))
    assert torch.equal(token_loss("full-fkl", ls, lt, y), full_fkl(ls, lt))


@pytest.mark.parametrize("full_vocab", [False, True])
def test_token_loss_dispatches_through_the_registry(monkeypatch, full_vocab):
    seen = []

    def spy(a, b):
        seen.append((a, b))
        return a.sum(-1) if full_vocab else a

    monkeypatch.setitem(LOSS_REGISTRY._items, "spy", Loss(name="spy", per_token=spy, full_vocab=full_vocab,
                                                      description="test"))
    ls, lt = torch.arange(6.0).view(2, 3), -torch.arange(6.0).view(2, 3)
    token_loss("spy", ls, lt, torch.tensor([2, 0]))
    [(a, b)] = seen
    if full_vocab:
        assert a is ls and b is lt
    else:
        assert a.tolist() == [2.0, 3.0] and b.tolist() == [-2.0, -3.0]  # the sampled tokens' log-probs
    with pytest.raises(ValueError, match="valid: pg-rkl, pg-rkl-is, full-rkl, full-fkl, spy"):
        token_loss("kl", ls, lt, torch.tensor([0, 0]))


def _assert_grad_close(got, want, name):
    """fp32 gradients against float64 ones. An element is a sum over the N ≈ 20 response tokens of
    products through dot products over D = 64 and V = 259 terms: its fp32 rounding is at most about
    (N + D + V)·ε32 ≈ 350 × 6e-8 ≈ 2e-5 of the largest term, i.e. of the tensor's own scale — an
    absolute bound for elements that cancel to near 0 (seen: 1.3e-6 on an element of 2e-3 in a tensor
    of scale 4.2 with AVX-512 kernels), beside rtol 1e-4 for the others."""
    scale = float(want.double().abs().max())
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=2e-5 * scale, msg=name)


def _direct_loss(student, teacher, batch, loss, logp_r=None, cap=None):
    """Plain full-logits computation, one formula per loss, no chunking, float64."""
    pos = position_ids(batch.attention_mask)
    ls = torch.log_softmax(student(batch.input_ids, attention_mask=batch.attention_mask,
                                   position_ids=pos).logits.double(), -1)
    with torch.no_grad():
        lt = torch.log_softmax(teacher(batch.input_ids, attention_mask=batch.attention_mask,
                                       position_ids=pos).logits.double(), -1)
    terms = []
    for b, t in batch.response_mask.nonzero().tolist():
        y = batch.input_ids[b, t]
        s_row, t_row = ls[b, t - 1], lt[b, t - 1]
        if loss == "pg-rkl":
            term = -(t_row[y] - s_row[y]).detach() * s_row[y]
        elif loss == "pg-rkl-is":  # Tinker's importance_sampling loss: −(πS/πR)·A, A from the sampler
            r = logp_r.double()[len(terms)]
            ratio = torch.exp(s_row[y] - r)
            weight = ratio if cap is None else ratio.detach().clamp(max=cap) * torch.exp(s_row[y] - s_row[y].detach())
            term = -weight * (t_row[y] - r)
        elif loss == "full-rkl":
            term = (s_row.exp() * (s_row - t_row)).sum()
        else:
            term = (t_row.exp() * (t_row - s_row)).sum()
        terms.append(term)
    terms = torch.stack(terms)
    if cap is not None and loss != "pg-rkl-is":
        terms = terms * torch.exp(ls.detach()[batch.response_mask.bool().roll(-1, 1)]
                                  .gather(-1, batch.input_ids[batch.response_mask.bool()].unsqueeze(-1)).squeeze(-1)
                                  - logp_r.double()).clamp(max=cap)
    return terms.mean()


@pytest.mark.parametrize("loss", ["pg-rkl", "pg-rkl-is", "full-rkl", "full-fkl"])
@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
def test_chunked_loss_backward_matches_direct_autograd_at_any_chunk_size(tiny, loss, family):
    student, teacher = copy.deepcopy(tiny(family, 0).model), tiny(family, 1).model
    lm = mismatch.LM(student, tiny(family).tokenizer, family)
    rollout = sample(lm, ["ab", "hello", "xyz!"], max_new_tokens=6, seed=3)
    batch = rollout.batch
    logp_r = rollout.logprobs[batch.response_mask.bool()]
    direct = _direct_loss(student, teacher, batch, loss, logp_r, cap=2.0 if loss == "pg-rkl" else None)
    direct.backward()
    ref_grads = {n: p.grad.clone() for n, p in student.named_parameters()}
    hidden_t = teacher_hidden(teacher, batch)
    for chunk in (1, 3, 1000):
        student.zero_grad(set_to_none=True)
        res = loss_backward(student, teacher, batch, hidden_t, logp_r, loss=loss,
                            tis_cap=2.0 if loss == "pg-rkl" else None, chunk_tokens=chunk)
        assert res.loss == pytest.approx(float(direct.detach()), rel=1e-5)
        for n, p in student.named_parameters():
            _assert_grad_close(p.grad, ref_grads[n], n)


@pytest.mark.parametrize("loss", ["pg-rkl", "pg-rkl-is", "full-rkl", "full-fkl"])
def test_loss_backward_rows_per_pass_changes_no_bit(tiny, loss, monkeypatch):
    """The elementwise loss work runs `CACHE_ROWS` rows at a time after one head matmul per chunk:
    gradients, loss and log-probs equal those of one pass over each whole chunk, bit for bit."""
    from mismatch.opd import trainer as recipe

    student, teacher = copy.deepcopy(tiny("tiny-llama", 0).model), tiny("tiny-llama", 1).model
    rollout = sample(mismatch.LM(student, tiny("tiny-llama").tokenizer, "s"), ["ab", "hello", "xyz!", "q"],
                     max_new_tokens=7, seed=5)
    batch, hidden_t = rollout.batch, teacher_hidden(teacher, rollout.batch)
    logp_r = rollout.logprobs[batch.response_mask.bool()]
    runs = []
    for rows in (10 ** 6, 1, 3):  # one pass per chunk (the plain computation), then row by row, then uneven parts
        monkeypatch.setattr(recipe, "CACHE_ROWS", rows)
        student.zero_grad(set_to_none=True)
        res = loss_backward(student, teacher, batch, hidden_t, logp_r, loss=loss, tis_cap=2.0, chunk_tokens=11)
        runs.append((res.loss, res.logp_student, {n: p.grad.clone() for n, p in student.named_parameters()}))
    (loss0, logp0, grads0), *others = runs
    assert batch.response_tokens > 11  # several chunks, each of several parts
    for loss_k, logp_k, grads_k in others:
        assert loss_k == loss0 and torch.equal(logp_k, logp0)
        assert all(torch.equal(grads_k[n], grads0[n]) for n in grads0)


@pytest.mark.parametrize("loss", ["pg-rkl", "pg-rkl-is", "full-rkl", "full-fkl"])
def test_tis_reweights_each_token_of_a_mismatched_rollout_by_its_truncated_ratio(tiny, loss):
    """Rollouts from a noisy copy of the student: the weights min(π_S/π_R, 2) vary and some truncate,
    and the loss and gradient are those of the reweighted direct computation (float64, full logits)
    — not those without TIS (a TIS that does nothing fails here, where rollouts from the student
    itself, weights all 1, could not tell)."""
    student, teacher = copy.deepcopy(tiny("tiny-llama", 0).model), tiny("tiny-llama", 1).model
    rollout_copy = copy.deepcopy(student)
    with mismatch.perturbed(rollout_copy, "noise:0.5", seed=1) as noisy:
        rollout = sample(mismatch.LM(noisy, tiny("tiny-llama").tokenizer, "noisy"), ["ab", "hello", "xyz!"],
                         max_new_tokens=6, seed=3)
    batch = rollout.batch
    logp_r = rollout.logprobs[batch.response_mask.bool()]
    res = loss_backward(student, teacher, batch, teacher_hidden(teacher, batch), logp_r, loss=loss,
                        tis_cap=2.0, chunk_tokens=4)
    w = tis_weights(res.logp_student, logp_r, 2.0)
    assert (w < 0.9).any() and (w == 2.0).any()  # the weights matter here
    grads = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad(set_to_none=True)
    direct = _direct_loss(student, teacher, batch, loss, logp_r, cap=2.0)
    direct.backward()
    # without TIS: pg-rkl-is keeps its plain ratio, the others lose their weights
    unweighted = float(_direct_loss(student, teacher, batch, loss, logp_r if loss == "pg-rkl-is" else None).detach())
    # fp32 logits against float64: ~1e-6 relative per term (the bound of the chunked-loss test above)
    assert res.loss == pytest.approx(float(direct.detach()), rel=1e-5)
    assert abs(res.loss - unweighted) > 100 * 1e-5 * abs(unweighted)
    for n, p in student.named_parameters():
        _assert_grad_close(grads[n], p.grad, n)
