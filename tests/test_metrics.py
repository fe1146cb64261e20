"""Metrics on hand-computed distributions."""

import math

import pytest
import torch

from mismatch.metrics import summarize, token_metrics_


def test_two_token_distributions_by_hand():
    p, q = torch.tensor([[0.4, 0.6], [0.25, 0.75]]), torch.tensor([[0.9, 0.1], [0.25, 0.75]])
    y = torch.tensor([1, 0])
    m = token_metrics_(p.log(), q.log(), y)
    kl_fwd0 = 0.4 * math.log(0.4 / 0.9) + 0.6 * math.log(0.6 / 0.1)
    kl_rev0 = 0.9 * math.log(0.9 / 0.4) + 0.1 * math.log(0.1 / 0.6)
    assert m["kl_fwd"].tolist() == pytest.approx([kl_fwd0, 0.0], abs=1e-6)
    assert m["kl_rev"].tolist() == pytest.approx([kl_rev0, 0.0], abs=1e-6)
    assert m["tv"].tolist() == pytest.approx([0.5, 0.0], abs=1e-6)
    assert m["top1_agree"].tolist() == [False, True]
    r0 = 0.6 / 0.1
    assert m["is_ratio"].tolist() == pytest.approx([r0, 1.0], rel=1e-6)
    assert m["k3"].tolist() == pytest.approx([r0 - 1 - math.log(r0), 0.0], abs=1e-6)
    s = summarize(m, torch.tensor([0, 1]), clip=2.0)
    assert s["is_ratio_outside_frac"] == 0.5
    assert s["seq_log_ratio_abs_mean"] == pytest.approx((math.log(r0) + 0) / 2, rel=1e-6)
    assert s["chi2_token"] == pytest.approx((r0 ** 2 + 1) / 2 - 1, rel=1e-6)
    w = torch.tensor([r0, 1.0]) / ((r0 + 1) / 2)
    assert s["is_ess"] == pytest.approx(1 / float((w ** 2).mean()), rel=1e-6)
    assert s["dp_rms"] == pytest.approx(math.sqrt(((0.1 - 0.6) ** 2 + 0) / 2), rel=1e-6)
    assert s["ppl_cand_over_ref"] == pytest.approx(math.exp((math.log(0.6) + math.log(0.25)) / 2
                                                    - (math.log(0.1) + math.log(0.25)) / 2), rel=1e-6)
