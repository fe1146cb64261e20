"""Batches for probing: prompt encoding, greedy/seeded generation and the masks they carry."""

import pytest
import torch

from mismatch.errors import InputError
from mismatch.model.generate import encode, generate, read_prompts, teacher_forced


def _manual_greedy(model, prompt_ids, steps, eos):
    """Obvious greedy decoding: one unpadded forward per token, stop after EOS."""
    ids = list(prompt_ids)
    for _ in range(steps):
        with torch.no_grad():
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(nxt)
        if nxt == eos:
            break
    return ids[len(prompt_ids):]


def test_greedy_generation_matches_manual_loop_and_masks(tiny):
    lm = tiny("tiny-llama", 5)
    prompts = ["ab", "hello world", "x"]
    batch = generate(lm, prompts, max_new_tokens=9)
    encoded = encode(lm.tokenizer, prompts, chat=False)
    width = max(len(e) for e in encoded)
    for row, ids in enumerate(encoded):
        expected = _manual_greedy(lm.model, ids, 9, lm.tokenizer.eos_token_id)
        resp = batch.input_ids[row][batch.response_mask[row].bool()].tolist()
        assert resp == expected
        # prompt left-padded, response right after it, attention covers prompt + response
        assert batch.attention_mask[row].tolist() == [0] * (width - len(ids)) + [1] * (len(ids) + len(resp)) + \
            [0] * (batch.input_ids.shape[1] - width - len(resp))
        assert batch.response_mask[row, :width].sum() == 0


def test_response_stops_at_first_eos(tiny):
    lm = tiny("tiny-gpt2", 1)
    eos = lm.tokenizer.eos_token_id
    with torch.no_grad():  # make EOS the only likely token after a few steps: bias the head
        model = lm.model
        saved = model.lm_head.weight.detach().clone()
        model.lm_head.weight[eos] += 5 * model.transformer.wte.weight.std()
    try:
        batch = generate(lm, ["abc", "defgh"], max_new_tokens=20, min_new_tokens=3)
    finally:
        with torch.no_grad():
            model.lm_head.weight.copy_(saved)
    for row in range(2):
        resp = batch.input_ids[row][batch.response_mask[row].bool()].tolist()
        assert len(resp) >= 3
        assert eos not in resp[:-1]  # only the last response token may be EOS
        if len(resp) < 20:
            assert resp[-1] == eos


def test_sampling_is_seeded(tiny):
    lm = tiny("tiny-qwen3")
    a = generate(lm, ["abc", "de"], max_new_tokens=12, temperature=1.0, seed=4)
    b = generate(lm, ["abc", "de"], max_new_tokens=12, temperature=1.0, seed=4)
    c = generate(lm, ["abc", "de"], max_new_tokens=12, temperature=1.0, seed=5)
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_teacher_forced_scores_all_but_first_token(tiny):
    lm = tiny("tiny-llama")
    batch = teacher_forced(lm, ["abcd", "xy"])
    assert batch.response_mask.sum(1).tolist() == [3, 1]
    assert batch.attention_mask.sum(1).tolist() == [4, 2]


def test_bad_prompts(tiny, tmp_path):
    lm = tiny("tiny-llama")
    with pytest.raises(InputError, match="prompt 1 is empty"):
        generate(lm, ["ok", "  "], max_new_tokens=2)
    with pytest.raises(InputError, match="no prompts"):
        teacher_forced(lm, [])
    with pytest.raises(InputError, match="chat template"):
        teacher_forced(lm, ["a"], chat=True)
    with pytest.raises(InputError, match="not found"):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(InputError, match="no non-blank line"):
        read_prompts(tmp_path / "blank.txt")
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(lm, ["a"], max_new_tokens=2, min_new_tokens=3)


