"""The admission check's calibration set: which prompts, how many new tokens, and when the set is too small.

A user's prompts (a file or a list), else a pair student's own held-out task prompts (with the pair's
chat setting, context and response length), else the built-in general prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mismatch.errors import InputError
from mismatch.model.generate import encode, read_prompts
from mismatch.model.loader import LM, context_length
from mismatch.pairs.catalog import PAIRS

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts.txt"


@dataclass(frozen=True)
class CalibrationSettings:
    """What the check is asked for: calibration `prompts` (a file, one per line, or a list; None: a pair
    student's held-out task prompts, else the built-in general prompts), the first `max_prompts` of them,
    `max_new_tokens` sampled per prompt (None: the pair's response length, else 128; capped to the
    model's context), `chat` (wrap in the chat template; None: when the tokenizer has one)."""

    prompts: str | Path | tuple[str, ...] | list[str] | None = None
    max_prompts: int = 16
    max_new_tokens: int | None = None
    chat: bool | None = None


@dataclass(frozen=True)
class Calibration:
    """The calibration set's prompts and how to sample them."""

    texts: list[str]
    source: str
    chat: bool | None  # None: decided from the tokenizer
    context: tuple[tuple[str, str], ...] = ()
    max_new_tokens: int | None = None  # None: the caller's default


def calibration_prompts(model: str, prompts: str | Path | list[str] | None, max_prompts: int, seed: int
                        ) -> Calibration:
    """The user's prompts (a file or a list), else a pair student's own held-out task prompts (with
    the pair's chat setting, context and response length), else the built-in general prompts; the
    first `max_prompts` of them."""
    if max_prompts < 1:
        raise InputError(f"max_prompts must be ≥ 1, got {max_prompts}")
    pair_name, _, role = model.rpartition(":")
    if prompts is None and pair_name in PAIRS:
        from mismatch.pairs import load_pair

        pair = load_pair(pair_name)
        if pair.task is not None:
            context = pair.student_context if role == "student" else pair.teacher_context
            return Calibration(pair.prompts("held_out", max_prompts, seed=seed), f"{pair_name} held-out task prompts",
                               pair.chat, context, pair.max_new_tokens)
    if prompts is None:
        texts, source = read_prompts(DEFAULT_PROMPTS), "built-in general prompts"
    elif isinstance(prompts, (str, Path)):
        texts, source = read_prompts(prompts), str(prompts)
    else:
        texts, source = list(prompts), "given prompts"
    if not texts:
        raise InputError("no calibration prompts")
    return Calibration(texts[:max_prompts], source, None)


def wanted_tokens(max_new_tokens: int | None, cal: Calibration) -> int:
    """New tokens per calibration response: as given, else the calibration set's, else 128."""
    if max_new_tokens is not None and max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    return max_new_tokens or cal.max_new_tokens or 128


def response_budget(lm: LM, cal: Calibration, chat: bool, wanted: int) -> int:
    """`wanted` new tokens, capped so the longest prompt plus its response fits the model's context."""
    limit = context_length(lm.model)
    if limit is None:
        return wanted
    longest = max(len(ids) for ids in encode(lm.tokenizer, cal.texts, chat=chat, context=cal.context))
    if longest >= limit:
        raise InputError(f"a calibration prompt has {longest} tokens; {lm.name}'s context is {limit}")
    return min(wanted, limit - longest)


MIN_SEQUENCES = 8  # below this, a bootstrap over the calibration sequences says little


def small_calibration_notes(sequences: int) -> list[str]:
    """A note when the calibration set is too small for its 95% intervals to mean much."""
    if sequences >= MIN_SEQUENCES:
        return []
    return [f"only {sequences} calibration sequence{'s' if sequences != 1 else ''}: a 95% interval bootstrapped "
            f"over so few means little (use ≥ {MIN_SEQUENCES}: --max-prompts, or a larger dump)"]
