"""`score_rollouts`: an engine's dump scored against a checkpoint, checked against plain recomputations.

The "engine" is a real perturbed copy of a tiny Llama (noise on its weights) whose sampled tokens and
log-probs are written in each engine's output shape; the trainer is the unperturbed model.
"""

from mismatch.admission import CalibrationSettings, Pipeline  # noqa: F401
import copy
import json
import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.cli.app import app
from mismatch.dumps import DumpRecord, read_rollouts, score_rollouts, write_rollouts
from mismatch.errors import InputError, VocabMismatchError
from mismatch.model.loader import LM
from mismatch.model.generate import sample
from mismatch.model.tokenizer import vocab_fingerprint

PROMPTS = ["hello there", "abc", "the quick brown fox", "2+2="]
TOPK = 5


def _full_logp(model, ids):
    """`[T-1, V]` float64 log-probs predicting tokens 1.. of one unpadded sequence, by a plain forward."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, :-1].double().log_softmax(-1)


@pytest.fixture(scope="module")
def engine():
    """(lm, records): tiny-llama and rollouts sampled by its noisy copy, with exact top-k log-probs."""
    lm = mismatch.load("tiny-llama")
    with mismatch.perturbed(lm.model, "noise:0.3", seed=3) as cand:
        ro = sample(LM(cand, lm.tokenizer, "engine"), PROMPTS, max_new_tokens=10, seed=3)
        records = []
        for b in range(len(PROMPTS)):
            attn, resp = ro.batch.attention_mask[b].bool(), ro.batch.response_mask[b].bool()
            ids = ro.batch.input_ids[b]
            prompt, response = ids[attn & ~resp].tolist(), ids[resp].tolist()
            logq = _full_logp(cand, prompt + response)[len(prompt) - 1:]
            top = []
            for t, lq in enumerate(logq):
                best = lq.topk(TOPK).indices.tolist()
                top.append({i: float(lq[i]) for i in dict.fromkeys(best + [response[t]])})
            assert [top[t][y] for t, y in enumerate(response)] == pytest.approx(ro.logprobs[b][resp].tolist(), abs=1e-5)
            records.append(DumpRecord(tuple(prompt), tuple(response), tuple(top[t][y] for t, y in enumerate(response)),
                                         tuple(top), lm.tokenizer.decode(response, skip_special_tokens=True)))
    return lm, records


def _as_vllm(r):
    return {"prompt_token_ids": list(r.prompt_ids), "outputs": [{
        "index": 0, "text": r.text, "token_ids": list(r.response_ids),
        "logprobs": [{str(k): {"logprob": v, "rank": None, "decoded_token": None} for k, v in top.items()}
                     for top in r.top_logprobs]}]}


def _as_sglang(r):
    return {"input_ids": list(r.prompt_ids), "text": r.text, "meta_info": {
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(r.logprobs, r.response_ids)],
        "output_top_logprobs": [[[v, k, None] for k, v in top.items()] for top in r.top_logprobs]}}


def _as_openai(r):
    return {"prompt_token_ids": list(r.prompt_ids), "choices": [{
        "index": 0, "message": {"role": "assistant", "content": r.text},
        "logprobs": {"content": [
            {"token": f"token_id:{t}", "logprob": lp,
             "top_logprobs": [{"token": f"token_id:{k}", "logprob": v} for k, v in top.items()]}
            for t, lp, top in zip(r.response_ids, r.logprobs, r.top_logprobs)]}}]}


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_statistics_equal_a_plain_recomputation(engine, tmp_path):
    lm, records = engine
    got = score_rollouts(lm, write_rollouts(tmp_path / "d.jsonl", records))
    tok = got.per_token
    logp_train, logq, seqs = [], [], []
    for s, r in enumerate(records):  # each record alone, full logits, float64
        logp = _full_logp(lm.model, list(r.prompt_ids + r.response_ids))[len(r.prompt_ids) - 1:]
        logp_train += logp.gather(-1, torch.tensor(r.response_ids)[:, None]).squeeze(-1).tolist()
        logq += list(r.logprobs)
        seqs += [s] * len(r.response_ids)
    assert tok["logp_ref"].tolist() == pytest.approx(logp_train, abs=2e-5)
    assert tok["logp_cand"].tolist() == pytest.approx(logq, abs=1e-6)
    assert tok["seq"].tolist() == seqs
    log_r = [a - b for a, b in zip(tok["logp_ref"], tok["logp_cand"])]  # plain Python from here on
    n = len(log_r)
    s = got.summary
    assert s["tokens"] == n and s["sequences"] == len(records)
    assert s["mismatch_kl"] == pytest.approx(sum(-x for x in log_r) / n, rel=1e-9)
    assert s["k3_mean"] == pytest.approx(sum(math.exp(x) - 1 - x for x in log_r) / n, rel=1e-9)
    assert s["chi2_token"] == pytest.approx(sum(math.exp(2 * x) for x in log_r) / n - 1, rel=1e-9)
    per_seq = [[x for x, q in zip(log_r, seqs) if q == k] for k in range(len(records))]
    assert s["seq_log_ratio_abs_mean"] == pytest.approx(sum(abs(sum(v)) for v in per_seq) / len(per_seq), rel=1e-9)
    assert s["train/train_rollout_logprob_abs_diff"] == pytest.approx(
        sum(sum(abs(x) for x in v) / len(v) for v in per_seq) / len(per_seq), rel=1e-9)
    assert s["train/token_mult_prob_error"] == pytest.approx(sum(math.exp(abs(x)) for x in log_r) / n, rel=1e-9)
    assert s["rollout_corr/kl"] == s["mismatch_kl"] > 0.05  # a real mismatch was measured


def test_the_trainer_side_in_bf16_is_the_bf16_model_teacher_forced(engine, tmp_path):
    """`ref_dtype="bf16"` loads the checkpoint as a bf16 trainer runs it: its log-probs are the bf16 model's own
    (a plain forward of that model, one record at a time as scored here), not the fp32 model's."""
    _, records = engine
    path = write_rollouts(tmp_path / "d.jsonl", records)
    got = score_rollouts("tiny-llama", path, ref_dtype="bf16", device="cpu", batch_tokens=1).per_token["logp_ref"]
    bf16, fp32 = mismatch.load("tiny-llama", dtype="bf16").model, mismatch.load("tiny-llama").model
    want, bound, off32 = [], [], []
    for r in records:
        ids = list(r.prompt_ids + r.response_ids)
        y = torch.tensor(r.response_ids)[:, None]
        with torch.no_grad():
            z = bf16(input_ids=torch.tensor([ids])).logits[0, :-1][len(r.prompt_ids) - 1:].double()
        want += z.log_softmax(-1).gather(-1, y).squeeze(-1).tolist()
        # the plain forward rounds its logits to bf16 (the scorer's head keeps them in fp32): each logit moves by
        # at most half a bf16 ulp, 2^-9 |z|, so log p(y) = z_y - logsumexp(z) by at most 2 · 2^-9 · max |z|
        bound += (2 * 2.0 ** -9 * z.abs().amax(-1)).tolist()
        off32 += _full_logp(fp32, ids)[len(r.prompt_ids) - 1:].gather(-1, y).squeeze(-1).tolist()
    gap = [abs(a - b) for a, b in zip(got, want)]
    assert all(g <= b + 1e-6 for g, b in zip(gap, bound)), max(g - b for g, b in zip(gap, bound))
    assert max(abs(a - b) for a, b in zip(got, off32)) > max(gap)  # the fp32 model is another trainer


