"""The offline pair builder: deterministic weights, response-only labels, recipe validation."""

import dataclasses
import hashlib

import pytest
import torch

from mismatch.pairs.build import _batch, _examples, init_model, parameter_count, train_pair
from mismatch.pairs.catalog import BuildRecipe, ModelShape
from mismatch.pairs.catalog import SYNTHETIC_RECIPES
from mismatch.pairs.tasks import TASKS
from mismatch.model.tokenizer import byte_tokenizer


def _short(name: str, **changes) -> BuildRecipe:
    """The real recipe of a pair, cut to a few steps: same code path, seconds instead of minutes."""
    recipe = SYNTHETIC_RECIPES[name]
    return dataclasses.replace(recipe, train_pool=300, teacher_steps=6, student_max_steps=4, student_eval_every=2,
                               eval_problems=16, warmup_eval_problems=8, batch_size=8, **changes)


def _weights_hash(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SYNTHETIC_RECIPES))
def test_building_twice_gives_identical_weights(name):
    recipe = _short(name)
    task = TASKS[recipe.task]
    first = train_pair(recipe, task)
    second = train_pair(recipe, task)
    for a, b in zip(first[:2], second[:2]):
        assert _weights_hash(a) == _weights_hash(b)
    assert first[2]["student_warmup_curve"] == second[2]["student_warmup_curve"]
    other = train_pair(_short(name, seed=1), task)
    assert _weights_hash(other[0]) != _weights_hash(first[0])
    # training moved the weights away from the initialisation
    assert _weights_hash(first[0]) != _weights_hash(init_model(recipe.teacher, recipe.seed))


def test_labels_cover_exactly_the_answer_and_eos():
    task = TASKS["sort"]
    tok = byte_tokenizer()
    examples = _examples(task, ["sort:312=", "sort:98765="])
    ids, attn, labels = _batch(examples, tok.pad_token_id)
    for row, prompt in enumerate(["sort:312=", "sort:98765="]):
        answer = task.answer(prompt)
        expected = [-100] * len(prompt) + [tok.convert_tokens_to_ids(c) for c in answer] + [tok.eos_token_id]
        expected += [-100] * (ids.shape[1] - len(expected))
        assert labels[row].tolist() == expected
        assert int(attn[row].sum()) == len(prompt) + len(answer) + 1
        assert tok.decode(ids[row, : len(prompt)]) == prompt


def test_students_are_at_least_four_times_smaller():
    for recipe in SYNTHETIC_RECIPES.values():
        t, s = init_model(recipe.teacher, 0), init_model(recipe.student, 0)
        assert parameter_count(t) >= 4 * parameter_count(s)
        assert type(t) is type(s)


def test_recipe_hash_tracks_every_field_and_validation():
    base = SYNTHETIC_RECIPES["sort-gpt2"]
    assert base.digest() == dataclasses.replace(base).digest()
    assert base.digest() != dataclasses.replace(base, teacher_steps=base.teacher_steps + 1).digest()
    assert base.digest() != dataclasses.replace(base, student_lr=base.student_lr * 2).digest()
    with pytest.raises(ValueError, match="student_target"):
        dataclasses.replace(base, student_target=1.5)
    with pytest.raises(ValueError, match="do not divide"):
        ModelShape(family="qwen3", width=50, layers=1, heads=4, kv_heads=2, ffn=8)
    with pytest.raises(ValueError, match="family"):
        ModelShape(family="mamba", width=48, layers=1, heads=4, kv_heads=2, ffn=8)
    torch.manual_seed(0)  # the builder forks the RNG: the global state is left alone
    state = torch.random.get_rng_state()
    init_model(base.student, 5)
    assert torch.equal(state, torch.random.get_rng_state())
