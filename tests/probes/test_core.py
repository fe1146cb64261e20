"""Probes against slow, obvious re-implementations; invariants; masks; bad input."""

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

import mismatch
from mismatch.errors import InputError, NumericsError, VocabMismatchError
from tests.conftest import random_ids

SUMMARY_KEYS = {"tokens", "kl_fwd_mean", "kl_fwd_p50", "kl_fwd_p90", "kl_fwd_p99", "kl_fwd_p999",
                "kl_fwd_max", "kl_rev_mean", "k3_mean", "tv_mean", "top1_agree", "logp_abs_diff_mean",
                "logp_abs_diff_max", "is_ratio_outside_frac", "seq_log_ratio_abs_mean", "ppl_cand_over_ref",
                "chi2_token", "is_ess", "dp_rms", "kl_fwd_p10", "kl_fwd_p1"}


# ---------------------------------------------------------------- slow reference implementation

def _family_modules(model):
    """Explicit, per-family module names: independent of mismatch.model.layout's discovery."""
    if hasattr(model, "transformer"):  # GPT-2
        t = model.transformer
        return [t.wte, *t.h, t.ln_f]
    m = model.model
    return [m.embed_tokens, *m.layers, m.norm]


def _slow_forward(model, ids_BT):
    """Plain batched forward (no padding): logits [B, T, V] in float64, hidden states per layer."""
    hidden = []
    hooks = [mod.register_forward_hook(lambda _m, _a, out: hidden.append(
        (out if torch.is_tensor(out) else out[0]).double())) for mod in _family_modules(model)]
    try:
        with torch.no_grad():
            logits = model(ids_BT).logits.double()
    finally:
        for h in hooks:
            h.remove()
    return logits, hidden


def slow_probe(ref_model, cand_model, ids_BT, scored, clip=2.0):
    """Loop over sequences and tokens with torch.distributions; ids_BT: unpadded [B, T] ids,
    scored: list of lists of scored positions per sequence."""
    rows, layer_acc = [], None
    lr_all, hr_all = _slow_forward(ref_model, ids_BT)
    lc_all, hc_all = _slow_forward(cand_model, ids_BT)
    for s, (ids, positions) in enumerate(zip(ids_BT, scored)):
        lr, lc = lr_all[s], lc_all[s]
        hr, hc = [h[s] for h in hr_all], [h[s] for h in hc_all]
        if layer_acc is None:
            layer_acc = [[[], []] for _ in hr]
        for t in positions:
            P = torch.distributions.Categorical(logits=lr[t - 1])
            Q = torch.distributions.Categorical(logits=lc[t - 1])
            y = ids[t]
            logp, logq = float(P.log_prob(y)), float(Q.log_prob(y))
            r = math.exp(logp - logq)
            rows.append({
                "seq": s, "pos": t, "token": int(y), "logp_ref": logp, "logp_cand": logq,
                "kl_fwd": float(torch.distributions.kl_divergence(P, Q)),
                "kl_rev": float(torch.distributions.kl_divergence(Q, P)),
                "tv": 0.5 * float(sum(abs(a - b) for a, b in zip(P.probs.tolist(), Q.probs.tolist()))),
                "top1_agree": int(P.probs.argmax()) == int(Q.probs.argmax()),
                "is_ratio": r, "k3": r - 1 - math.log(r),
            })
            for i, (a, b) in enumerate(zip(hr, hc)):
                layer_acc[i][0].append(a[t - 1])
                layer_acc[i][1].append(b[t - 1])
    layers = []
    for ref_h, cand_h in layer_acc:
        h, g = torch.stack(ref_h), torch.stack(cand_h)
        err2, ref2 = float(((g - h) ** 2).sum()), float((h ** 2).sum())
        cos = float(np.mean([float(a @ b / (a.norm() * b.norm())) for a, b in zip(g, h)]))
        layers.append({"rel_l2": math.sqrt(err2 / ref2), "cosine": cos,
                       "sqnr_db": math.inf if err2 == 0 else 10 * math.log10(ref2 / err2)})
    return rows, layers