def test_every_engine_shape_gives_the_same_numbers(engine, tmp_path):
    lm, records = engine
    ours = score_rollouts(lm, write_rollouts(tmp_path / "d.parquet", records, {"engine": "noisy torch"}))
    for name, shape in (("vllm", _as_vllm), ("sglang", _as_sglang), ("openai", _as_openai)):
        got = score_rollouts(lm, _jsonl(tmp_path / f"{name}.jsonl", [shape(r) for r in records]))
        assert name in got.candidate
        pd.testing.assert_frame_equal(got.per_token, ours.per_token, check_exact=True)
        assert got.summary == ours.summary


def _full_kls(trainer, engine_model, records):
    """Per response token (KL(p‖q), KL(q‖p)) over the whole vocabulary, float64, `[N, 2]`."""
    out = []
    for r in records:
        ids = list(r.prompt_ids + r.response_ids)
        lp = _full_logp(trainer, ids)[len(r.prompt_ids) - 1:]
        lq = _full_logp(engine_model, ids)[len(r.prompt_ids) - 1:]
        out += list(zip((lp.exp() * (lp - lq)).sum(-1).tolist(), (lq.exp() * (lq - lp)).sum(-1).tolist()))
    return torch.tensor(out)


def _kl_shift_bound(trainer, engine_model, records, delta):
    """Per response token, how far KL(p‖q) and KL(q‖p) can move when every log p is off by at most
    `delta` nats (q fixed): with p' = p·e^δ, |δ| ≤ Δ, |Σ p'(lp' − lq) − Σ p(lp − lq)| ≤
    Δ·e^Δ·(1 + E_p|lp − lq|), and the same with E_q for the reverse KL. `[N, 2]`."""
    out = []
    for r in records:
        ids = list(r.prompt_ids + r.response_ids)
        lp = _full_logp(trainer, ids)[len(r.prompt_ids) - 1:]
        lq = _full_logp(engine_model, ids)[len(r.prompt_ids) - 1:]
        gap = (lp - lq).abs()
        out += list(zip((1 + (lp.exp() * gap).sum(-1)).tolist(), (1 + (lq.exp() * gap).sum(-1)).tolist()))
    return torch.tensor(out) * delta * math.exp(delta)


