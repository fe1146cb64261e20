"""prime-rl's token export and slime's debug rollout data, read by `score_rollouts` and `check --dump`, on
records shaped exactly as each framework writes them (prime-rl `src/prime_rl/trainer/rl/token_export.py`,
schema 1; slime `slime/observability/rollout_data_utils.py` and `Sample.to_dict`, `slime/utils/types.py`),
built from real rollouts of a noisy copy of tiny-llama; and truncated samplers (top-p, top-k) detected."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.cli.app import app
from mismatch.dumps import read_rollouts, score_rollouts
from mismatch.errors import InputError
from mismatch.model.generate import sample, sequence_logprobs
from mismatch.model.loader import LM

PROMPTS = ["hello there", "abc", "the quick brown fox", "2+2=", "one two"]
# The same model teacher-forced over another batch shape: BLAS reorders each logit's sum over the hidden width
# D = 64 (≤ D·2^-24 ≈ 4e-6 relative), which the log-softmax at most doubles
FP32_REORDER = 1e-5


class Unbuildable:  # a class torch's safe loader (weights_only) will not build
    pass


@pytest.fixture(scope="module")
def rollouts():
    """tiny-llama (the trainer) and responses sampled by its noisy copy (the engine): per sequence the prompt
    and response ids, the engine's log-probs and the trainer's (both teacher-forced, fp32)."""
    lm = mismatch.load("tiny-llama")
    with mismatch.perturbed(lm.model, "noise:0.3", seed=5) as engine:
        ro = sample(LM(engine, lm.tokenizer, "engine"), PROMPTS, max_new_tokens=8, seed=5)
    trainer_logp = sequence_logprobs(lm.model, ro.batch)
    out = []
    for b in range(len(PROMPTS)):
        attn, resp = ro.batch.attention_mask[b].bool(), ro.batch.response_mask[b].bool()
        ids = ro.batch.input_ids[b]
        out.append((ids[attn & ~resp].tolist(), ids[resp].tolist(), ro.logprobs[b][resp].tolist(),
                    trainer_logp[b][resp].tolist()))
    return lm, out


def _f32(values):
    return torch.as_tensor(values, dtype=torch.float32).tolist()  # prime-rl exports floats through float32


def _export_line(ids, loss_mask, inference, trainer, *, idx=0, micro_step=0, rl=None, ce=None, ref_kl=None):
    """One exported sequence as prime-rl's TokenExporter writes it (schema 1, `token_export.py` `_export_columns`):
    every per-token column has the sequence's length; `inference`/`trainer` are per token, shifted right (index
    t holds log p(token t | tokens < t)); a weight stream the micro batch lacks is a column of None; the ratio
    columns are None when no token is RL- or ref-KL-weighted (`_compute_export_tensors`)."""
    n = len(ids)
    ratios = not ((rl is not None and not any(rl)) and not (ref_kl is not None and any(ref_kl)))
    log_ratio = torch.tensor(trainer) - torch.tensor(inference)
    ratio = log_ratio.exp()
    none = [None] * n
    return {"schema_version": 1, "step": 3, "rank": 0, "micro_step": micro_step, "micro_sequence_idx": idx,
            "export_sequence_idx": idx, "env_name": "reverse-text", "token_ids": list(ids), "position_ids": list(range(n)),
            "loss_mask": list(loss_mask), "advantages": _f32([0.5] * n), "inference_logprobs": _f32(inference),
            "trainer_logprobs": _f32(trainer), "entropy": _f32([1.0] * n),
            "mismatch_kl": _f32(ratio - log_ratio - 1) if ratios else none,
            "log_importance_ratio": _f32(log_ratio) if ratios else none,
            "importance_ratio": _f32(ratio) if ratios else none,
            "prob_delta": _f32(torch.tensor(trainer).exp() - torch.tensor(inference).exp()) if ratios else none,
            **{k: [False] * n if ratios else none for k in ("is_masked", "is_masked_high", "is_masked_low")},
            "rl_weights": none if rl is None else _f32(rl), "ce_weights": none if ce is None else _f32(ce),
            "ref_kl_weights": none if ref_kl is None else _f32(ref_kl)}


def _prime_rl_line(prompt, response, engine_lp, trainer_lp, *, step=3, idx=0):
    """A single-turn RL sample: prompt positions not loss-masked, no weight streams."""
    return _export_line(prompt + response, [False] * len(prompt) + [True] * len(response),
                        [0.0] * len(prompt) + engine_lp, [-1.0] * len(prompt) + trainer_lp, idx=idx) | {"step": step}


def _write_step(root, lines_by_rank, *, stable=True):
    """`token_exports/step_3/rank_R.jsonl` as the exporter writes them (compact JSON, one line per sequence), and the
    STABLE marker its `mark_stable` touches after the barrier on every rank (`train.py` ~551)."""
    step_dir = root / "token_exports" / "step_3"
    step_dir.mkdir(parents=True)
    for rank, lines in enumerate(lines_by_rank):
        (step_dir / f"rank_{rank}.jsonl").write_text(
            "".join(json.dumps(x | {"rank": rank}, separators=(",", ":"), allow_nan=False) + "\n" for x in lines))
    if stable:
        (step_dir / "STABLE").touch()
    return step_dir


def _write_prime_rl(root, rollouts, ranks=2):
    return _write_step(root, [[_prime_rl_line(*r, idx=i) for i, r in enumerate(rollouts) if i % ranks == rank]
                              for rank in range(ranks)])


def test_prime_rl_export_scores_as_its_own_trainer_saw_it(rollouts, tmp_path):
    lm, rows = rollouts
    step_dir = _write_prime_rl(tmp_path, rows)
    dump = read_rollouts(step_dir)
    assert dump.shapes == ("prime-rl",) and len(dump.records) == len(rows)
    assert any("does not record the sampling temperature" in n for n in dump.notes)
    result = score_rollouts(lm, step_dir)
    tok = result.per_token
    order = [i for rank in range(2) for i in range(len(rows)) if i % 2 == rank]  # rank 0's file, then rank 1's
    want_engine = [v for i in order for v in _f32(rows[i][2])]
    want_trainer = [v for i in order for v in rows[i][3]]
    assert tok["logp_cand"].tolist() == pytest.approx(want_engine, abs=0)  # the engine's, as exported
    assert tok["logp_ref"].tolist() == pytest.approx(want_trainer, rel=FP32_REORDER)  # our pass ≈ its trainer's
    # prime-rl's per-token mismatch_kl is k3: its mean over the loss-masked tokens is our mismatch_k3
    # (within float32 rounding of its exported values: ~1e-7 relative per token)
    lines = [json.loads(line) for f in sorted(step_dir.glob("rank_*.jsonl")) for line in f.read_text().splitlines()]
    theirs = [k for x in lines for k, m in zip(x["mismatch_kl"], x["loss_mask"]) if m]
    assert result.summary["mismatch_k3"] == pytest.approx(sum(theirs) / len(theirs), rel=1e-4)
    single = score_rollouts(lm, step_dir / "rank_0.jsonl")
    assert single.summary["sequences"] == len(order[:len(range(0, len(rows), 2))])


def _teacher_forced(lm, ids):
    """prime-rl's `trainer_logprobs` of one sequence: index t holds log p(token t | tokens < t), index 0 the pad
    log(1/V) (`shift_tensor_right`, `train.py` ~451); from one plain forward of the sequence alone, fp32."""
    with torch.no_grad():
        logp = lm.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [math.log(1 / logp.shape[-1])] + logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()


TOOL = [223, 81, 77]  # " ok" in tiny-llama's tokenizer: a tool's output between two turns


def _mixed_lines(lm, rows):
    """One step mixing the kinds of sample prime-rl trains on, trainer log-probs teacher-forced by `lm`.
    Rank 0, micro batch 0 packs an RL sample (its rl stream filled 1.0, `batch.py` STREAM_FILL), a multi-turn RL
    sample (two loss-masked turns around a tool output) and a ref-KL-only sample (rl 0, as
    `orchestrator/algo/routing.py` sets it; ce absent from the batch: None columns); micro batch 1 a CE-only sample
    (rl 0, ce 1: a frozen model's tokens), whose ratio columns are None. Rank 1: an RL sample of a batch with no
    weight stream at all."""
    def line(ids, mask, inference, idx, micro_step=0, **streams):
        return _export_line(ids, mask, inference, _teacher_forced(lm, ids), idx=idx, micro_step=micro_step, **streams)

    def single(k):
        p, r, lp, _ = rows[k]
        return p + r, [False] * len(p) + [True] * len(r), [0.0] * len(p) + lp

    (a, ma, ia), (r_ids, mr, ir), (c, mc, ic) = single(0), single(2), single(3)
    p, r, lp, _ = rows[1]
    m_ids = p + r[:4] + TOOL + r[4:]
    mm = [False] * len(p) + [True] * 4 + [False] * len(TOOL) + [True] * (len(r) - 4)
    im = [0.0] * len(p) + lp[:4] + [0.0] * len(TOOL) + lp[4:]
    rank0 = [line(a, ma, ia, 0, rl=[1.0] * len(a), ref_kl=[0.0] * len(a)),
             line(m_ids, mm, im, 1, rl=[1.0] * len(m_ids), ref_kl=[0.0] * len(m_ids)),
             line(r_ids, mr, ir, 2, rl=[0.0] * len(r_ids), ref_kl=[float(x) for x in mr]),
             line(c, mc, ic, 3, micro_step=1, rl=[0.0] * len(c), ce=[float(x) for x in mc])]
    return [rank0, [line(*single(4), 0)]]


def _measured_by_prime_rl(x):
    """The tokens prime-rl's trainer measures `mismatch_kl` on (`train.py` ~498–506): the loss mask and, where the
    batch has a weight stream, the RL- or ref-KL-weighted tokens (an exported None column: no stream)."""
    def stream(name):
        return None if all(v is None for v in x[name]) else x[name]

    rl, ref = stream("rl_weights"), stream("ref_kl_weights")
    if rl is None and ref is None:
        return x["loss_mask"]
    sampled = [w != 0 for w in rl] if rl is not None else list(x["loss_mask"])
    if ref is not None:
        sampled = [s or w != 0 for s, w in zip(sampled, ref)]
    return [m and s for m, s in zip(x["loss_mask"], sampled)]


def test_prime_rl_scores_only_the_tokens_its_trainer_measures_mismatch_on(rollouts, tmp_path):
    """CE-only tokens (a frozen model's) are no engine sample: left out, as prime-rl leaves them out of its own
    mismatch_kl, with and without a model; ref-KL-sampled and multi-turn tokens are in."""
    lm, rows = rollouts
    lines = _mixed_lines(lm, rows)
    step_dir = _write_step(tmp_path, lines)
    flat = [x for rank in lines for x in rank]
    kept = [(x, t) for x in flat for t, m in enumerate(_measured_by_prime_rl(x)) if m]
    assert len(kept) == sum(len(r[1]) for k, r in enumerate(rows) if k != 3)  # every response but the CE one's
    dump = read_rollouts(step_dir)
    assert len(dump.records) == 4 and dump.tokens == len(kept)
    (note,) = [n for n in dump.notes if "no token to score" in n]
    assert "1 of 5 records" in note and "rank_0.jsonl record 3" in note and "\n" not in note
    for result in (score_rollouts(None, step_dir), score_rollouts(lm, step_dir)):
        tok = result.per_token
        assert tok["token"].tolist() == [x["token_ids"][t] for x, t in kept]
        assert tok["logp_cand"].tolist() == [x["inference_logprobs"][t] for x, t in kept]
        # prime-rl's exported per-token mismatch_kl (k3, float32) averaged over its own choice of tokens
        theirs = [x["mismatch_kl"][t] for x, t in kept]
        assert result.summary["mismatch_k3"] == pytest.approx(sum(theirs) / len(theirs), rel=1e-4)
        assert result.summary["sequences"] == 4


def test_scored_without_a_model_the_logged_trainer_side_gives_the_models_statistics(rollouts, tmp_path):
    """prime-rl exports the trainer's log-probs: scored from them alone (no model), the statistics are those a model
    gives when its teacher-forced log-probs are the logged ones, and the result says which side it used."""
    lm, rows = rollouts
    lines = _mixed_lines(lm, rows)
    step_dir = _write_step(tmp_path / "a", lines)
    free, based = score_rollouts(None, step_dir), score_rollouts(lm, step_dir)
    assert free.reference == "logged trainer log-probs (prime-rl trainer_logprobs)" and based.reference == lm.name
    assert any("recomputed by tiny-llama" in n for n in based.notes) and not any("recomputed" in n for n in free.notes)
    # the logged side is at the sampling temperature, as the engine's: nothing is read as temperature 1
    assert not any("sampling temperature" in n for n in free.notes)
    assert any("sampling temperature" in n for n in based.notes)
    cols = ["seq", "pos", "token", "logp_cand"]
    pd.testing.assert_frame_equal(free.per_token[cols], based.per_token[cols], check_exact=True)
    flat = [x for rank in lines for x in rank]
    logged = [x["trainer_logprobs"][t] for x in flat for t, m in enumerate(_measured_by_prime_rl(x)) if m]
    assert free.per_token["logp_ref"].tolist() == logged  # the logged values, untouched
    assert based.per_token["logp_ref"].tolist() == pytest.approx(logged, rel=FP32_REORDER)  # a batched pass ≈ alone
    # logged log-probs equal to the model's own (as the scorer computes them): the same statistics, bit for bit
    model = iter(based.per_token["logp_ref"].tolist())
    again = [[x | {"trainer_logprobs": [next(model) if m else v for m, v in
                                        zip(_measured_by_prime_rl(x), x["trainer_logprobs"])]} for x in rank]
             for rank in lines]
    free2 = score_rollouts(None, _write_step(tmp_path / "b", again))
    pd.testing.assert_frame_equal(free2.per_token, based.per_token, check_exact=True)
    assert free2.summary == based.summary


def test_a_multi_turn_sample_is_scored_turn_by_turn_teacher_forced(rollouts, tmp_path):
    """Two loss-masked turns around a tool's output: the prompt is what precedes the first turn, the tool tokens are
    context, not scored; the model scores each turn's tokens after everything before them."""
    lm, rows = rollouts
    x = _mixed_lines(lm, rows)[0][1]
    path = tmp_path / "rank_0.jsonl"
    path.write_text(json.dumps(x) + "\n")
    (record,) = read_rollouts(path).records
    p = len(rows[1][0])
    assert record.prompt_ids == tuple(x["token_ids"][:p]) and record.response_ids == tuple(x["token_ids"][p:])
    assert record.scored == tuple(x["loss_mask"][p:])
    tok = score_rollouts(lm, path).per_token
    at = [t for t, m in enumerate(x["loss_mask"]) if m]
    assert tok["pos"].tolist() == at
    assert tok["logp_ref"].tolist() == pytest.approx([x["trainer_logprobs"][t] for t in at], rel=FP32_REORDER)


def test_a_step_still_being_written_is_refused_and_its_rank_file_flagged(rollouts, tmp_path):
    """prime-rl touches STABLE once every rank has flushed the step: without it the step may be partial."""
    _, rows = rollouts
    step_dir = _write_step(tmp_path, [[_prime_rl_line(*r, idx=i) for i, r in enumerate(rows)]], stable=False)
    with pytest.raises(InputError, match="no STABLE marker") as err:
        read_rollouts(step_dir)
    assert "\n" not in str(err.value)
    dump = read_rollouts(step_dir / "rank_0.jsonl")
    assert len(dump.records) == len(rows)
    (note,) = [n for n in dump.notes if "STABLE" in n]
    assert "still being written" in note and "\n" not in note
    (step_dir / "STABLE").touch()
    assert not any("STABLE" in n for n in read_rollouts(step_dir / "rank_0.jsonl").notes)


def _slime_sample(prompt, response, engine_lp, **change):
    """`Sample.to_dict()` of slime: every dataclass field, status as its string, the two info records as dicts."""
    sample = {"group_index": 0, "index": 0, "rollout_id": None, "prompt": "p", "tokens": prompt + response,
              "multimodal_inputs": None, "multimodal_train_inputs": None, "multimodal_train_input_id": None,
              "apply_chat_template_kwargs": {}, "response": "r", "response_length": len(response), "label": None,
              "reward": 1.0, "loss_mask": [1] * len(response), "weight_versions": ["0"],
              "rollout_log_probs": engine_lp, "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None,
              "rollout_routed_experts": None, "remove_sample": False, "teacher_log_probs": None,
              "status": "completed", "metadata": {}, "generate_function_path": None, "custom_rm_path": None,
              "train_metadata": None, "session_id": None, "non_generation_time": 0.0,
              "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                            "completion_token_num": len(response)},
              "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": len(prompt)}}
    return sample | change


def test_slime_rollout_data_is_read_with_torch_safely_and_scored(rollouts, tmp_path):
    lm, rows = rollouts
    path = tmp_path / "rollout_7.pt"
    torch.save({"rollout_id": 7, "samples": [_slime_sample(p, r, lp, index=i) for i, (p, r, lp, _) in enumerate(rows)]},
               path)
    dump = read_rollouts(path)
    assert dump.shapes == ("slime",)
    assert not any("top-p" in n for n in dump.notes)
    result = score_rollouts(lm, path)
    assert result.per_token["logp_cand"].tolist() == pytest.approx([v for r in rows for v in r[2]], abs=0)
    assert result.per_token["logp_ref"].tolist() == pytest.approx([v for r in rows for v in r[3]], rel=FP32_REORDER)
    res = CliRunner().invoke(app, ["check", "tiny-llama", "--dump", str(path)])
    assert res.exit_code in (0, 1, 3), res.output  # a verdict, not an error
    assert "slime" in res.output and "with rollouts from" in " ".join(res.output.split())  # the dump's sampler named


def test_slimes_recorded_nucleus_and_trailing_tool_tokens(rollouts, tmp_path):
    lm, rows = rollouts
    p, r, lp, _ = rows[2]
    nucleus = torch.tensor(r * 2, dtype=torch.int32)  # a recorded nucleus: top-p < 1 was used
    offsets = torch.arange(0, 2 * len(r) + 1, 2, dtype=torch.int32)
    masked = _slime_sample(p, r + [7, 8], lp + [0.0, 0.0], loss_mask=[1] * len(r) + [0, 0])  # trailing tool tokens
    path = tmp_path / "rollout_1.pt"
    torch.save({"rollout_id": 1, "samples": [
        _slime_sample(p, r, lp, rollout_top_p_token_ids=nucleus, rollout_top_p_token_offsets=offsets), masked]}, path)
    dump = read_rollouts(path)
    assert [len(d.response_ids) for d in dump.records] == [len(r), len(r)]
    (note,) = [n for n in dump.notes if "rollout_top_p_token_ids" in n]
    assert "1 of 2 records" in note and "−log S" in note and "\n" not in note
    assert note in score_rollouts(lm, path).notes


def test_slime_drops_removed_samples(rollouts, tmp_path):
    """A sample a filter marked `remove_sample=True` is kept in the rollout dump (saved before training) but slime
    zeroes its loss mask (`slime/ray/rollout.py` `_convert_samples_to_train_data`): not scored either."""
    lm, rows = rollouts
    samples = [_slime_sample(p, r, lp, index=i, remove_sample=i == 1) for i, (p, r, lp, _) in enumerate(rows)]
    path = tmp_path / "rollout_2.pt"
    torch.save({"rollout_id": 2, "samples": samples}, path)
    dump = read_rollouts(path)
    assert [d.response_ids for d in dump.records] == [tuple(r) for i, (_, r, _, _) in enumerate(rows) if i != 1]
    (note,) = [n for n in dump.notes if "no token to score" in n]
    assert "1 of 5 records (rollout 2, sample 1" in note and "remove_sample" in note
    got = score_rollouts(lm, path).per_token
    assert got["logp_cand"].tolist() == [v for i, r in enumerate(rows) if i != 1 for v in r[2]]


def _slime_train_payload(rows, masks, *, rollout_id=4, **change):
    """`--save-debug-train-data` as slime writes it (`slime/observability/train_data_utils.py`
    `_build_dump_payload`, format_version 2): one dict per training sample holding that sample's slice of every
    per-sample training column (tensors as the Megatron actor keeps them: tokens long, loss_masks int, the
    log-prob columns float32 over the response), its `sample_index` and `rollout_position`; the DP layout in
    `dp_shards`, whole-batch fields at the top. `log_probs` is the trainer's, `rollout_log_probs` the engine's."""
    samples = []
    for i, ((p, r, engine_lp, trainer_lp), mask) in enumerate(zip(rows, masks)):
        samples.append({"data_parallel_rank": 0, "sample_index": i, "rollout_position": i,
                        "tokens": torch.tensor(p + r, dtype=torch.long), "response_lengths": len(r), "rewards": 1.0,
                        "truncated": 0, "loss_masks": torch.tensor(mask, dtype=torch.int), "rollout_ids": i,
                        "rollout_mask_sums": torch.tensor(float(sum(mask))), "total_lengths": len(p) + len(r),
                        "rollout_log_probs": torch.tensor(engine_lp, dtype=torch.float32),
                        "log_probs": torch.tensor(trainer_lp, dtype=torch.float32),
                        "advantages": torch.zeros(len(r)), "returns": torch.zeros(len(r)), "local_raw_reward": 1.0})
    n = len(samples)
    return {"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": samples,
            "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_indices": list(range(n)),
                           "partition": list(range(n)), "micro_batch_indices": [list(range(n))],
                           "num_microbatches": [1], "global_batch_sizes": [n]}], "raw_reward": [1.0] * n} | change


