"""The expected sampled exact match, computed exactly: a slow per-prompt product of probabilities, and
the mean of many sampled exact matches, agree with it."""

import math

import pytest
import torch

from mismatch.model.generate import encode
from mismatch.pairs import load_pair
from mismatch.pairs.evaluate import expected_accuracy, sampled_accuracy


@pytest.fixture(scope="module")
def sort_pair():
    return load_pair("sort-gpt2")


def _slow(lm, task, prompt: str) -> float:
    """P(gold then EOS) by hand: one unpadded sequence, the model's own full logits, a product over tokens."""
    gold = lm.tokenizer(task.answer(prompt), add_special_tokens=False)["input_ids"] + [lm.tokenizer.eos_token_id]
    ids = encode(lm.tokenizer, [prompt], chat=False)[0]
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids + gold])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    p = 1.0
    for i, token in enumerate(gold):
        p *= math.exp(float(logp[len(ids) + i - 1, token]))
    return p


def test_expected_accuracy_is_the_mean_probability_of_the_gold_response(sort_pair):
    """Batched, padded, chunked head vs one sequence at a time in float64 from fp32 logits: per-token
    log-probs agree to ~1e-6 (fp32 rounding of logits of scale ~10), so each product of ≤ 11 factors to
    ~1e-5 relative; rel 1e-4 is that bound with room."""
    lm, task = sort_pair.student, sort_pair.task
    prompts = task.prompts("held_out", 12, seed=5)
    want = sum(_slow(lm, task, p) for p in prompts) / len(prompts)
    got = expected_accuracy(lm, task, prompts, batch_size=5, chunk_tokens=7)  # several chunks of each
    assert want > 0.01 and got == pytest.approx(want, rel=1e-4)
    # a cap shorter than a gold response: that prompt can only fail, as a sample cut at the cap does
    short = [p for p in prompts if len(task.answer(p)) + 1 > 6]
    assert short and expected_accuracy(lm, task, short, max_new_tokens=6) == 0.0


def test_expected_accuracy_is_what_sampling_estimates(sort_pair):
    """1,600 samples (8 prompts × 200): their mean exact match lies within 4 standard errors of the exact
    expectation (a false failure has probability < 1e-4; the mass of answers spelt with special tokens
    inside, counted by sampling only, is far below one standard error for a trained student)."""
    lm, task = sort_pair.student, sort_pair.task
    prompts = task.prompts("held_out", 8, seed=9)
    exact = expected_accuracy(lm, task, prompts)
    sampled = sampled_accuracy(lm, task, prompts * 200, seed=11, batch_size=400)
    se = math.sqrt(max(exact * (1 - exact), 1e-4) / 1600)
    assert 0.02 < exact < 0.98  # the premise: an answer neither certain nor impossible
    assert abs(sampled - exact) <= 4 * se, (sampled, exact, se)