# The scorer's trainer log-probs come from one padded batch and a chunked fp32 head; the test's from a
# single-sequence forward in float64 log-softmax. They agree within LOGP_TOL nats on every token (the bound
# test_statistics_equal_a_plain_recomputation asserts on the sampled ones: fp32 rounding of logits of
# magnitude ≲ 10 over differently shaped GEMMs, a few ulps of 10 ≈ 1e-6, with margin for other kernels).
LOGP_TOL = 2e-5


def test_truncated_kl_is_a_lower_bound_and_exact_on_the_full_vocabulary(engine, tmp_path):
    lm, records = engine
    got = score_rollouts(lm, write_rollouts(tmp_path / "k.jsonl", records)).per_token
    engine_model = copy.deepcopy(lm.model)  # the engine's full distribution, again
    with mismatch.perturbed(engine_model, "noise:0.3", seed=3) as cand:
        kl_fwd, kl_rev = _full_kls(lm.model, cand, records).T
        slack_fwd, slack_rev = _kl_shift_bound(lm.model, cand, records, LOGP_TOL).T
        assert (torch.tensor(got["kl_fwd_topk"].to_numpy()) <= kl_fwd + slack_fwd).all()
        assert (torch.tensor(got["kl_rev_topk"].to_numpy()) <= kl_rev + slack_rev).all()
        assert (got["kl_rev_topk"] > 0).all() and (got["topk"] >= TOPK).all()
        every = []  # now list every token of the vocabulary: the coarsening is the identity
        for r in records:
            lq = _full_logp(cand, list(r.prompt_ids + r.response_ids))[len(r.prompt_ids) - 1:]
            every.append(DumpRecord(r.prompt_ids, r.response_ids, r.logprobs,
                                       tuple(dict(enumerate(row.tolist())) for row in lq)))
    exact = score_rollouts(lm, write_rollouts(tmp_path / "all.parquet", every)).per_token
    assert (exact["topk"] == len(lm.tokenizer)).all()
    # the same float64 sum over the vocabulary on both sides: only the trainer's log-probs differ
    assert ((torch.tensor(exact["kl_fwd_topk"].to_numpy()) - kl_fwd).abs() <= slack_fwd).all()
    assert ((torch.tensor(exact["kl_rev_topk"].to_numpy()) - kl_rev).abs() <= slack_rev).all()


