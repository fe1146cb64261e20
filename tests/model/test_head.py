"""head_inputs over a shared prefix (one KV-cached pass of the common tokens, then each row's own)
against the plain pass, on real tiny models of three families."""

import pytest
import torch

import mismatch
from mismatch.model.head import MIN_SHARED_PREFIX, head_inputs, shared_prefix
from mismatch.model.positions import response_index


def _batch(prefix: list[int], owns: list[list[int]], pad: int = 0):
    """Rows `[left pads][prefix][own tokens][right pads]`: the layout of generate's batches."""
    width = len(prefix) + max(len(o) for o in owns) + 2
    ids = torch.full((len(owns), width), pad)
    attn = torch.zeros_like(ids)
    for b, own in enumerate(owns):
        row = prefix + own
        left = b % 3  # other left paddings, and trailing pads
        ids[b, left:left + len(row)] = torch.tensor(row)
        attn[b, left:left + len(row)] = 1
    resp = attn.clone()
    for b, own in enumerate(owns):  # the last 3 attended tokens of each row are "the response"
        first = int(attn[b].nonzero()[-1]) - 2
        resp[b, :first] = 0
    return ids, attn, resp


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_a_shared_prefix_gives_the_plain_pass_rows_up_to_fp32_rounding(spec):
    lm = mismatch.load(spec)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 250, (24,), generator=gen).tolist()
    owns = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (5, 9, 4, 7)]
    ids, attn, resp = _batch(prefix, owns)
    assert shared_prefix(ids, attn)[0] >= len(prefix) >= MIN_SHARED_PREFIX
    index = response_index(resp)
    layers_plain, layers_shared = [], []
    with torch.no_grad():
        plain = head_inputs(lm.model, ids, attn, index, on_layer=lambda i, h: layers_plain.append(h))
        shared = head_inputs(lm.model, ids, attn, index, on_layer=lambda i, h: layers_shared.append(h),
                             share_prefix=True)
    # fp32 sums over the same terms in another order (width 64, a few layers): each matmul's relative
    # error is at most ~64·2⁻²⁴ ≈ 4e-6, and it does not grow much over 2–3 layers
    assert (shared.rows_ND - plain.rows_ND).norm() <= 1e-5 * plain.rows_ND.norm()
    assert not torch.equal(shared.rows_ND, plain.rows_ND)  # the other path did run (other rounding)
    assert len(layers_plain) == len(layers_shared)
    for a, b in zip(layers_plain, layers_shared):
        assert (a - b).norm() <= 1e-5 * a.norm()
    assert (shared.last_logits_BV - plain.last_logits_BV).abs().max() <= 1e-5 * plain.last_logits_BV.abs().max()


def test_without_a_long_enough_prefix_it_is_the_plain_pass():
    lm = mismatch.load("tiny-llama")
    ids, attn, resp = _batch([5] * (MIN_SHARED_PREFIX - 1), [[7, 8, 9, 10], [11, 12, 13, 14, 15]])
    index = response_index(resp)
    with torch.no_grad():
        assert torch.equal(head_inputs(lm.model, ids, attn, index, share_prefix=True).rows_ND,
                           head_inputs(lm.model, ids, attn, index).rows_ND)  # bit for bit: not taken


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_gradients_through_a_shared_prefix_are_the_plain_pass_gradients(spec):
    """With gradients on (OPD's student), the prefix runs once and its weights get every row's gradient
    through the repeated cache: the same parameter gradients as the plain pass, to fp32 rounding (sums in
    another order; the bound of the rows' test, a loss and a backward more of the same widths)."""
    lm = mismatch.load(spec)
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(3, 250, (20,), generator=gen).tolist()
    owns = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (6, 4, 8)]
    ids, attn, resp = _batch(prefix, owns)
    index = response_index(resp)
    weights = torch.randn(len(index), lm.model.config.hidden_size if hasattr(lm.model.config, "hidden_size")
                          else lm.model.config.n_embd, generator=gen)
    grads = []
    for share in (False, True):
        lm.model.zero_grad(set_to_none=True)
        rows = head_inputs(lm.model, ids, attn, index, share_prefix=share).rows_ND
        (rows * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in lm.model.named_parameters() if p.grad is not None})
    plain, shared = grads
    assert plain.keys() == shared.keys() and len(plain) > 4
    total = torch.cat([g.flatten() for g in plain.values()])
    diff = torch.cat([(shared[n] - g).flatten() for n, g in plain.items()])
    assert diff.norm() <= 1e-5 * total.norm()
    assert not torch.equal(diff, torch.zeros_like(diff))  # the shared path did run


def test_identical_rows_stop_the_prefix_before_the_first_requested_position():
    """Every row the same prompt: the common prefix runs into the scored tokens; it is cut before them."""
    lm = mismatch.load("tiny-qwen3")
    row = torch.randint(3, 250, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    ids, attn, resp = _batch(row[:26], [row[26:], row[26:]])
    index = response_index(resp)
    with torch.no_grad():
        plain = head_inputs(lm.model, ids, attn, index).rows_ND
        shared = head_inputs(lm.model, ids, attn, index, share_prefix=True).rows_ND
    assert (shared - plain).norm() <= 1e-5 * plain.norm()
