"""Framework-named rollout statistics against a slow, obvious computation in plain Python, and the
verl-named ones against verl 0.9.1's own `compute_rollout_correction_and_rejection_mask`."""

import json
import math
import random
import subprocess
import sys

import pytest
import torch

from mismatch.admission.gates import PRESETS, preset_gates
from mismatch.metrics import rollout_stats
from mismatch.errors import InputError


def _tokens(seed=0, n_seq=5):
    rng = random.Random(seed)
    seqs = []
    for _ in range(n_seq):
        length = rng.randint(1, 9)
        seqs.append([(-rng.uniform(0.01, 4.0), rng.gauss(0.0, 0.4)) for _ in range(length)])
    # (log p_rollout, log r): log p_train = log p_rollout + log r, kept ≤ 0
    seqs[0][0] = (-3.0, 1.2)   # r ≈ 3.3 > 2: truncated by verl's TIS
    seqs[1][0] = (-2.0, -10.0)  # r = 4.5e-5 < ½
    seqs[2][0] = (-0.5, -25.0)  # log r beyond verl's ±20 clamp (k3_kl is not clamped, chi2 and IS weights are)
    seqs[3][0] = (-30.0, 25.0)  # and beyond +20: the token's r and a sequence's Σ log r are clamped at e^20
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
    w = [min(2.0, math.exp(clamp(x))) for x in log_r]  # token TIS at 2: truncated from above only
    wm = mean(w) + 1e-8  # verl normalises by the mean weight + 1e-8
    k1 = [mean([-clamp(t - r) for t, r in v]) for v in by_seq.values()]  # log(π_rollout/π_train), per sequence
    return {
        "rollout_corr/kl": mean([-x for x in log_r]),
        "rollout_corr/k3_kl": mean([math.exp(x) - 1 - x for x in log_r]),
        "rollout_corr/training_ppl": mean([math.exp(-x) for x in seq_lt]),
        "rollout_corr/training_log_ppl": mean([-x for x in seq_lt]),
        "rollout_corr/rollout_ppl": mean([math.exp(-x) for x in seq_lr]),
        "rollout_corr/rollout_log_ppl": mean([-x for x in seq_lr]),
        "rollout_corr/log_ppl_diff": mean(diffs),
        "rollout_corr/log_ppl_abs_diff": mean([abs(d) for d in diffs]),
        "rollout_corr/log_ppl_diff_max": max(diffs),
        "rollout_corr/log_ppl_diff_min": min(diffs),
        "rollout_corr/ppl_ratio": mean([math.exp(d) for d in diffs]),
        "rollout_corr/chi2_token": mean([math.exp(2 * clamp(x)) for x in log_r]) - 1,
        "rollout_corr/chi2_seq": mean([math.exp(2 * clamp(sum(t - r for t, r in v))) for v in by_seq.values()]) - 1,
        "rollout_corr/rollout_is_ratio_fraction_high": mean([float(math.exp(x) > 2) for x in log_r]),
        "rollout_corr/rollout_is_ratio_fraction_low": mean([float(math.exp(x) < 0.5) for x in log_r]),
        "rollout_corr/rollout_is_eff_sample_size": 1 / mean([(x / wm) ** 2 for x in w]),
        "rollout_corr/rollout_rs_seq_masked_fraction": mean([float(not math.log(0.999) <= m <= math.log(1.001))
                                                             for m in k1]),
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
    assert set(got) == set(_slow(rows))  # every statistic, recomputed
    for name, expected in _slow(rows).items():
        assert got[name] == pytest.approx(expected, rel=1e-12, abs=1e-15), name
    assert got["rollout_corr/rollout_is_ratio_fraction_high"] > 0 and got["rollout_corr/rollout_is_ratio_fraction_low"] > 0
    assert "rollout_corr/rollout_is_veto_fraction" not in got  # verl 0.9.1 has no veto


def _padded(rows):
    """`rows` (seq, log p_train, log p_rollout) as verl's `[B, T]` float64 log-probs and response mask."""
    n_seq = max(s for s, _, _ in rows) + 1
    T = max(sum(1 for s, _, _ in rows if s == k) for k in range(n_seq))
    lt, lr, mask = (torch.zeros(n_seq, T, dtype=torch.float64) for _ in range(3))
    fill = [0] * n_seq
    for s, t, r in rows:
        lt[s, fill[s]], lr[s, fill[s]], mask[s, fill[s]] = t, r, 1.0
        fill[s] += 1
    return lt, lr, mask


def _edge_rows():
    """Sequences whose mean log(π_rollout/π_train) sits 1e-7 outside or inside verl's seq_mean_k1
    "0.999_1.001" bounds (log 0.999 = −1.0005e-3, log 1.001 = 9.995e-4): masked, kept, kept, kept.
    The bounds are not symmetric, so bounding the mean of log(π_train/π_rollout) instead (as mismatch
    did before) masks three of these four."""
    rows = []
    for s, m in enumerate(x + d for x in (math.log(0.999), -math.log(1.001)) for d in (-1e-7, 1e-7)):
        for k in range(4):  # log r = −m ± 0.01, mean −m; log p_rollout −1 − k/10
            lr_ = -1.0 - k / 10
            rows.append((s, lr_ - m + (0.01 if k % 2 else -0.01), lr_))
    return rows


BATCHES = {"outliers": _tokens(0), "16seq": _tokens(1, n_seq=16), "edges": _edge_rows()}

_VERL = """
import json, sys, torch
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
import verl
out = {"version": verl.__version__}
for name, (lt, lr, mask) in json.loads(sys.stdin.read()).items():
    args = (torch.tensor(x, dtype=torch.float64) for x in (lt, lr, mask))
    out[name] = compute_rollout_correction_and_rejection_mask(*args, rollout_is="token", rollout_is_threshold=2.0,
        rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001")[2]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def verl_metrics():
    """verl's own metrics of each batch, computed in a subprocess (importing verl configures logging
    and sets environment variables: none of that reaches this process)."""
    payload = {name: [t.tolist() for t in _padded(rows)] for name, rows in BATCHES.items()}
    done = subprocess.run([sys.executable, "-c", _VERL], input=json.dumps(payload), capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", list(BATCHES))
def test_verl_names_equal_verl_0_9_1(name, verl_metrics):
    """Token TIS at 2 and seq_mean_k1 rejection at 0.999_1.001, as verl's own function computes them on
    the same float64 log-probs. Bound: verl's masked means divide by (count + 1e-8), a relative
    difference ≤ 1e-8 per mean, at most two nested: rel 3e-8, or 3e-8 absolute on an O(1) mean that a
    statistic subtracts 1 from (chi2)."""
    from mismatch.metrics import GEO_BOUNDS, IS_THRESHOLD, VERL_VERSION

    assert verl_metrics["version"] == VERL_VERSION and (IS_THRESHOLD, GEO_BOUNDS) == (2.0, (0.999, 1.001))
    rows, theirs = BATCHES[name], verl_metrics[name]
    ours = rollout_stats(*(torch.tensor(c, dtype=torch.float64) for c in list(zip(*rows))[1:]),
                         torch.tensor([s for s, _, _ in rows]))
    verl_named = [k for k in ours if k.startswith("rollout_corr/")]
    assert set(verl_named) <= set(theirs), set(verl_named) - set(theirs)
    for k in verl_named:
        assert ours[k] == pytest.approx(theirs[k], rel=3e-8, abs=3e-8), k
    if name == "edges":
        assert ours["rollout_corr/rollout_rs_seq_masked_fraction"] == theirs["rollout_corr/rollout_rs_seq_masked_fraction"]
        assert ours["rollout_corr/rollout_rs_seq_masked_fraction"] == 1 / 4


def test_identical_policies_give_the_neutral_values_exactly():
    lp = torch.tensor([-0.5, -1.0, -2.0, -0.1])
    got = rollout_stats(lp, lp.clone(), torch.tensor([0, 0, 1, 1]))
    assert got["rollout_corr/kl"] == 0.0 and got["rollout_corr/k3_kl"] == 0.0 and got["rollout_corr/chi2_token"] == 0.0
    assert got["rollout_corr/ppl_ratio"] == 1.0 and got["train/token_mult_prob_error"] == 1.0
    assert got["train/train_rollout_logprob_abs_diff"] == 0.0
    assert got["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0
    assert all(g.passes(got[g.metric]) for name in PRESETS for g in PRESETS[name])


def test_a_gate_admits_a_value_exactly_at_its_limit():
    from mismatch.admission.gates import Gate

    gate = Gate("rollout_corr/kl", 0.1, "test")
    assert gate.passes(0.1) and not gate.passes(0.1 + 1e-12) and gate.passes(-1.0)


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