def test_a_listing_of_the_whole_vocabulary_has_no_rest_outcome():
    """Every token listed: p's fp32 mass falls short of 1 by rounding (here 7e-8, as a scorer's does)
    while q's top token is one p rates 5.5e-6. That residue is no outcome: merged into q's top token
    it would change p there by 1.3% (the 9e-4-nat error seen on AVX-512 and scalar kernels)."""
    from mismatch.dumps.score import coarse_kl

    g = torch.Generator().manual_seed(1)
    V = 64
    zp, zq = torch.randn(V, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64)
    zq[5] = 12.0  # q's top token, where p has little mass
    zp[5] = -12.0 + float(zp.logsumexp(-1))
    lp, lq = zp.log_softmax(-1), zq.log_softmax(-1)
    lp = lp + math.log1p(-7e-8)  # the listed mass of p is 1 − 7e-8
    full_pq = float((lp.exp() * (lp - lq)).sum())
    full_qp = float((lq.exp() * (lq - lp)).sum())
    kl_pq, kl_qp, mass = coarse_kl(lp[None], lq[None], torch.ones(1, V, dtype=torch.bool), vocab_size=V)
    assert float(kl_pq) == pytest.approx(full_pq, rel=1e-12) and float(kl_qp) == pytest.approx(full_qp, rel=1e-12)
    _, merged, _ = coarse_kl(lp[None], lq[None], torch.ones(1, V, dtype=torch.bool))  # V not known: merged
    assert abs(float(merged) - full_qp) > 1e-3  # q(5) ≈ 1 weighs log p(5), off by log 1.012: the defect


def test_truncated_kl_stays_a_lower_bound_when_a_listed_mass_rounds_to_one():
    """A confident model's fp32 log-probs of its top tokens can sum to ≥ 1: its rest mass is then a
    rounding residue (0 after clamping) while the other side's is not. The coarse KL must still be
    ≤ the full one, computed here over every token in float64."""
    from mismatch.dumps.score import coarse_kl

    g = torch.Generator().manual_seed(0)
    for peak_p, peak_q in ((25.0, 9.0), (9.0, 25.0), (40.0, 3.0)):
        zp, zq = torch.randn(259, generator=g), torch.randn(259, generator=g, dtype=torch.float64)
        zp[7], zq[7] = peak_p, peak_q
        lp, lq = torch.log_softmax(zp, -1), torch.log_softmax(zq, -1)  # fp32 trainer, as the scorer's
        full_pq = float((lp.double().exp() * (lp.double() - lq)).sum())
        full_qp = float((lq.exp() * (lq - lp.double())).sum())
        for k in (1, 2, 5):
            top = lq.topk(k).indices
            kl_pq, kl_qp, mass = coarse_kl(lp[top][None], lq[top][None], torch.ones(1, k, dtype=torch.bool))
            assert 0 <= float(kl_pq) <= full_pq + 1e-9 and 0 <= float(kl_qp) <= full_qp + 1e-9, (peak_p, peak_q, k)
            assert float(mass) == pytest.approx(float(lq[top].exp().sum()), rel=1e-12)
    one = torch.ones(1, 2, dtype=torch.bool)  # the engine's listed mass 1 + 4e-8 against a trainer 1% elsewhere
    kl_pq, _, _ = coarse_kl(torch.tensor([[-0.01, -5.0]]), torch.tensor([[0.0, -17.0]]), one)
    p = [math.exp(-0.01), math.exp(-5.0)]
    q = [1.0, math.exp(-17.0)]
    merged = (p[0] + 1 - sum(p)) * math.log((p[0] + 1 - sum(p)) / q[0]) + p[1] * math.log(p[1] / q[1])
    assert float(kl_pq) == pytest.approx(merged, rel=1e-9)  # the rest merged into the top token