def test_slime_train_data_is_scored_from_its_logged_trainer_log_probs(rollouts, tmp_path):
    """`--save-debug-train-data` keeps the trainer's `log_probs` beside the engine's `rollout_log_probs`: scored with
    no model, over the loss-masked tokens (a removed sample's mask is all 0; tool tokens inside are 0), by the one
    metric code; with a model, its recomputation agrees."""
    from mismatch.admission.decision import statistics

    lm, rows = rollouts
    masks = [[1] * len(r[1]) for r in rows]
    masks[1] = [0] * len(rows[1][1])  # removed: slime zeroed its loss mask
    masks[2] = [1, 1, 1, 0, 0, 1, 1, 0]  # tool tokens inside and at the end
    path = tmp_path / "train_4.pt"
    torch.save(_slime_train_payload(rows, masks), path)
    dump = read_rollouts(path)
    assert dump.shapes == ("slime-train",) and len(dump.records) == 4
    free = score_rollouts(None, path)
    assert free.reference == "logged trainer log-probs (slime log_probs)"
    kept = [(k, t) for k, m in enumerate(masks) for t, on in enumerate(m) if on]
    lp = [_f32(rows[k][3])[t] for k, t in kept]
    lq = [_f32(rows[k][2])[t] for k, t in kept]
    seq = [[k for k in range(len(rows)) if any(masks[k])].index(k) for k, _ in kept]
    assert free.per_token["logp_ref"].tolist() == lp and free.per_token["logp_cand"].tolist() == lq
    assert free.per_token["pos"].tolist() == [len(rows[k][0]) + t for k, t in kept]
    want = statistics(torch.tensor(lp), torch.tensor(lq), torch.tensor(seq))
    assert {k: free.summary[k] for k in want} == want
    assert free.summary["mismatch_kl"] == pytest.approx(sum(b - a for a, b in zip(lp, lq)) / len(lp), rel=1e-12)
    based = score_rollouts(lm, path)
    assert based.per_token["logp_ref"].tolist() == pytest.approx(lp, rel=FP32_REORDER)
    assert based.per_token["logp_cand"].tolist() == lq


