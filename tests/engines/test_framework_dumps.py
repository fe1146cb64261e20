"""prime-rl's token export and slime's debug rollout data, read by `score_rollouts` and `check --rollouts`, on
records shaped exactly as each framework writes them (prime-rl `src/prime_rl/trainer/rl/token_export.py`,
schema 1; slime `slime/observability/rollout_data_utils.py` and `Sample.to_dict`, `slime/utils/types.py`),
built from real rollouts of a noisy copy of tiny-llama; and truncated samplers (top-p, top-k) detected."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import mismatch
from mismatch.cli.app import app
from mismatch.engines import read_rollouts, score_rollouts
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


def _prime_rl_line(prompt, response, engine_lp, trainer_lp, *, step=3, idx=0):
    """One exported sequence as prime-rl's TokenExporter writes it (schema 1): prompt positions are not
    loss-masked; every per-token column has the sequence's length."""
    n = len(prompt) + len(response)
    inference = [0.0] * len(prompt) + engine_lp
    trainer = [-1.0] * len(prompt) + trainer_lp
    log_ratio = torch.tensor(trainer) - torch.tensor(inference)
    ratio = log_ratio.exp()
    return {"schema_version": 1, "step": step, "rank": 0, "micro_step": 0, "micro_sequence_idx": idx,
            "export_sequence_idx": idx, "env_name": "reverse-text",
            "token_ids": prompt + response, "position_ids": list(range(n)),
            "loss_mask": [False] * len(prompt) + [True] * len(response), "advantages": _f32([0.5] * n),
            "inference_logprobs": _f32(inference), "trainer_logprobs": _f32(trainer), "entropy": _f32([1.0] * n),
            "mismatch_kl": _f32(ratio - log_ratio - 1), "log_importance_ratio": _f32(log_ratio),
            "importance_ratio": _f32(ratio), "prob_delta": _f32(torch.tensor(trainer).exp() - torch.tensor(inference).exp()),
            "is_masked": [False] * n, "is_masked_high": [False] * n, "is_masked_low": [False] * n,
            "rl_weights": [None] * n, "ce_weights": [None] * n, "ref_kl_weights": [None] * n}


def _write_prime_rl(root, rollouts, ranks=2):
    step_dir = root / "token_exports" / "step_3"
    step_dir.mkdir(parents=True)
    for rank in range(ranks):
        lines = [_prime_rl_line(*r, idx=i) | {"rank": rank} for i, r in enumerate(rollouts) if i % ranks == rank]
        (step_dir / f"rank_{rank}.jsonl").write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
    (step_dir / "STABLE").touch()
    return step_dir


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
    res = CliRunner().invoke(app, ["check", "tiny-llama", "--rollouts", str(path)])
    assert res.exit_code in (0, 1, 3), res.output  # a verdict, not an error
    assert "slime" in res.output


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
    ({"schema_version": 1, "token_ids": [1, 2, 3, 4], "loss_mask": [False, True, False, True],
      "inference_logprobs": [0.0, -1.0, 0.0, -1.0]}, "masked tokens inside the response"),
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