@pytest.mark.smollm2
def test_context_turns_precede_the_prompt(smollm2):
    from mismatch.model.generate import encode

    tok = smollm2.tokenizer
    context = (("system", "Be brief."), ("user", "Hi?"), ("assistant", "Hello."))
    ids = encode(tok, ["What is tea?"], chat=True, context=context)[0]
    text = tok.decode(ids)
    expected = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is tea?"}],
        add_generation_prompt=True, tokenize=False)
    assert text == expected
    assert text.index("Be brief.") < text.index("Hello.") < text.index("What is tea?")
    with pytest.raises(InputError, match="context turns need chat=True"):
        encode(tok, ["x"], chat=False, context=context)


def test_responses_decode_up_to_eos(tiny):
    from mismatch.model.generate import Batch, responses

    lm = tiny("tiny-llama")
    tok = lm.tokenizer
    hi, eos, pad = tok("hi")["input_ids"], tok.eos_token_id, tok.pad_token_id
    ids = torch.tensor([[pad, *tok("ab")["input_ids"], *hi, eos],
                        [*tok("abc")["input_ids"], *hi, *tok("!")["input_ids"]]])
    resp = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
    batch = Batch(ids, torch.ones_like(ids), resp, ("ab", "abc"))
    assert responses(batch, tok) == [("hi", True), ("hi!", False)]


@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.7, None), (1.0, 0.8)])
def test_sample_returns_the_rollout_models_own_logprobs(tiny, temperature, top_p):
    from mismatch.model.generate import sample

    lm = tiny("tiny-qwen3")
    prompts = ["ab", "hello there", "x"]
    r = sample(lm, prompts, max_new_tokens=7, temperature=temperature, top_p=top_p, seed=11)
    again = sample(lm, prompts, max_new_tokens=7, temperature=temperature, top_p=top_p, seed=11)
    assert torch.equal(r.batch.input_ids, again.batch.input_ids) and torch.equal(r.logprobs, again.logprobs)
    b = r.batch
    assert torch.equal(r.logprobs != 0, b.response_mask.bool())
    # independent: one sequence at a time, no padding, full logits, explicit temperature and nucleus
    for row in range(len(prompts)):
        keep = b.attention_mask[row].bool()
        ids = b.input_ids[row][keep].unsqueeze(0)
        resp = b.response_mask[row][keep]
        with torch.no_grad():
            z = lm.model(ids).logits[0].double() / temperature
        for t in resp.nonzero().flatten().tolist():
            probs = torch.softmax(z[t - 1], -1)
            if top_p is not None:
                order = probs.argsort(descending=True)
                cum = probs[order].cumsum(0)
                kept = order[: int((cum < top_p).sum()) + 1]
                mask = torch.zeros_like(probs, dtype=torch.bool)
                mask[kept] = True
                probs = torch.where(mask, probs, 0) / probs[mask].sum()
            y = ids[0, t]
            assert probs[y] > 0  # a sampled token lies inside the nucleus
            want = float(probs[y].log())
            got = float(r.logprobs[row][keep][t])
            assert got == pytest.approx(want, abs=2e-5)
    with pytest.raises(InputError, match="temperature > 0"):
        sample(lm, prompts, max_new_tokens=3, temperature=0)


def test_reprompt_keeps_the_response_tokens_after_other_prompts(tiny):
    from mismatch.model.generate import reprompt

    lm = tiny("tiny-llama")
    batch = generate(lm, ["ab", "hello"], max_new_tokens=5, temperature=1.0, seed=4)
    other = reprompt(batch, lm.tokenizer, ["a much longer prompt", "x"], chat=False, context=())
    assert torch.equal(other.input_ids[other.response_mask.bool()], batch.input_ids[batch.response_mask.bool()])
    for row, prompt in enumerate(["a much longer prompt", "x"]):
        ids = other.input_ids[row][other.attention_mask[row].bool()].tolist()
        n = len(lm.tokenizer(prompt)["input_ids"])
        assert ids[:n] == lm.tokenizer(prompt)["input_ids"]
        assert ids[n:] == batch.input_ids[row][batch.response_mask[row].bool()].tolist()