@pytest.mark.parametrize("change, message", [
    ({"format_version": 3}, "format_version 3"),
    ({"samples": [{"tokens": [1, 2, 3], "response_lengths": 1, "loss_masks": [1], "log_probs": [-0.5]}]},
     "no rollout_log_probs"),
])
def test_bad_slime_train_data_is_a_one_line_error(rollouts, tmp_path, change, message):
    _, rows = rollouts
    path = tmp_path / "train_0.pt"
    torch.save(_slime_train_payload(rows, [[1] * len(r[1]) for r in rows], **change), path)
    with pytest.raises(InputError, match=message) as err:
        read_rollouts(path)
    assert "\n" not in str(err.value)


def test_the_cli_scores_a_dump_alone_from_its_logged_trainer_side(rollouts, tmp_path):
    lm, rows = rollouts
    step_dir = _write_step(tmp_path, _mixed_lines(lm, rows))
    for args, side, result in ((["score-rollouts", str(step_dir)], "logged", score_rollouts(None, step_dir)),
                               (["score-rollouts", "tiny-llama", str(step_dir)], "recomputed", score_rollouts(lm, step_dir))):
        res = CliRunner().invoke(app, [*args, "--json"])
        assert res.exit_code == 0, res.output
        printed = json.loads(res.stdout[res.stdout.index("{"):])
        assert printed["trainer"] == side and printed["model"] == result.reference
        assert {k: printed[k] for k in result.summary} == pytest.approx(result.summary, rel=1e-12)
        table = CliRunner().invoke(app, args)
        assert table.exit_code == 0 and f"trainer side: {side}" in table.stdout
    bad = CliRunner().invoke(app, ["score-rollouts", str(_write_rollouts_without_trainer(rows, tmp_path))])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "no logged trainer log-probs" in bad.output