def test_the_check_on_a_dump_of_its_own_calibration_gives_its_numbers(tmp_path):
    lm = mismatch.load("tiny-llama")
    direct = mismatch.check(lm, "noise:0.3", calibration=CalibrationSettings(prompts=PROMPTS, max_new_tokens=12), thresholds={"mismatch_kl": 10.0}, seed=3, presets=("slime",))
    with mismatch.perturbed(lm.model, "noise:0.3", seed=3) as cand:  # the check's calibration, sampled again
        ro = sample(LM(cand, lm.tokenizer, "engine"), PROMPTS, max_new_tokens=12, seed=3)
    records = [DumpRecord(tuple(ids[a & ~m].tolist()), tuple(ids[m].tolist()), tuple(lp[m].tolist()))
               for ids, a, m, lp in zip(ro.batch.input_ids, ro.batch.attention_mask.bool(),
                                        ro.batch.response_mask.bool(), ro.logprobs)]
    dumped = mismatch.check(lm, None, dump=write_rollouts(tmp_path / "cal.jsonl", records),
                            thresholds={"mismatch_kl": 10.0}, seed=3, presets=("slime",))
    assert dumped.calibration["tokens"] == direct.calibration["tokens"]
    for a, b in zip(dumped.decisions, direct.decisions):
        assert (a.metric, a.status) == (b.metric, b.status)
        assert a.value == pytest.approx(b.value, rel=1e-4)
        assert (a.low, a.high) == pytest.approx((b.low, b.high), rel=1e-4)
    assert dumped.from_dump and dumped.recipe is None and dumped.cost is None


def _one(**change):
    rec = {"prompt_token_ids": [1, 72, 73], "response_token_ids": [74, 75], "response_logprobs": [-0.5, -1.0]}
    rec.update(change)
    return rec


@pytest.mark.parametrize("record, message", [
    (_one(response_token_ids=[74, 900]), "token id 900 is outside tiny-llama's vocabulary of 259"),
    (_one(response_logprobs=[-0.5, 0.3]), "log-prob at response position 1 is 0.3"),
    (_one(response_logprobs=[-0.5, float("nan")]), "log-prob at response position 1 is nan"),
    (_one(response_logprobs=[-0.5]), "2 response tokens but 1 log-probs"),
    (_one(token_ids=[1, 72, 74, 75]), "not its prompt followed by its response"),
    (_one(prompt_token_ids=[]), "no prompt token ids"),
    (_one(response_text="zz"), "another tokenizer?"),
    (_one(prompt_token_ids=[1] * 200), "longer than tiny-llama's context of 128"),
    ({"prompt_token_ids": [1, 72], "outputs": [{"token_ids": [74], "logprobs": [{"75": -0.1}]}]},
     "lack the sampled token 74"),
    ({"prompt_token_ids": [1], "choices": [{"message": {"content": "x"}}]}, "no logprobs.content"),
    ({"foo": 1}, "not a rollout record"),
    (_one(response_token_ids=[74, float("inf")]), "response token id inf is not a token id"),
    (_one(response_logprobs=[-0.5, -10 ** 400]), "not a number"),
    ({"input_ids": [1, 72], "meta_info": {"output_token_logprobs": [[-0.1, 74, None]], "output_top_logprobs": [
        [[-0.1, 74, None], [-2.5, 80, None], [-9.0, 80, None]]]}}, "token 80 is listed twice at response position 0"),
    (_one(response_text="ab a different continuation"), "another tokenizer?"),
    ({"input_ids": [1], "meta_info": {"output_token_logprobs": None}}, "malformed record (TypeError"),
    ({"prompt_token_ids": [1], "choices": [{"logprobs": {"content": [{"logprob": -1.0}]}}]}, "malformed record (KeyError"),
])
def test_bad_records_are_one_line_errors_naming_the_record(tiny, tmp_path, record, message):
    lm = tiny("tiny-llama")
    path = _jsonl(tmp_path / "bad.jsonl", [_one(), record])
    with pytest.raises(InputError) as err:
        score_rollouts(lm, path)
    text = str(err.value)
    assert message in text and "\n" not in text
    assert "record 1 (line 2" in text


