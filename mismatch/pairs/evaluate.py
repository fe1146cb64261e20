"""Held-out accuracy of a model on a task: greedy or sampled responses scored by the task, and, for a
task with one correct response per prompt, the expected sampled accuracy computed exactly."""

from __future__ import annotations

import torch

from mismatch.errors import InputError
from mismatch.defaults import DEFAULT_CHUNK_TOKENS
from mismatch.model.loader import LM
from mismatch.model.generate import Batch, generate, responses, sequence_logprobs, with_responses


def batch_rewards(batch: Batch, tokenizer, task, prompts: list[str]) -> list[float]:
    """The task's reward of each response in `batch` (one per prompt); a response that did not end
    with EOS (it hit the token cap) scores 0, whatever its text."""
    decoded = responses(batch, tokenizer)
    scores = task.score(prompts, [text for text, _ in decoded])
    return [s if ended else 0.0 for s, (_, ended) in zip(scores, decoded)]


def _accuracy(lm: LM, task, prompts: list[str], *, max_new_tokens: int | None, chat: bool,
              context: tuple[tuple[str, str], ...], batch_size: int, temperature: float,
              seed: int) -> float:
    limit = max_new_tokens or task.max_new_tokens
    rewards: list[float] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        batch = generate(lm, chunk, max_new_tokens=limit, chat=chat, context=context, temperature=temperature,
                         seed=seed + start)
        rewards += batch_rewards(batch, lm.tokenizer, task, chunk)
    return sum(rewards) / len(rewards)


def greedy_accuracy(lm: LM, task, prompts: list[str], *, max_new_tokens: int | None = None,
                    chat: bool = False, context: tuple[tuple[str, str], ...] = (),
                    batch_size: int = 128) -> float:
    """Mean task reward of `lm`'s greedy responses to `prompts`, in [0, 1].

    A response that does not end with EOS within `max_new_tokens` (default: the task's
    `max_new_tokens`) scores 0, whatever its text. `chat` / `context`: how prompts are
    encoded (`mismatch.model.generate.encode`), e.g. a pair's `chat` and its role's context turns.
    """
    return _accuracy(lm, task, prompts, max_new_tokens=max_new_tokens, chat=chat, context=context,
                     batch_size=batch_size, temperature=0.0, seed=0)


def sampled_accuracy(lm: LM, task, prompts: list[str], *, seed: int, temperature: float = 1.0,
                     max_new_tokens: int | None = None, chat: bool = False,
                     context: tuple[tuple[str, str], ...] = (), batch_size: int = 128) -> float:
    """Mean task reward of one sampled response per prompt (temperature 1 by default: the policy
    itself, the one on-policy distillation trains), in [0, 1]; deterministic in `seed`.

    Same scoring and encoding as `greedy_accuracy`.
    """
    return _accuracy(lm, task, prompts, max_new_tokens=max_new_tokens, chat=chat, context=context,
                     batch_size=batch_size, temperature=temperature, seed=seed)


def expected_accuracy(lm: LM, task, prompts: list[str], *, max_new_tokens: int | None = None, chat: bool = False,
                      context: tuple[tuple[str, str], ...] = (), batch_size: int = 128,
                      chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> float:
    """The expected exact match of one response sampled at temperature 1, computed without sampling:
    the mean over `prompts` of `exp Σ_t log π(gold_t | prompt, gold_<t)`, the probability that the model
    samples exactly the task's correct response (`task.answer`) and then EOS, in one teacher-forced pass.

    A gold response longer than `max_new_tokens` (default: the task's) counts 0, as a sample that hits
    the cap does. Sampled exact match decodes the text, so a sample that spells the answer with other
    tokens (special tokens inside, skipped when decoding) counts there and not here: with a byte-level
    vocabulary this is the only other way, so this is the sampled accuracy's expectation less that mass.

    Returns:
        A probability in [0, 1], the mean of per-prompt probabilities.
    """
    eos = lm.tokenizer.eos_token_id
    if eos is None:
        raise InputError("expected exact match needs a tokenizer with an EOS token")
    limit = max_new_tokens or task.max_new_tokens
    total = 0.0
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        golds = [lm.tokenizer(task.answer(p), add_special_tokens=False)["input_ids"] + [eos] for p in chunk]
        batch = with_responses(lm.tokenizer, chunk, golds, chat=chat, context=context)
        logp_BT = sequence_logprobs(lm.model, batch, chunk_tokens=chunk_tokens).double()  # 0 outside responses
        probs_B = logp_BT.sum(1).exp()
        fits = torch.tensor([len(g) <= limit for g in golds])
        total += float((probs_B * fits).sum())
    return total / len(prompts)