def _write_rollouts_without_trainer(rows, tmp_path):
    from mismatch.dumps import DumpRecord, write_rollouts

    return write_rollouts(tmp_path / "engine_only.jsonl", [DumpRecord(tuple(p), tuple(r), tuple(lp)) for p, r, lp, _ in rows])


@pytest.mark.parametrize("where, settings, expected", [
    ("meta", {"top_p": 0.9}, "its metadata says top_p 0.9"),
    ("meta", {"top_k": 50, "min_p": 0.05}, "its metadata says top_k 50, min_p 0.05"),
    ("record", {"sampling_params": {"top_p": 0.95, "temperature": 1.0}}, "its request says top_p 0.95"),
    ("record", {"request": {"top_k": 20}}, "its request says top_k 20"),
    ("meta", {"top_p": 1.0, "top_k": -1, "min_p": 0.0}, None),  # the untruncated defaults
])
def test_truncated_samplers_are_said_in_one_line(rollouts, tmp_path, where, settings, expected):
    _, rows = rollouts
    recs = [{"prompt_token_ids": p, "response_token_ids": r, "response_logprobs": lp} for p, r, lp, _ in rows]
    if where == "record":
        recs[1] |= settings
    lines = ([{"meta": settings}] if where == "meta" else []) + recs
    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    notes = read_rollouts(path).notes
    if expected is None:
        assert notes == ()
    else:
        (note,) = notes
        assert expected in note and "\n" not in note