def test_tokenizer_mismatch_from_the_metadata_and_missing_files(tiny, tmp_path):
    lm = tiny("tiny-llama")
    rows = [{"meta": {"vocab_fingerprint": "0" * 64}}, _one()]
    with pytest.raises(VocabMismatchError, match="another tokenizer"):
        score_rollouts(lm, _jsonl(tmp_path / "m.jsonl", rows))
    rows[0] = {"meta": {"vocab_fingerprint": vocab_fingerprint(lm.tokenizer), "vocab_size": 259}}
    assert score_rollouts(lm, _jsonl(tmp_path / "ok.jsonl", rows)).summary["tokens"] == 2
    with pytest.raises(InputError, match="rollouts file not found"):
        score_rollouts(lm, tmp_path / "missing.jsonl")
    (tmp_path / "broken.jsonl").write_text(json.dumps(_one()) + "\n{not json\n")
    with pytest.raises(InputError, match="line 2 is not valid JSON"):
        read_rollouts(tmp_path / "broken.jsonl")


def test_openai_token_strings_map_through_the_tokenizer(tiny, tmp_path):
    lm = tiny("tiny-llama")
    ids = lm.tokenizer("hi!", add_special_tokens=False)["input_ids"]
    rec = {"prompt_token_ids": [1, 72], "choices": [{"message": {"content": "hi!"}, "logprobs": {"content": [
        {"token": lm.tokenizer.decode([t]), "logprob": -0.25, "top_logprobs": []} for t in ids]}}]}
    dump = read_rollouts(_jsonl(tmp_path / "o.jsonl", [rec]), lm.tokenizer)
    assert dump.records[0].response_ids == tuple(ids) and dump.shapes == ("openai",)
    rec["choices"][0]["logprobs"]["content"][0]["token"] = "\ufffd"  # every byte ≥ 0x80 decodes to U+FFFD alone
    with pytest.raises(InputError, match="decodes from 128 tokens"):
        read_rollouts(_jsonl(tmp_path / "amb.jsonl", [rec]), lm.tokenizer)


def test_cli_prints_the_summary_and_writes_the_per_token_table(engine, tmp_path):
    lm, records = engine
    path = write_rollouts(tmp_path / "d.jsonl", records)
    res = CliRunner().invoke(app, ["score-rollouts", "tiny-llama", str(path), "--json", "--out", str(tmp_path / "t.parquet")])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout[res.stdout.index("{"):])
    want = score_rollouts(lm, path)
    assert {k: printed[k] for k in want.summary} == pytest.approx(want.summary, rel=1e-12)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), want.per_token)
    bad = CliRunner().invoke(app, ["score-rollouts", "tiny-llama", str(tmp_path / "none.jsonl")])
    assert bad.exit_code == 2 and bad.output.strip().count("\n") == 0 and "not found" in bad.output
    wrong = CliRunner().invoke(app, ["score-rollouts", "tiny-llama", str(path), "--out", str(tmp_path / "t.txt")])
    assert wrong.exit_code == 2 and "must end in .parquet or .csv" in wrong.output
    assert not (tmp_path / "t.txt").exists()


def test_without_the_llama_cpp_extra_an_engine_is_a_one_line_error(tiny, monkeypatch):
    import sys

    from mismatch.rollout.llamacpp import open_engine

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as on a machine without the extra
    with pytest.raises(mismatch.ModelNotAvailableError, match=r"llama.cpp is not installed: `make engines`"):
        open_engine(tiny("tiny-llama"))


def test_the_text_check_takes_a_cut_text_and_a_leading_space_but_not_another_text(tiny):
    """The engine's text may be cut by a stop string or start with the space a SentencePiece decoder
    drops from a response decoded alone; text that goes on past the ids, or any text for an
    EOS-only response, is another tokenizer's."""
    from mismatch.dumps.formats import EngineDump
    from mismatch.dumps.score import check_dump

    lm = tiny("tiny-llama")
    ids = tuple(lm.tokenizer("hello world", add_special_tokens=False)["input_ids"])
    eos = lm.tokenizer.eos_token_id

    def check(response, text):
        r = DumpRecord((1, 72), response, (-0.1,) * len(response), text=text, where="record 0")
        check_dump(EngineDump((r,), "mem", ("mismatch",)), lm)

    for text in ("hello world", "hello wo", " hello world", ""):
        check(ids, text)
    check((eos,), lm.tokenizer.decode([eos]))  # an engine that prints special tokens
    for response, text in ((ids, "hello world and more"), ((eos,), "a whole paragraph"), (ids, "goodbye")):
        with pytest.raises(VocabMismatchError, match="another tokenizer"):
            check(response, text)


