"""Task generators: deterministic, disjoint splits, scoring on hand-written responses."""

import hashlib
import re

import pytest

from mismatch.errors import InputError
from mismatch.pairs.tasks import ConciseTask, PromptList, ReverseTask, SortTask, split_of

SYNTHETIC = [SortTask(), ReverseTask()]


@pytest.mark.parametrize("task", SYNTHETIC + [ConciseTask()], ids=lambda t: t.name)
def test_generators_are_deterministic_per_seed(task):
    n = 40
    assert task.prompts("train", n, seed=3) == task.prompts("train", n, seed=3)
    assert task.prompts("train", n, seed=3) != task.prompts("train", n, seed=4)
    assert len(set(task.prompts("held_out", n))) == n


@pytest.mark.parametrize("task", SYNTHETIC, ids=lambda t: t.name)
def test_train_and_held_out_never_overlap(task):
    train = set(task.prompts("train", 5000, seed=0)) | set(task.prompts("train", 5000, seed=1))
    held = set(task.prompts("held_out", 1000, seed=0)) | set(task.prompts("held_out", 1000, seed=1))
    assert not train & held
    # the split is a property of the prompt text: recompute it independently
    for p in list(held)[:200]:
        assert int(hashlib.sha256(p.encode()).hexdigest()[:8], 16) % 5 == 0
    share = sum(split_of(p) == "held_out" for p in train | held) / len(train | held)
    assert 0.05 < share < 0.35  # both splits are drawn from, not one emptied


def test_concise_split_partitions_its_pool():
    task = ConciseTask()
    pool = task.all_prompts()
    n_held = sum(int(hashlib.sha256(p.encode()).hexdigest()[:8], 16) % 5 == 0 for p in pool)  # by hand
    # ≥ 200 held-out questions: the sampled accuracy's binomial SE ≤ 3.5 points at 50%, 2.5 at 85%
    assert len(set(pool)) == len(pool) == 1400 and n_held >= 200
    train, held = task.prompts("train", len(pool) - n_held), task.prompts("held_out", n_held)
    assert sorted(train + held) == sorted(pool)
    with pytest.raises(InputError, match=f"{n_held} held_out prompts"):
        task.prompts("held_out", n_held + 1)


def test_sort_scoring_on_hand_written_responses():
    task = SortTask()
    prompts = ["sort:83712=", "sort:83712=", "sort:83712=", "sort:000=", "sort:9120=", "sort:551="]
    responses = ["12378", "12387", "12378 ", "000", "0129", "155"]
    assert task.score(prompts, responses) == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert task.score(["sort:321="], [""]) == [0.0]
    for p in task.prompts("train", 300):
        digits = p[len("sort:"):-1]
        assert 3 <= len(digits) <= 10 and task.answer(p) == "".join(sorted(digits, key=int))


def test_reverse_scoring_on_hand_written_responses():
    task = ReverseTask()
    assert task.score(["rev:stack=", "rev:stack=", "rev:abc=", "rev:abc="],
                      ["kcats", "stack", "cba", "cb"]) == [1.0, 0.0, 1.0, 0.0]
    for p in task.prompts("held_out", 300):
        letters = p[len("rev:"):-1]
        assert 3 <= len(letters) <= 12
        assert task.answer(p) == "".join(letters[i] for i in range(len(letters) - 1, -1, -1))


def test_concise_scoring_counts_words():
    task = ConciseTask()
    thirty = " ".join(["word"] * 30)
    assert task.score(["q"] * 4, [thirty, thirty + " more", "", "Paris."]) == [1.0, 0.0, 0.0, 1.0]


def test_bad_task_input_is_a_clear_error():
    with pytest.raises(InputError, match="unknown split"):
        SortTask().prompts("test", 3)
    with pytest.raises(InputError, match="not a sort prompt"):
        SortTask().answer("rev:abc=")
    with pytest.raises(InputError, match="2 prompts but 1 responses"):
        ReverseTask().score(["rev:ab=", "rev:cd="], ["ba"])


def test_prompt_list_splits_a_file(tmp_path):
    path = tmp_path / "p.txt"
    lines = [f"question number {i}?" for i in range(50)]
    path.write_text("\n".join(lines + lines[:5]) + "\n")  # duplicates are dropped
    source = PromptList.from_file(path)
    train = source.prompts("train", sum(split_of(p) == "train" for p in lines))
    held = source.prompts("held_out", sum(split_of(p) == "held_out" for p in lines))
    assert sorted(train + held) == sorted(lines)
    with pytest.raises(InputError, match="not found"):
        PromptList.from_file(tmp_path / "missing.txt")


def test_block_sort_answers_and_scores_each_block():
    """sortk: every block sorted under its tag, computed here by hand; the score is the fraction of blocks
    right in place, and a response outside the block grammar scores 0."""
    from mismatch.pairs.tasks import BlockSortTask

    task = BlockSortTask()
    assert task.answer("sortk:a837b91c4605=") == "a378b19c0456"
    prompts = task.prompts("train", 50, seed=0)
    for p in prompts:
        body = p[len("sortk:"):-1]
        blocks = re.findall(r"([a-t])(\d+)", body)
        assert "".join(t for t, _ in blocks) == "abcdefghijklmnopqrst"[:len(blocks)] and 1 <= len(blocks) <= 20
        assert all(3 <= len(d) <= 8 for _, d in blocks)
        assert task.answer(p) == "".join(t + "".join(sorted(d)) for t, d in blocks)
    p = "sortk:a837b91c4605="
    assert task.score([p] * 4, ["a378b19c0456", "a378b91c0456", "a378b19", "a378 b19c0456"]) == [1.0, 2 / 3, 2 / 3, 0.0]
    fixed = BlockSortTask(name="sortk4", min_blocks=4, max_blocks=4)
    assert {len(re.findall(r"[a-t]", p[len("sortk:"):])) for p in fixed.prompts("held_out", 20)} == {4}
    assert fixed.max_new_tokens == 4 * 9 + 1
    assert not set(fixed.prompts("held_out", 30)) & set(fixed.prompts("train", 300))