def test_a_top_p_dump_biases_the_ratio_by_the_kept_mass_and_says_so(tmp_path):
    """TRL #6789's effect, measured: log-probs of a top-p 0.8 sampler (renormalized over the nucleus) against the
    same model's full distribution give IS ratios r = p/q whose mean is the kept mass E[S] < 1, not 1."""
    lm = mismatch.load("tiny-llama")
    ro = sample(lm, PROMPTS * 8, max_new_tokens=8, top_p=0.8, seed=1)
    full = sequence_logprobs(lm.model, ro.batch)
    mask = ro.batch.response_mask.bool()
    recs = []
    for b in range(len(ro.batch.input_ids)):
        attn, resp = ro.batch.attention_mask[b].bool(), mask[b]
        ids = ro.batch.input_ids[b]
        recs.append({"prompt_token_ids": ids[attn & ~resp].tolist(), "response_token_ids": ids[resp].tolist(),
                     "response_logprobs": ro.logprobs[b][resp].tolist()})
    path = tmp_path / "top_p.jsonl"
    path.write_text(json.dumps({"meta": {"top_p": 0.8}}) + "\n" + "".join(json.dumps(r) + "\n" for r in recs))
    result = score_rollouts(lm, path)
    kept = (full[mask] - ro.logprobs[mask]).exp()  # per token p(y)/q(y) = S of that step's nucleus
    assert float(kept.max()) <= 1 + 1e-5 and float(kept.mean()) < 0.95  # a real truncation
    assert float(result.per_token["is_ratio"].mean()) == pytest.approx(float(kept.double().mean()), rel=1e-5)
    assert any("top_p 0.8" in n for n in result.notes)


