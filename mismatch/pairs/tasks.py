"""Tasks of the student–teacher pairs: prompts with train / held-out splits, and scoring.

A task yields prompt strings (`prompts(split, n, seed)`), knows the correct response of each
(`answer`, for the supervised warm-up) and scores responses (`score(prompts, responses)` →
one reward in [0, 1] per item), so OPD and the sweep can measure accuracy, not only KL.

Synthetic tasks (pairs trained here from scratch) are deterministic generators with exact-match
scoring; every problem belongs to exactly one split, decided by a hash of its prompt text, so the
splits never overlap whatever the seed or sample size:

  * `sort`: `sort:83712=` → `12378` — the digits in ascending order (3–10 digits).
  * `reverse`: `rev:stack=` → `kcats` — the letters in reverse order (3–12 letters).
  * `sortk`: `sortk:a837b91=` → `a378b19` — `sort` k times over, each block found by its letter tag
    (1–20 blocks of 3–8 digits): the length ladder, whose per-token problem does not change with k.

Both need only attention to look up input tokens, which is what lets a teacher of ~0.5M
parameters reach ≥ 95% in a few CPU minutes. (Multi-digit addition in the reversed-digit format
was tried first: 1,000 steps left 4-layer models at 3–8%, zero-padded operands at 11% after 800.)

`concise` is the task of the pretrained pair (context distillation on SmolLM2): open questions
from templates × topics; a response scores 1 when it is a short answer, at most
`max_words` words (`mismatch.pairs.evaluate` also requires it to end with EOS within
`max_new_tokens` tokens).

Responses are compared as decoded text without special tokens; a response the model did not end
with EOS is scored by whoever decoded it (`mismatch.pairs.evaluate` scores it 0).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from importlib import resources

from mismatch.errors import InputError
from mismatch.model.generate import read_prompts

SPLITS = ("train", "held_out")
HELD_OUT_SHARE = 5  # one problem in 5 is held out


def split_of(prompt: str) -> str:
    """`"held_out"` for one prompt in five (by SHA-256 of its text), else `"train"`."""
    digest = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
    return "held_out" if digest % HELD_OUT_SHARE == 0 else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")


@dataclass(frozen=True, kw_only=True)
class SyntheticTask:
    """Base of the generated tasks: sampling by split, exact-match scoring."""

    name: str = ""

    def _draw(self, rng: random.Random) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def answer(self, prompt: str) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def prompts(self, split: str, n: int, seed: int = 0) -> list[str]:
        """`n` distinct prompts of `split`, deterministic in `(task, split, seed)`."""
        _check_split(split)
        if n < 0:
            raise InputError(f"n must be ≥ 0, got {n}")
        rng = random.Random(f"{self.name}/{split}/{seed}")
        seen: dict[str, None] = {}
        for _ in range(200 * n + 1000):
            if len(seen) == n:
                break
            prompt = self._draw(rng)
            if split_of(prompt) == split:
                seen.setdefault(prompt)
        if len(seen) < n:
            raise InputError(f"task {self.name} has fewer than {n} distinct {split} problems")
        return list(seen)

    def count(self, split: str) -> int:
        """How many prompts of `split` the task can give: unbounded in practice (draws are random)."""
        _check_split(split)
        return 10 ** 9

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        """1.0 where the response equals the correct answer exactly, else 0.0."""
        if len(prompts) != len(responses):
            raise InputError(f"{len(prompts)} prompts but {len(responses)} responses")
        return [float(r == self.answer(p)) for p, r in zip(prompts, responses)]


@dataclass(frozen=True, kw_only=True)
class SortTask(SyntheticTask):
    """Sort 3–10 decimal digits ascending: `sort:83712=` → `12378`."""

    name: str = "sort"
    min_digits: int = 3
    max_digits: int = 10

    @property
    def max_new_tokens(self) -> int:
        """Longest correct response in tokens, EOS included."""
        return self.max_digits + 1
    _pattern = re.compile(r"^sort:(\d+)=$")

    def _draw(self, rng: random.Random) -> str:
        n = rng.randint(self.min_digits, self.max_digits)
        return "sort:" + "".join(rng.choice("0123456789") for _ in range(n)) + "="

    def answer(self, prompt: str) -> str:
        match = self._pattern.match(prompt)
        if not match:
            raise InputError(f"not a sort prompt: {prompt!r}")
        return "".join(sorted(match.group(1)))


@dataclass(frozen=True, kw_only=True)
class ReverseTask(SyntheticTask):
    """Reverse 3–12 lowercase letters: `rev:stack=` → `kcats`."""

    name: str = "reverse"
    min_chars: int = 3
    max_chars: int = 12
    _pattern = re.compile(r"^rev:([a-z]+)=$")

    @property
    def max_new_tokens(self) -> int:
        """Longest correct response in tokens, EOS included."""
        return self.max_chars + 1

    def _draw(self, rng: random.Random) -> str:
        n = rng.randint(self.min_chars, self.max_chars)
        return "rev:" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)) + "="

    def answer(self, prompt: str) -> str:
        match = self._pattern.match(prompt)
        if not match:
            raise InputError(f"not a rev prompt: {prompt!r}")
        return match.group(1)[::-1]


BLOCK_TAGS = "abcdefghijklmnopqrst"  # one letter per block: at most 20 blocks


@dataclass(frozen=True, kw_only=True)
class BlockSortTask(SyntheticTask):
    """Sort each of k tagged blocks of digits: `sortk:a837b91c4605=` → `a378b19c0456`.

    The length ladder's task (issue 33 §4): every block is `sort`'s problem (3–8 digits), found by its
    tag, so the per-token problem does not change with k and the response length grows with k alone
    (≈ 6.5·k + 1 tokens). A response scores the fraction of its blocks that are right (`score`), so a long
    response is not scored 0 for one wrong digit; the expected exact match of the whole response is still
    computed exactly (`answer`).
    """

    name: str = "sortk"
    min_blocks: int = 1
    max_blocks: int = 20
    min_digits: int = 3
    max_digits: int = 8
    _pattern = re.compile(r"^sortk:((?:[a-t]\d+)+)=$")

    def __post_init__(self) -> None:
        if not 1 <= self.min_blocks <= self.max_blocks <= len(BLOCK_TAGS):
            raise ValueError(f"blocks must satisfy 1 ≤ {self.min_blocks} ≤ {self.max_blocks} ≤ {len(BLOCK_TAGS)}")

    @property
    def max_new_tokens(self) -> int:
        """Longest correct response in tokens, EOS included."""
        return self.max_blocks * (1 + self.max_digits) + 1

    def _draw(self, rng: random.Random) -> str:
        k = rng.randint(self.min_blocks, self.max_blocks)
        return "sortk:" + "".join(tag + "".join(rng.choice("0123456789") for _ in range(
            rng.randint(self.min_digits, self.max_digits))) for tag in BLOCK_TAGS[:k]) + "="

    def _blocks(self, text: str) -> list[tuple[str, str]]:
        return re.findall(r"([a-t])(\d*)", text)

    def answer(self, prompt: str) -> str:
        match = self._pattern.match(prompt)
        if not match:
            raise InputError(f"not a sortk prompt: {prompt!r}")
        return "".join(tag + "".join(sorted(digits)) for tag, digits in self._blocks(match.group(1)))

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        """The fraction of the prompt's blocks that the response gives right, tag and sorted digits, in
        order (a block missing, extra or out of place is wrong; text outside `[a-t]\\d*` blocks scores 0)."""
        if len(prompts) != len(responses):
            raise InputError(f"{len(prompts)} prompts but {len(responses)} responses")
        out = []
        for prompt, response in zip(prompts, responses):
            want = self._blocks(self.answer(prompt))
            got = self._blocks(response) if re.fullmatch(r"(?:[a-t]\d*)*", response) else []
            out.append(sum(w == g for w, g in zip(want, got)) / len(want))
        return out


_TEMPLATES = ("What is {t}?", "Explain {t} to a beginner.", "Why does {t} matter?",
              "Tell me something interesting about {t}.", "How would you describe {t} to a friend?",
              "What should everyone know about {t}?", "Give me a quick overview of {t}.",
              "What is the history of {t}?", "How does {t} affect everyday life?",
              "What is a common misconception about {t}?")
_TOPICS = ("photosynthesis", "gravity", "the water cycle", "volcanoes", "the moon", "electricity",
           "the internet", "vaccines", "climate change", "the human heart", "honey bees", "rainbows",
           "earthquakes", "the Roman Empire", "democracy", "inflation", "recycling", "black holes",
           "DNA", "the Great Wall of China", "coffee", "chess", "jazz music", "the Olympic Games",
           "solar panels", "tides", "the immune system", "bread baking", "glaciers", "the printing press",
           "a rainforest", "bicycles", "the stock market", "sleep", "mushrooms", "the Pacific Ocean",
           "electric cars", "friendship", "the alphabet", "compound interest", "octopuses", "thunder",
           "the Renaissance", "batteries", "deserts", "penguins", "the periodic table", "meditation",
           "the Amazon river", "origami", "airplanes", "the speed of light", "libraries", "tea",
           "the Moon landing", "wind turbines", "coral reefs", "the French Revolution", "music notation",
           "a healthy breakfast",
           # added for a held-out split of ≥ 200 questions (issue 24): 140 topics × 10 templates
           "the telescope", "antibiotics", "the Sahara", "earthworms", "the violin", "paper money",
           "hurricanes", "the human brain", "clouds", "the steam engine", "rice farming", "the Milky Way",
           "whales", "the Eiffel Tower", "chocolate", "the metric system", "migration of birds", "soap",
           "the Silk Road", "lightning rods", "volcanic islands", "the microscope", "cheese making",
           "the Arctic", "elephants", "the telephone", "public parks", "the heart of a cell",
           "the Industrial Revolution", "snowflakes", "the compass", "wolves", "the calendar",
           "fermentation", "the ozone layer", "bamboo", "the Nile", "x-rays", "ancient Egypt", "the piano",
           "magnets", "carbon dioxide", "sharks", "the Mona Lisa", "maps", "yoga", "the Andes", "salt",
           "nuclear power", "butterflies", "the postal service", "rain forests of Borneo", "the wheel",
           "caves", "the stethoscope", "sunflowers", "the Greek myths", "hydrogen", "camels",
           "the refrigerator", "pottery", "the Himalayas", "sound waves", "the Vikings", "tomatoes",
           "the human skeleton", "trains", "the Great Barrier Reef", "ants", "the light bulb",
           "the Aztec empire", "rivers", "the guitar", "fossils", "the solar system", "owls", "clocks",
           "the Panama Canal", "wool", "the human eye")


@dataclass(frozen=True, kw_only=True)
class ConciseTask:
    """Answer open questions in a short reply (context distillation of conciseness).

    Prompts are the 1,400 combinations of 10 templates and 140 topics, split by `split_of` (one in
    five held out: 283 held-out questions).
    """

    name: str = "concise"
    max_words: int = 30
    max_new_tokens: int = 64

    def all_prompts(self) -> list[str]:
        return [tpl.format(t=topic) for topic in _TOPICS for tpl in _TEMPLATES]

    def count(self, split: str) -> int:
        """How many prompts of `split` there are."""
        _check_split(split)
        return sum(split_of(p) == split for p in self.all_prompts())

    def prompts(self, split: str, n: int, seed: int = 0) -> list[str]:
        """`n` distinct prompts of `split` in an order shuffled by `seed`."""
        _check_split(split)
        pool = [p for p in self.all_prompts() if split_of(p) == split]
        if not 0 <= n <= len(pool):
            raise InputError(f"task {self.name} has {len(pool)} {split} prompts, asked for {n}")
        random.Random(f"{self.name}/{split}/{seed}").shuffle(pool)
        return pool[:n]

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        """1.0 for a non-empty response of at most `max_words` whitespace-separated words."""
        if len(prompts) != len(responses):
            raise InputError(f"{len(prompts)} prompts but {len(responses)} responses")
        return [float(0 < len(r.split()) <= self.max_words) for r in responses]


@dataclass(frozen=True)
class PromptList:
    """Prompts from a list (a user's file): split by `split_of`, no scoring."""

    items: tuple[str, ...]
    max_new_tokens: int = 256

    @classmethod
    def from_file(cls, path) -> PromptList:
        return cls(tuple(dict.fromkeys(read_prompts(path))))

    @classmethod
    def default(cls) -> PromptList:
        """The 36 chat prompts shipped with mismatch (`mismatch/data/prompts.txt`)."""
        return cls.from_file(resources.files("mismatch") / "data" / "prompts.txt")

    def count(self, split: str) -> int:
        """How many prompts of `split` the list holds."""
        _check_split(split)
        return sum(split_of(p) == split for p in self.items)

    def prompts(self, split: str, n: int, seed: int = 0) -> list[str]:
        """`n` distinct prompts of `split` in an order shuffled by `seed`."""
        _check_split(split)
        pool = [p for p in self.items if split_of(p) == split]
        if not 0 <= n <= len(pool):
            raise InputError(f"the prompt list has {len(pool)} {split} prompts, asked for {n}")
        random.Random(f"prompts/{split}/{seed}").shuffle(pool)
        return pool[:n]


TASKS = {"sort": SortTask(), "reverse": ReverseTask(), "concise": ConciseTask(), "sortk": BlockSortTask()}