def test_parquet_keeps_what_jsonl_keeps(engine, tmp_path):
    """The first record's fields do not decide the columns, and `{id: logprob}` maps (stored by
    parquet as structs over every id of the column) read back as the maps they were."""
    lm, records = engine
    mixed = [DumpRecord(records[0].prompt_ids, records[0].response_ids, records[0].logprobs), *records[1:]]
    jsonl = read_rollouts(write_rollouts(tmp_path / "m.jsonl", mixed)).records
    parquet = read_rollouts(write_rollouts(tmp_path / "m.parquet", mixed)).records
    assert [(r.top_logprobs, r.text) for r in parquet] == [(r.top_logprobs, r.text) for r in jsonl]
    assert parquet[1].top_logprobs == records[1].top_logprobs and parquet[0].top_logprobs is None
    rows = [{**_one(), "top_logprobs": [{"74": -0.5, "80": -1.2}, {"75": -1.0, "81": -0.7}]}]
    pd.DataFrame(rows).to_parquet(tmp_path / "maps.parquet")
    assert read_rollouts(tmp_path / "maps.parquet").records[0].top_logprobs == ({74: -0.5, 80: -1.2},
                                                                               {75: -1.0, 81: -0.7})


def test_unreadable_files_and_metadata_are_one_line_errors(tiny, tmp_path):
    lm = tiny("tiny-llama")
    (tmp_path / "gz.jsonl").write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    cases = [(tmp_path / "gz.jsonl", "not UTF-8 text"),
             (_jsonl(tmp_path / "m1.jsonl", [{"meta": "vllm"}, _one()]), "the metadata must be an object"),
             (_jsonl(tmp_path / "m2.jsonl", [{"meta": {"vocab_size": "32k"}}, _one()]),
              "vocab_size '32k' is not a number"),
             (_jsonl(tmp_path / "m3.jsonl", [{"meta": {"temperature": 0.7}}, _one()]), "sampled at temperature 0.7")]
    for path, message in cases:
        with pytest.raises(InputError) as err:
            score_rollouts(lm, path)
        assert message in str(err.value) and "\n" not in str(err.value)
    at_one = _jsonl(tmp_path / "t1.jsonl", [{"meta": {"temperature": 1}}, _one()])
    assert score_rollouts(lm, at_one).summary["tokens"] == 2
    from mismatch.dumps.formats import EngineDump
    with pytest.raises(InputError, match="no rollout record"):
        score_rollouts(lm, EngineDump((), "empty", ()))


def test_a_dump_that_may_come_from_another_tokenizer_is_doubted(engine, tmp_path):
    """Ids of another vocabulary (here: shifted by 7, log-probs kept) and no text or fingerprint to check
    them: the model rates the tokens far below the engine did, and the result says it may be another
    tokenizer (the check repeats it); the real dump raises no doubt."""
    lm, records = engine
    assert score_rollouts(lm, write_rollouts(tmp_path / "ok.jsonl", records)).notes == []
    shifted = [DumpRecord(r.prompt_ids, tuple((t + 7) % 259 for t in r.response_ids), tuple(max(lp, -0.05) for lp in r.logprobs))
               for r in records]
    got = score_rollouts(lm, write_rollouts(tmp_path / "other.jsonl", shifted))
    assert got.summary["mismatch_kl"] > 3 and len(got.notes) == 1 and "another tokenizer" in got.notes[0]
    adm = mismatch.check(lm, None, dump=tmp_path / "other.jsonl", thresholds={"mismatch_kl": 10.0})
    assert any("another tokenizer" in n for n in adm.notes)