@pytest.mark.parametrize("record, message", [
    ({"schema_version": 2, "token_ids": [1, 2], "loss_mask": [False, True], "inference_logprobs": [0.0, -1.0]},
     "schema version 2"),
    ({"schema_version": 1, "token_ids": [1, 2, 3], "loss_mask": [False, True, True], "inference_logprobs": [0.0, -1.0, -1.0],
      "rl_weights": [1.0, 1.0]}, "rl_weights has 2 values for 3 tokens"),
    ({"schema_version": 1, "token_ids": [1, 2], "loss_mask": [False, True], "inference_logprobs": [0.0, -1.0],
      "trainer_logprobs": [-5.5, None]}, "trainer log-prob at response position 0 is None"),
    ({"schema_version": 1, "token_ids": [1, 2], "loss_mask": [False, False], "inference_logprobs": [0.0, 0.0]},
     "no loss-masked token"),
    ({"schema_version": 1, "token_ids": [1, 2], "loss_mask": [False, True], "inference_logprobs": [0.0, None]},
     "null"),
])
def test_bad_prime_rl_records_are_one_line_errors(tmp_path, record, message):
    path = tmp_path / "rank_0.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(InputError, match=message) as err:
        read_rollouts(path)
    assert "\n" not in str(err.value)


def test_an_unsafe_torch_file_is_refused_not_unpickled(tmp_path):
    path = tmp_path / "rollout_0.pt"
    torch.save({"rollout_id": 0, "samples": [Unbuildable()]}, path)
    with pytest.raises(InputError, match="only containers and tensors") as err:
        read_rollouts(path)
    assert "\n" not in str(err.value)
    # what was refused, in whole words: the class torch would have had to import (its message says "GLOBAL
    # module.Class was not an allowed global …"), never torch's advice to load it with weights_only=False
    assert str(err.value).endswith(f"(UnpicklingError: Unsupported global: GLOBAL {__name__}.Unbuildable)")
    assert "weights_only" not in str(err.value)
    path.write_bytes(b"garbage")  # not a pickle at all: torch's first word on it, whole
    with pytest.raises(InputError, match=r"\(UnpicklingError: Unsupported operand \d+\)$"):
        read_rollouts(path)
