"""Framework-named rollout statistics against a slow, obvious computation in plain Python."""

import math
import random

import pytest
import torch

from mismatch.admission.gates import PRESETS, preset_gates, rollout_stats
from mismatch.errors import InputError


def _tokens(seed=0, n_seq=5):
    rng = random.Random(seed)
    seqs = []
    for _ in range(n_seq):
        length = rng.randint(1, 9)
        seqs.append([(-rng.uniform(0.01, 4.0), rng.gauss(0.0, 0.4)) for _ in range(length)])
    # (log p_rollout, log r): log p_train = log p_rollout + log r, kept ≤ 0
    seqs[0][0] = (-3.0, 1.2)   # r ≈ 3.3 > 2: truncated by verl's TIS
    seqs[1][0] = (-2.0, -10.0)  # r = 4.5e-5 < 1e-4: vetoes sequence 1
    rows = [(s, min(lp + lr, 0.0), lp) for s, seq in enumerate(seqs) for lp, lr in seq]
    return rows


def _slow(rows):
    by_seq = {}
    for s, lt, lr in rows:
        by_seq.setdefault(s, []).append((lt, lr))
    log_r = [lt - lr for _, lt, lr in rows]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    seq_lt = [mean([t for t, _ in v]) for v in by_seq.values()]
    seq_lr = [mean([r for _, r in v]) for v in by_seq.values()]
    diffs = [b - a for a, b in zip(seq_lt, seq_lr)]
    clamp = lambda x: max(-20.0, min(20.0, x))  # noqa: E731
    w = [min(2.0, max(0.5, math.exp(x))) for x in log_r]
    wm = mean(w)
    geo = [math.exp(mean([t - r for t, r in v])) for v in by_seq.values()]
    return {
        "rollout_corr/kl": mean([-x for x in log_r]),
        "rollout_corr/k3_kl": mean([math.exp(x) - 1 - x for x in log_r]),
        "rollout_corr/training_ppl": mean([math.exp(-x) for x in seq_lt]),
        "rollout_corr/rollout_log_ppl": mean([-x for x in seq_lr]),
        "rollout_corr/log_ppl_diff": mean(diffs),
        "rollout_corr/log_ppl_abs_diff": mean([abs(d) for d in diffs]),
        "rollout_corr/log_ppl_diff_max": max(diffs),
        "rollout_corr/ppl_ratio": mean([math.exp(d) for d in diffs]),
        "rollout_corr/chi2_token": mean([math.exp(2 * clamp(x)) for x in log_r]) - 1,
        "rollout_corr/chi2_seq": mean([math.exp(2 * clamp(sum(t - r for t, r in v))) for v in by_seq.values()]) - 1,
        "rollout_corr/rollout_is_ratio_fraction_high": mean([float(math.exp(x) > 2) for x in log_r]),
        "rollout_corr/rollout_is_ratio_fraction_low": mean([float(math.exp(x) < 0.5) for x in log_r]),
        "rollout_corr/rollout_is_eff_sample_size": 1 / mean([(x / wm) ** 2 for x in w]),
        "rollout_corr/rollout_rs_seq_masked_fraction": mean([float(not 0.999 <= g <= 1.001) for g in geo]),
        "rollout_corr/rollout_is_veto_fraction": mean([float(any(t - r < math.log(1e-4) for t, r in v))
                                                       for v in by_seq.values()]),
        "train/train_rollout_logprob_abs_diff": mean([mean([abs(t - r) for t, r in v]) for v in by_seq.values()]),
        "train/token_mult_prob_error": mean([math.exp(abs(x)) for x in log_r]),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_statistics_match_a_plain_python_computation(seed):
    rows = _tokens(seed)
    seq = torch.tensor([s for s, _, _ in rows])
    lt = torch.tensor([t for _, t, _ in rows], dtype=torch.float64)
    lr = torch.tensor([r for _, _, r in rows], dtype=torch.float64)
    got = rollout_stats(lt, lr, seq)
    for name, expected in _slow(rows).items():
        assert got[name] == pytest.approx(expected, rel=1e-12, abs=1e-15), name
    assert got["rollout_corr/rollout_is_veto_fraction"] > 0 and got["rollout_corr/rollout_is_ratio_fraction_high"] > 0


def test_identical_policies_give_the_neutral_values_exactly():
    lp = torch.tensor([-0.5, -1.0, -2.0, -0.1])
    got = rollout_stats(lp, lp.clone(), torch.tensor([0, 0, 1, 1]))
    assert got["rollout_corr/kl"] == 0.0 and got["rollout_corr/k3_kl"] == 0.0 and got["rollout_corr/chi2_token"] == 0.0
    assert got["rollout_corr/ppl_ratio"] == 1.0 and got["train/token_mult_prob_error"] == 1.0
    assert got["train/train_rollout_logprob_abs_diff"] == 0.0
    assert got["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0
    assert all(g.passes(got[g.metric]) for name in PRESETS for g in PRESETS[name])


def test_bad_input_is_a_clear_error():
    ok = torch.tensor([-1.0, -2.0])
    with pytest.raises(InputError, match="finite"):
        rollout_stats(torch.tensor([-1.0, float("nan")]), ok, torch.tensor([0, 0]))
    with pytest.raises(InputError, match="≤ 0"):
        rollout_stats(ok, torch.tensor([-1.0, 0.5]), torch.tensor([0, 0]))
    with pytest.raises(InputError, match="cover"):
        rollout_stats(ok, ok, torch.tensor([0, 2]))
    with pytest.raises(InputError, match="unknown gate preset 'vllm'"):
        preset_gates(["slime", "vllm"])
    assert [g.limit for g in preset_gates(["slime", "nemo-rl"])] == [0.1, 1.05]