def slow_summary(rows, clip=2.0):
    kl = np.array([r["kl_fwd"] for r in rows])
    lp = np.array([r["logp_ref"] for r in rows])
    lq = np.array([r["logp_cand"] for r in rows])
    r = np.array([x["is_ratio"] for x in rows])
    per_seq = {}
    for row in rows:
        per_seq[row["seq"]] = per_seq.get(row["seq"], 0.0) + (row["logp_ref"] - row["logp_cand"])
    w = r / r.mean()
    pct = lambda q: float(np.percentile(kl, q))  # noqa: E731  (linear interpolation)
    return {
        "tokens": len(rows), "kl_fwd_mean": kl.mean(), "kl_fwd_p1": pct(1), "kl_fwd_p10": pct(10),
        "kl_fwd_p50": pct(50), "kl_fwd_p90": pct(90), "kl_fwd_p99": pct(99), "kl_fwd_p999": pct(99.9),
        "kl_fwd_max": kl.max(), "kl_rev_mean": np.mean([x["kl_rev"] for x in rows]),
        "k3_mean": np.mean([x["k3"] for x in rows]), "tv_mean": np.mean([x["tv"] for x in rows]),
        "top1_agree": np.mean([x["top1_agree"] for x in rows]),
        "logp_abs_diff_mean": np.abs(lp - lq).mean(), "logp_abs_diff_max": np.abs(lp - lq).max(),
        "is_ratio_outside_frac": np.mean((r < 1 / clip) | (r > clip)),
        "seq_log_ratio_abs_mean": np.mean([abs(v) for v in per_seq.values()]),
        "ppl_cand_over_ref": math.exp(np.mean(-lq) - np.mean(-lp)),
        "chi2_token": np.mean(r ** 2) - 1, "is_ess": 1 / np.mean(w ** 2),
        "dp_rms": math.sqrt(np.mean((np.exp(lq) - np.exp(lp)) ** 2)),
    }


def _left_pad(seqs, pad=0):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):], attn[i, width - len(s):] = s, 1
    return ids, attn


# ---------------------------------------------------------------- the tests

