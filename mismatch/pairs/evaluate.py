"""Held-out accuracy of a model on a task: greedy responses scored by the task."""

from __future__ import annotations

from mismatch.models import LM
from mismatch.rollout import generate, responses


def greedy_accuracy(lm: LM, task, prompts: list[str], *, max_new_tokens: int | None = None,
                    chat: bool = False, context: tuple[tuple[str, str], ...] = (),
                    batch_size: int = 128) -> float:
    """Mean task reward of `lm`'s greedy responses to `prompts`, in [0, 1].

    A response that does not end with EOS within `max_new_tokens` (default: the task's
    `max_new_tokens`) scores 0, whatever its text. `chat` / `context`: how prompts are
    encoded (`mismatch.rollout.encode`), e.g. a pair's `chat` and its role's context turns.
    """
    limit = max_new_tokens or task.max_new_tokens
    rewards: list[float] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        batch = generate(lm, chunk, max_new_tokens=limit, chat=chat, context=context)
        decoded = responses(batch, lm.tokenizer)
        scores = task.score(chunk, [text for text, _ in decoded])
        rewards += [s if ended else 0.0 for s, (_, ended) in zip(scores, decoded)]
    return sum(rewards) / len(rewards)