def test_an_explicit_spec_beside_a_dump_is_refused_not_dropped(engine, tmp_path):
    """`rollout` defaults to None (not to the default spec), so an explicit spec — the default one included —
    beside a dump is an error instead of being silently replaced by the dump; alone, a dump needs no spec."""
    lm, records = engine
    dump = write_rollouts(tmp_path / "d.jsonl", records)
    for spec in ("fp8-e4m3:block128", "int4:group128"):
        with pytest.raises(mismatch.InputError, match="not both"):
            mismatch.check(lm, spec, dump=dump)
    assert mismatch.check(lm, dump=dump, thresholds={"mismatch_kl": 10.0}).rollout == f"dump:{dump}"


def test_a_scored_mask_and_logged_trainer_log_probs_round_trip_and_are_respected(engine, tmp_path):
    """`DumpRecord.scored` (None: every response position) and `trainer_logprobs` survive our schema, JSONL and
    parquet; the scorer leaves unscored positions out, and scores the others after them as context."""
    lm, records = engine
    r = records[0]
    scored = tuple(t % 3 != 1 for t in range(len(r.response_ids)))
    trainer = tuple(lp - 0.25 if on else 0.0 for lp, on in zip(r.logprobs, scored))
    masked = DumpRecord(r.prompt_ids, r.response_ids, tuple(lp if on else 0.0 for lp, on in zip(r.logprobs, scored)),
                        scored=scored, trainer_logprobs=trainer)
    for name in ("m.jsonl", "m.parquet"):
        back = read_rollouts(write_rollouts(tmp_path / name, [masked, records[1]])).records
        assert (back[0].scored, back[0].trainer_logprobs, back[0].logprobs) == (scored, trainer, masked.logprobs)
        assert back[1].scored is None and back[1].trainer_logprobs is None
    path = write_rollouts(tmp_path / "one.jsonl", [masked])
    tok = score_rollouts(lm, path).per_token
    at = [t for t, on in enumerate(scored) if on]
    assert tok["pos"].tolist() == [len(r.prompt_ids) + t for t in at]
    full = _full_logp(lm.model, list(r.prompt_ids + r.response_ids))[len(r.prompt_ids) - 1:]
    assert tok["logp_ref"].tolist() == pytest.approx([float(full[t, r.response_ids[t]]) for t in at], abs=LOGP_TOL)
    free = score_rollouts(None, path)  # the logged columns, as float32 (the scorer's trainer side is fp32)
    assert free.per_token["logp_ref"].tolist() == torch.tensor([trainer[t] for t in at], dtype=torch.float32).tolist()
    # log q − log p = 0.25 on every token, up to the float32 rounding of both (half an ulp each: 2^-24 relative)
    rounding = max(2 ** -24 * (abs(trainer[t]) + abs(masked.logprobs[t])) for t in at)
    assert free.summary["mismatch_kl"] == pytest.approx(0.25, abs=rounding)
    with pytest.raises(InputError, match="record 0 .*no logged trainer log-probs") as err:
        score_rollouts(None, write_rollouts(tmp_path / "plain.jsonl", [records[0]]))
    assert "\n" not in str(err.value)
    for bad, message in (({"scored": (True,)}, "1 scored flags"), ({"scored": (False,) * len(r.response_ids)},
                                                                  "no response position is scored")):
        with pytest.raises(InputError, match=message):
            read_rollouts(write_rollouts(tmp_path / "bad.jsonl", [DumpRecord(r.prompt_ids, r.response_ids, r.logprobs, **bad)]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scoring_on_cuda_agrees_with_the_cpu_within_fp32_rounding(engine, tmp_path):
    lm, records = engine
    path = write_rollouts(tmp_path / "d.jsonl", records)
    cpu = score_rollouts(lm, path).per_token
    gpu = score_rollouts("tiny-llama", path, device="cuda").per_token
    assert gpu["token"].tolist() == cpu["token"].tolist()
    # fp32 with TF32 off: two reduction orders, a few ulps per layer
    assert gpu["logp_ref"].tolist() == pytest.approx(cpu["logp_ref"].tolist(), abs=1e-4)