@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
def test_every_column_and_summary_key_matches_slow_implementation(tiny, family):
    ref, cand = tiny(family, 0).model, tiny(family, 1).model
    # a mildly perturbed candidate too, so ratios near 1 and large KL are both exercised
    ids = random_ids(3, 10, seed=7)
    scored = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 9], [2, 3, 6, 7]]
    mask = torch.zeros_like(ids)
    for s, positions in enumerate(scored):
        mask[s, positions] = 1
    res = mismatch.probe(ref, cand, ids, response_mask=mask, chunk_tokens=5)
    rows, layers = slow_probe(ref, cand, ids, scored)

    got = res.per_token
    assert list(got.columns) == ["seq", "pos", "token", "logp_ref", "logp_cand", "kl_fwd", "kl_rev",
                                 "tv", "top1_agree", "is_ratio", "k3"]
    assert got[["seq", "pos", "token"]].values.tolist() == [[r["seq"], r["pos"], r["token"]] for r in rows]
    for col in ("logp_ref", "logp_cand", "kl_fwd", "kl_rev", "tv", "is_ratio", "k3"):
        np.testing.assert_allclose(got[col].to_numpy(), [r[col] for r in rows], rtol=1e-5, atol=1e-7,
                                   err_msg=col)
    assert got["top1_agree"].tolist() == [r["top1_agree"] for r in rows]

    expected = slow_summary(rows)
    assert SUMMARY_KEYS <= set(res.summary)
    for key, value in expected.items():
        assert res.summary[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key

    assert len(res.per_layer) == len(layers)
    for col in ("rel_l2", "cosine", "sqnr_db"):
        np.testing.assert_allclose(res.per_layer[col], [x[col] for x in layers], rtol=1e-5, err_msg=col)


def test_perturbed_copy_small_divergence_matches_slow(tiny):
    ref = tiny("tiny-qwen3").model
    cand = copy.deepcopy(ref)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in cand.parameters():
            p.add_(1e-2 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    ids = random_ids(2, 12, seed=5)
    res = mismatch.probe(ref, cand, ids)
    rows, _ = slow_probe(ref, cand, ids, [list(range(1, 12))] * 2)
    # fp32 log-probabilities carry ~5e-7 nats of rounding each, so per-token divergences this small
    # (~1e-3) are resolved to ~1e-6 nats absolute, not 1e-5 relative: the documented resolution.
    for col in ("kl_fwd", "kl_rev", "k3"):
        np.testing.assert_allclose(res.per_token[col], [r[col] for r in rows], rtol=1e-5, atol=1e-6,
                                   err_msg=col)
    np.testing.assert_allclose(res.per_token["tv"], [r["tv"] for r in rows], rtol=1e-5, atol=1e-7)
    assert 0 < res.summary["kl_fwd_mean"] < 0.1


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_identical_models_give_exact_zero(tiny, family):
    lm = tiny(family)
    ids, attn = _left_pad([random_ids(1, 11, seed=1)[0], random_ids(1, 5, seed=2)[0]])
    res = mismatch.probe(lm, lm, ids, attention_mask=attn)
    t = res.per_token
    for col in ("kl_fwd", "kl_rev", "tv", "k3"):
        assert (t[col] == 0).all(), col
    assert (t["is_ratio"] == 1).all() and t["top1_agree"].all()
    assert (t["logp_ref"] == t["logp_cand"]).all()
    s = res.summary
    for key in ("kl_fwd_mean", "kl_fwd_max", "kl_rev_mean", "k3_mean", "tv_mean", "logp_abs_diff_max",
                "is_ratio_outside_frac", "seq_log_ratio_abs_mean", "chi2_token", "dp_rms"):
        assert s[key] == 0.0, key
    assert s["top1_agree"] == 1.0 and s["ppl_cand_over_ref"] == 1.0 and s["is_ess"] == 1.0
    assert (res.per_layer["sqnr_db"] == math.inf).all()
    assert (res.per_layer["rel_l2"] == 0).all()
    np.testing.assert_allclose(res.per_layer["cosine"], 1.0, atol=1e-12)


def test_chunk_size_never_changes_a_result(tiny):
    # BLAS sums in a different order for different row counts (gemv for one row), so logits can
    # differ in the last fp32 bit between chunkings; every metric must agree to that rounding level,
    # which is far below the slow-implementation tolerance (rtol 1e-5).
    ref, cand = tiny("tiny-llama", 0), tiny("tiny-llama", 2)
    ids = random_ids(3, 20, seed=9)
    base = mismatch.probe(ref, cand, ids, chunk_tokens=10_000)
    for chunk in (1, 3, 7, 57, 64):
        res = mismatch.probe(ref, cand, ids, chunk_tokens=chunk)
        assert res.per_token[["seq", "pos", "token", "top1_agree"]].equals(
            base.per_token[["seq", "pos", "token", "top1_agree"]])
        for col in ("logp_ref", "logp_cand", "kl_fwd", "kl_rev", "tv", "is_ratio", "k3"):
            np.testing.assert_allclose(res.per_token[col], base.per_token[col], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{col} chunk={chunk}")
        for key, value in base.summary.items():
            assert res.summary[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # with identical models the result is exact for every chunk size
    for chunk in (1, 5, 64):
        same = mismatch.probe(ref, ref, ids, chunk_tokens=chunk, per_layer=False)
        assert same.summary["kl_fwd_max"] == 0 and same.summary["top1_agree"] == 1


def test_masks_that_score_nothing_are_a_clear_error(tiny):
    lm = tiny("tiny-llama")
    ids = random_ids(2, 6)
    with pytest.raises(InputError, match="no token to score"):
        mismatch.probe(lm, lm, ids, response_mask=torch.zeros_like(ids))
    with pytest.raises(InputError, match="no token to score"):  # one attended token per sequence
        mismatch.probe(lm, lm, ids, attention_mask=torch.tensor([[0, 0, 0, 0, 0, 1]] * 2))
    with pytest.raises(InputError, match="first"):  # the first token has no prediction
        mismatch.probe(lm, lm, ids, response_mask=torch.tensor([[1, 0, 0, 0, 0, 0]] * 2))
    with pytest.raises(InputError, match="padding"):
        mismatch.probe(lm, lm, ids, attention_mask=torch.tensor([[1, 1, 1, 0, 0, 0]] * 2),
                       response_mask=torch.tensor([[0, 0, 1, 1, 0, 0]] * 2))


def test_response_mask_selects_exactly_the_marked_tokens(tiny):
    ref, cand = tiny("tiny-gpt2", 0), tiny("tiny-gpt2", 1)
    ids = random_ids(2, 8, seed=4)
    mask = torch.zeros_like(ids)
    mask[0, [2, 5, 7]] = 1
    mask[1, [1, 3]] = 1
    res = mismatch.probe(ref, cand, ids, response_mask=mask)
    assert res.per_token[["seq", "pos"]].values.tolist() == [[0, 2], [0, 5], [0, 7], [1, 1], [1, 3]]
    full = mismatch.probe(ref, cand, ids).per_token.set_index(["seq", "pos"])
    sub = res.per_token.set_index(["seq", "pos"])
    np.testing.assert_allclose(sub["kl_fwd"], full.loc[sub.index, "kl_fwd"], rtol=1e-6)
    assert res.per_token["token"].tolist() == [int(ids[0, 2]), int(ids[0, 5]), int(ids[0, 7]),
                                                int(ids[1, 1]), int(ids[1, 3])]


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
def test_left_and_right_padding_change_no_number(tiny, family):
    ref, cand = tiny(family, 0), tiny(family, 1)
    seqs = [random_ids(1, n, seed=10 + n)[0] for n in (12, 5, 9)]
    left_ids, left_attn = _left_pad(seqs)
    right_ids = torch.zeros_like(left_ids)
    right_attn = torch.zeros_like(left_ids)
    for i, s in enumerate(seqs):
        right_ids[i, :len(s)], right_attn[i, :len(s)] = s, 1
    left = mismatch.probe(ref, cand, left_ids, attention_mask=left_attn).per_token
    right = mismatch.probe(ref, cand, right_ids, attention_mask=right_attn).per_token
    alone = [mismatch.probe(ref, cand, s.unsqueeze(0)).per_token.assign(seq=i) for i, s in enumerate(seqs)]
    expected = [[i, t, int(s[t])] for i, s in enumerate(seqs) for t in range(1, len(s))]
    assert left[["seq", "pos", "token"]].values.tolist() == expected
    assert right[["seq", "pos", "token"]].values.tolist() == expected
    alone_df = pd.concat(alone, ignore_index=True)
    for col in ("logp_ref", "logp_cand", "kl_fwd", "kl_rev", "tv", "is_ratio"):
        np.testing.assert_allclose(left[col], alone_df[col], rtol=1e-5, atol=1e-7, err_msg=col)
        np.testing.assert_allclose(right[col], alone_df[col], rtol=1e-5, atol=1e-7, err_msg=col)


def test_reference_is_computed_once_and_reused(tiny):
    ref_model = copy.deepcopy(tiny("tiny-llama", 0).model)
    calls = []
    ref_model.register_forward_hook(lambda *a: calls.append(1))
    ids = random_ids(2, 10, seed=8)
    ref = mismatch.reference(ref_model, ids)
    assert len(calls) == 1
    cands = [tiny("tiny-llama", 1).model, tiny("tiny-llama", 2).model]
    reused = [mismatch.probe(ref, c, ids) for c in cands]
    assert len(calls) == 1  # no second forward pass of the reference
    direct = [mismatch.probe(tiny("tiny-llama", 0).model, c, ids) for c in cands]
    for a, b in zip(reused, direct):
        assert a.per_token.equals(b.per_token)
        assert a.per_layer.equals(b.per_layer)
    # the Reference owns its head and hidden states: changing the model in place afterwards
    # (as an in-place perturbation does) leaves it intact
    with torch.no_grad():
        for p in ref_model.parameters():
            p.mul_(1.5)
    again = mismatch.probe(ref, cands[0], ids)
    assert again.per_token.equals(reused[0].per_token)


def test_reference_rejects_other_inputs(tiny):
    lm = tiny("tiny-llama")
    ids = random_ids(1, 6)
    ref = mismatch.reference(lm, ids, per_layer=False)
    with pytest.raises(InputError, match="differ"):
        mismatch.probe(ref, lm, ids + 1)
    with pytest.raises(InputError, match="per_layer"):
        mismatch.probe(ref, lm, ids, per_layer=True)


def _word_tokenizer(n):
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")


def test_vocab_mismatch_is_a_clear_error(tiny):
    lm = tiny("tiny-llama")
    other = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    ids = random_ids(1, 6)
    with pytest.raises(VocabMismatchError, match="259.*300"):
        mismatch.probe(lm, other, ids)
    same_size_other_tokens = mismatch.LM(tiny("tiny-llama", 1).model, _word_tokenizer(259), "word-level")
    with pytest.raises(VocabMismatchError, match="tokenizers"):
        mismatch.probe(lm, same_size_other_tokens, ids)


def test_bad_input_errors(tiny):
    lm = tiny("tiny-llama")  # context of 128 positions
    with pytest.raises(InputError, match="empty"):
        mismatch.probe(lm, lm, torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(InputError, match="empty"):
        mismatch.probe(lm, lm, torch.zeros((0, 4), dtype=torch.long))
    with pytest.raises(InputError, match="longer than .*context of 128"):
        mismatch.probe(lm, lm, random_ids(1, 129))
    # padding does not count towards the length: 128 real tokens after 10 pads are fine
    ids = torch.cat([torch.zeros(1, 10, dtype=torch.long), random_ids(1, 128)], dim=1)
    attn = (torch.arange(138) >= 10).long().unsqueeze(0)
    assert mismatch.probe(lm, lm, ids, attention_mask=attn, per_layer=False).summary["tokens"] == 127
    with pytest.raises(InputError, match="vocabulary has 259"):
        mismatch.probe(lm, lm, torch.tensor([[5, 300]]))
    with pytest.raises(InputError, match="only 0 and 1"):
        mismatch.probe(lm, lm, random_ids(1, 4), attention_mask=torch.tensor([[1, 2, 1, 1]]))
    with pytest.raises(InputError, match="integer"):
        mismatch.probe(lm, lm, torch.ones(1, 4))


def test_nan_logits_are_reported_with_their_position(tiny):
    lm = tiny("tiny-gpt2")
    broken = copy.deepcopy(lm.model)
    with torch.no_grad():
        broken.transformer.h[1].mlp.c_proj.weight[0, 0] = float("nan")
    with pytest.raises(NumericsError, match=r"candidate .*NaN/Inf.*seq 0, pos 1"):
        mismatch.probe(lm, broken, random_ids(2, 5))


def test_per_layer_needs_matching_structure(tiny):
    ids = random_ids(1, 6)
    with pytest.raises(InputError, match="per_layer=False"):
        mismatch.probe(tiny("tiny-llama"), tiny("tiny-qwen3"), ids)
    res = mismatch.probe(tiny("tiny-llama"), tiny("tiny-qwen3"), ids, per_layer=False)
    assert res.per_layer.empty and res.summary["tokens"] == 5


def test_layer_names_and_hooks_removed(tiny):
    lm = tiny("tiny-llama")
    res = mismatch.probe(lm, lm, random_ids(1, 5))
    assert res.per_layer["layer"].tolist() == ["embed", "layers.0", "layers.1", "layers.2", "final_norm"]
    assert res.per_layer["index"].tolist() == [0, 1, 2, 3, 4]
    for module in lm.model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_cached_reference_logprobs_give_the_same_result(tiny):
    ref_lm, cand = tiny("tiny-llama", 0), tiny("tiny-llama", 3)
    ids = random_ids(3, 17, seed=2)
    plain = mismatch.probe(mismatch.reference(ref_lm, ids), cand, per_layer=False)
    cached_ref = mismatch.reference(ref_lm, ids, cache_logprobs=True, chunk_tokens=7)
    assert cached_ref.logp.shape == (48, 259)
    cached = mismatch.probe(cached_ref, cand, per_layer=False)
    for col in ("logp_ref", "logp_cand", "kl_fwd", "kl_rev", "tv", "is_ratio", "k3"):
        np.testing.assert_allclose(cached.per_token[col], plain.per_token[col], rtol=1e-5, atol=1e-7, err_msg=col)
    assert cached.per_token["top1_agree"].equals(plain.per_token["top1_agree"])
    again = mismatch.probe(cached_ref, cand, per_layer=False)  # the cache is not consumed
    assert again.per_token.equals(cached.per_token)
    # identical model, same head chunking as the cache: exactly zero
    assert mismatch.probe(cached_ref, ref_lm, per_layer=False, chunk_tokens=7).summary["kl_fwd_max"] == 0


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_isolation_prefix_replay_is_bit_identical_and_skips_unchanged_blocks(tiny, family):
    model = copy.deepcopy(tiny(family).model)
    ids = random_ids(3, 21, seed=5)
    attn = torch.ones_like(ids)
    attn[0, :4] = 0  # left padding: the replay must carry masks and positions too
    plain_ref = mismatch.reference(model, ids, attn, per_layer=True)
    replay_ref = mismatch.reference(model, ids, attn, per_layer=True, keep_block_outputs=True)
    n = len(model.model.layers if hasattr(model, "model") else model.transformer.h)
    assert len(replay_ref.block_outputs) == n and replay_ref.block_outputs[0].shape == (3, 21, 64)
    calls = [0] * n
    blocks = model.model.layers if hasattr(model, "model") else model.transformer.h
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda *_a, i=i: calls.__setitem__(i, calls[i] + 1))
    replay_ref.block_states = mismatch.probes.core._block_states(mismatch.model.layout.model_layout(model))  # with our hooks
    for i in range(n):
        calls[:] = [0] * n
        with mismatch.perturbed(model, "int4:group128", layers=str(i)) as cand:
            full = mismatch.probe(plain_ref, cand, per_layer=True)
            assert calls == [1] * n
            calls[:] = [0] * n
            fast = mismatch.probe(replay_ref, cand, per_layer=True)
            assert calls == [0] * i + [1] * (n - i)  # blocks before i replayed, not run
        assert fast.per_token.equals(full.per_token)
        assert fast.per_layer.equals(full.per_layer)
        assert full.summary["kl_fwd_mean"] > 0
        rows = fast.per_layer.set_index("layer")
        assert all(rows.loc[f"layers.{j}", "rel_l2"] == 0 for j in range(i))
        assert rows.loc[f"layers.{i}", "rel_l2"] > 0
    # an in-place edit of block 0 (an optimizer step, say) is detected: nothing is replayed
    calls[:] = [0] * n
    with torch.no_grad():
        next(blocks[0].mlp.parameters()).mul_(1.01)  # (q_proj would vanish under Qwen3's q_norm)
    changed = mismatch.probe(replay_ref, model, per_layer=False)
    assert calls == [1] * n and changed.summary["kl_fwd_mean"] > 0
    # another model object (an equal copy) never replays: its blocks all run
    other = copy.deepcopy(tiny(family).model)
    ran = []
    for block in (other.model.layers if hasattr(other, "model") else other.transformer.h):
        block.register_forward_pre_hook(lambda *_a: ran.append(1))
    mismatch.probe(replay_ref, other, per_layer=False)
    assert len(ran) == n


# ---------------------------------------------------------------- MoE routing


def _slow_expert_sets(model, ids_BT):
    """Each MoE block's top-k expert set per token `[B*T, k]` (sorted ids), from the router's input and
    weight directly: topk(W_router · h), with no padding, through hooks on `mlp.gate` only."""
    inputs = {}
    hooks = [layer.mlp.gate.register_forward_pre_hook(lambda _m, args, i=i: inputs.__setitem__(i, args[0]))
             for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(ids_BT)
    finally:
        for h in hooks:
            h.remove()
    k = model.config.num_experts_per_tok
    logits = {i: torch.nn.functional.linear(x, model.model.layers[i].mlp.gate.weight) for i, x in inputs.items()}
    return {i: torch.topk(z, k).indices.sort(-1).values for i, z in logits.items()}


def _slow_agreement(ref_sets, cand_sets, B, T):
    """Share of scored tokens (every token after the first; predicted from position t-1) whose expert
    set at the predicting position is the same: a count over tokens divided by their number."""
    rows = [b * T + t for b in range(B) for t in range(T - 1)]
    return {i: sum(bool(torch.equal(ref_sets[i][r], cand_sets[i][r])) for r in rows) / len(rows) for i in ref_sets}


@pytest.mark.parametrize("family", ["tiny-qwen3-moe", "tiny-mixtral"])
def test_router_topk_agree_equals_a_direct_computation_of_the_top_k_sets(tiny, family):
    model = mismatch.load(family).model  # a private copy: perturbed in place below
    ids = random_ids(3, 20, seed=11)
    ref = mismatch.reference(model, ids, keep_block_outputs=True)
    same = mismatch.probe(ref, model).per_layer.set_index("layer")["router_topk_agree"]
    assert same["layers.0"] == 1.0 and same["layers.1"] == 1.0  # identical models: exactly 1
    assert math.isnan(same["embed"]) and math.isnan(same["final_norm"])  # no router there
    ref_sets = _slow_expert_sets(model, ids)
    flips = {}
    for spec, layers in [("int4:group32", "linear"), ("noise:0.1", "1"), ("int4:channel", "router")]:
        with mismatch.perturbed(model, spec, layers=layers) as cand:
            got = mismatch.probe(ref, cand).per_layer.set_index("layer")["router_topk_agree"]
            expected = _slow_agreement(ref_sets, _slow_expert_sets(cand, ids), 3, 20)
        # the same count over the same tokens: equal exactly (block 0 under scope "1" is replayed, not run)
        assert [got["layers.0"], got["layers.1"]] == [expected[0], expected[1]], (spec, layers)
        flips[spec] = expected
    assert flips["int4:group32"][1] < 1.0  # int4 everywhere flips some routing: the check is not vacuous
    assert flips["noise:0.1"][0] == 1.0  # block 0 untouched by scope "1"


def test_router_rows_are_stored_only_for_moe_layers(tiny):
    from mismatch.probes.runs import rows_of

    moe, dense = tiny("tiny-qwen3-moe"), tiny("tiny-llama")
    ids = random_ids(2, 9)
    moe_rows = rows_of(mismatch.probe(moe, moe, ids))
    router = moe_rows[moe_rows["metric"] == "router_topk_agree"]
    assert router["layer"].tolist() == ["layers.0", "layers.1"] and (router["value"] == 1.0).all()
    dense_rows = rows_of(mismatch.probe(dense, dense, ids))
    assert "router_topk_agree" not in set(dense_rows["metric"])
    assert mismatch.probe(dense, dense, ids).per_layer["router_topk_agree"].isna().all()


def test_an_unknown_logit_post_processing_fails_loudly(tiny):
    """A model whose forward rescales its logits in a way the head map does not know (an architecture
    mismatch has never seen): the probe stops with one error instead of scoring the head's plain
    logits (which would give silently wrong divergences)."""
    lm = mismatch.load("tiny-llama")
    plain = type(lm.model)

    class RescaledLogits(plain):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 1.7
            return out

    ids = random_ids(2, 8, seed=9)
    lm.model.__class__ = RescaledLogits
    for ref, cand in ((lm.model, tiny("tiny-llama").model), (tiny("tiny-llama").model, lm.model)):
        with pytest.raises(mismatch.InputError, match="post-processes logits"):
            mismatch.probe(ref, cand, ids)
    lm.model.__class__ = plain
    assert mismatch.probe(lm.model, tiny("tiny-llama").model, ids).summary["kl_fwd_max"] == 0.0
