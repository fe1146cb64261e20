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


@pytest.mark.parametrize("ref_shared", [False, True])
def test_token_metrics_in_a_work_buffer_give_the_same_bits(ref_shared):
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(2, 5, 301, generator=gen)
    lp, lq = torch.log_softmax(z[0], -1), torch.log_softmax(z[0] + 0.3 * z[1], -1)
    y = torch.randint(0, 301, (5,), generator=gen)
    plain = token_metrics_(lp.clone(), lq.clone(), y, ref_shared=ref_shared)
    work = torch.full((2, 8, 301), float("nan"))  # wider than the chunk, stale contents
    kept = lp.clone()
    buffered = token_metrics_(kept, lq.clone(), y, ref_shared=ref_shared, work_2RV=work)
    assert plain.keys() == buffered.keys()
    assert all(torch.equal(plain[k], buffered[k]) for k in plain)
    assert torch.equal(kept, lp) == ref_shared  # a shared reference is read, never written
    assert not torch.isnan(work[0, :5]).any() and torch.isnan(work[0, 5:]).all()


def test_sampled_token_metrics_equal_a_plain_python_computation():
    """The admission check's `mismatch_*` statistics, every key, from the definitions in plain Python."""
    from mismatch.errors import InputError
    from mismatch.metrics import sampled_token_metrics

    log_r = [0.9, -0.8, 0.05, -0.001, 0.0, 1.2, -2.5]  # two ratios above 2, one below ½
    lt = torch.tensor([-1.0 - 0.1 * i for i in range(len(log_r))], dtype=torch.float64)
    lr = lt - torch.tensor(log_r, dtype=torch.float64)
    got = sampled_token_metrics(lt, lr, clip=2.0)
    n = len(log_r)
    want = {"kl": sum(-x for x in log_r) / n, "k3": sum(math.expm1(x) - x for x in log_r) / n,
            "logp_abs_diff_mean": sum(abs(x) for x in log_r) / n, "logp_abs_diff_max": max(abs(x) for x in log_r),
            "is_ratio_outside_frac": sum(not 0.5 <= math.exp(x) <= 2.0 for x in log_r) / n,
            "chi2_token": sum(math.exp(2 * x) for x in log_r) / n - 1}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
    assert sampled_token_metrics(lt, lr, clip=3.0)["is_ratio_outside_frac"] == 2 / n  # e^1.2 > 3, e^-2.5 < 1/3
    for bad in ((lt, lr[:3]), (lt[:0], lr[:0])):
        with pytest.raises(InputError, match="need two \\[N\\] log-prob tensors"):
            sampled_token_metrics(*bad)


def test_summary_counts_the_sequences_that_have_tokens():
    """Sequence ids with gaps (a sequence scored no token): `sequences` counts the present ones."""
    from mismatch.metrics import sampled_summary

    lp = torch.tensor([-1.0, -2.0, -0.5, -0.7], dtype=torch.float64)
    s = sampled_summary(lp, lp - 0.1, torch.tensor([0, 0, 3, 5]), clip=2.0)
    assert s["sequences"] == 3 and s["tokens"] == 4
    assert s["seq_log_ratio_abs_mean"] == pytest.approx((0.2 + 0.1 + 0.1) / 3, rel=1e-12)


def test_the_frameworks_names_are_aliases_of_one_computation():
    """`rollout_corr/kl`, `k3_kl` and the probe summary's k3_mean / chi2_token / … are the same numbers as
    `sampled_token_metrics`' (one computation, `log_ratio_stats`), and that computation matches a slow
    per-token loop in plain Python floats (rel 1e-12: float64 sums of 50 terms)."""
    import math

    import torch

    from mismatch.metrics import (PROBE_NAMES, VERL_NAMES, rollout_stats, sampled_summary,
                                  sampled_token_metrics)

    gen = torch.Generator().manual_seed(3)
    lt = -torch.rand(50, generator=gen, dtype=torch.float64) * 3
    lr = (lt + 0.3 * torch.randn(50, generator=gen, dtype=torch.float64)).clamp(max=0.0)
    seq = torch.arange(50) // 10
    own = sampled_token_metrics(lt, lr, 2.0)
    verl = rollout_stats(lt, lr, seq)
    probe = sampled_summary(lt, lr, seq, 2.0)
    assert {verl[name] for key, name in VERL_NAMES.items()} == {own[key] for key in VERL_NAMES}
    assert all(probe[name] == own[key] for key, name in PROBE_NAMES.items())
    x = [a - b for a, b in zip(lt.tolist(), lr.tolist())]
    slow = {"kl": sum(-v for v in x) / 50, "k3": sum(math.expm1(v) - v for v in x) / 50,
            "chi2_token": sum(math.exp(2 * v) for v in x) / 50 - 1,
            "is_ratio_outside_frac": sum(not 0.5 <= math.exp(v) <= 2.0 for v in x) / 50}
    for key, value in slow.items():
        assert own[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
