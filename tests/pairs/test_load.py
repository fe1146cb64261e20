"""Pairs load offline with one vocabulary; accuracies within their bounds; presets and TOML pairs."""

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import mismatch
from mismatch.cli.app import app
from mismatch.errors import InputError, ModelNotAvailableError, VocabMismatchError
from mismatch.hashing import sha256_file
from mismatch.pairs.build import parameter_count
from mismatch.pairs.evaluate import greedy_accuracy, sampled_accuracy
from mismatch.pairs import catalog, load
from mismatch.pairs.catalog import (PAIR_KINDS, PAIRS, SYNTHETIC_RECIPES, PairSpec, availability, committed_dir,
                                    register_pair_kind, toml_spec)
from mismatch.pairs.load import Pair, check_same_vocabulary
from mismatch.model.tokenizer import vocab_fingerprint

runner = CliRunner()
PRESETS = ["qwen3-8b-to-1.7b", "qwen3-4b-to-0.6b", "llama3.1-8b-to-3.2-1b"]


@pytest.fixture(scope="module")
def synthetic():
    return {name: mismatch.load_pair(name) for name in SYNTHETIC_RECIPES}


def test_offline_pairs_are_listed_and_presets_are_not():
    assert mismatch.list_pairs() == ["smollm2-concise", "smollm2-pruned", "sort-gpt2", "reverse-qwen3"]
    assert mismatch.list_pairs(include_unavailable=True) == list(PAIRS)
    assert set(PRESETS) <= set(PAIRS)


@pytest.mark.parametrize("name", list(SYNTHETIC_RECIPES))
def test_synthetic_pair_shares_a_vocabulary_and_has_the_documented_sizes(synthetic, name):
    pair = synthetic[name]
    manifest = json.loads((committed_dir(name) / "manifest.json").read_text())
    assert pair.info["recipe_hash"] == SYNTHETIC_RECIPES[name].digest()  # the committed build was used
    for rel, digest in manifest["files"].items():
        assert sha256_file(committed_dir(name) / rel) == digest
    assert vocab_fingerprint(pair.student.tokenizer) == vocab_fingerprint(pair.teacher.tokenizer)
    assert pair.student.model.config.vocab_size == pair.teacher.model.config.vocab_size == 259
    t, s = parameter_count(pair.teacher.model), parameter_count(pair.student.model)
    assert (t, s) == (manifest["teacher_params"], manifest["student_params"])
    assert t >= 4 * s
    family = SYNTHETIC_RECIPES[name].teacher.family
    assert pair.teacher.model.config.model_type == pair.student.model.config.model_type == family


def test_the_two_synthetic_pairs_are_two_families(synthetic):
    assert {p.teacher.model.config.model_type for p in synthetic.values()} == {"gpt2", "qwen3"}


@pytest.mark.parametrize("name", list(SYNTHETIC_RECIPES))
def test_teacher_and_student_accuracy_within_bounds(synthetic, name):
    pair = synthetic[name]
    held_out = pair.prompts("held_out", 300, seed=7)  # a fixed sample, not the build's own
    teacher = greedy_accuracy(pair.teacher, pair.task, held_out)
    student = sampled_accuracy(pair.student, pair.task, held_out, seed=11)  # the policy OPD samples
    assert teacher >= 0.95
    assert 0.2 <= student <= 0.6


def test_accuracy_counts_exact_matches(synthetic):
    """greedy_accuracy against an explicit loop: generate one prompt at a time, compare strings."""
    import torch

    pair = synthetic["sort-gpt2"]
    prompts = pair.prompts("held_out", 12, seed=3)
    tok, model = pair.student.tokenizer, pair.student.model
    hits = 0
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            for _ in range(pair.task.max_new_tokens):
                nxt = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
                if int(nxt) == tok.eos_token_id:
                    break
        response = ids[0, len(tok(p)["input_ids"]):].tolist()
        ended = response[-1] == tok.eos_token_id
        hits += ended and tok.decode(response[:-1]) == pair.task.answer(p)
    assert greedy_accuracy(pair.student, pair.task, prompts) == pytest.approx(hits / len(prompts))


def test_sampled_accuracy_scores_the_seeded_samples(synthetic):
    """sampled_accuracy: the exact-match share of the responses `generate` samples with that seed
    (scored here by string comparison), the same for the same seed, and greedy as temperature → 0."""
    from mismatch.model.generate import generate

    pair = synthetic["reverse-qwen3"]
    prompts = pair.prompts("held_out", 40, seed=5)
    batch = generate(pair.student, prompts, max_new_tokens=pair.task.max_new_tokens, temperature=1.0, seed=3)
    tok = pair.student.tokenizer
    hits = 0
    for row, p in enumerate(prompts):
        response = batch.input_ids[row][batch.response_mask[row].bool()].tolist()
        hits += response[-1] == tok.eos_token_id and tok.decode(response[:-1]) == pair.task.answer(p)
    sampled = sampled_accuracy(pair.student, pair.task, prompts, seed=3)
    assert sampled == pytest.approx(hits / len(prompts))
    assert sampled == sampled_accuracy(pair.student, pair.task, prompts, seed=3)
    assert sampled_accuracy(pair.student, pair.task, prompts, seed=3, temperature=1e-4) == pytest.approx(
        greedy_accuracy(pair.student, pair.task, prompts))


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_unavailable_with_a_one_line_message(name):
    spec = PAIRS[name]
    with pytest.raises(ModelNotAvailableError) as info:
        mismatch.load_pair(name)
    message = str(info.value)
    assert "\n" not in message and spec.teacher in message and "hf download" in message
    res = runner.invoke(app, ["pairs"])
    assert res.exit_code == 0
    assert name in res.output


def test_cli_lists_pairs_and_rejects_bad_builds():
    res = runner.invoke(app, ["pairs"])
    assert res.exit_code == 0, res.output
    for name in PAIRS:
        assert name in res.output
    res = runner.invoke(app, ["pairs", "build", "qwen3-4b-to-0.6b"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "only synthetic pairs" in res.output
    res = runner.invoke(app, ["pairs", "build", "--out", "x"])
    assert res.exit_code == 2 and "--out needs exactly one" in res.output


def _save_tiny(tmp_path, spec, seed, name):
    lm = mismatch.load(spec, seed=seed)
    lm.model.save_pretrained(tmp_path / name)
    lm.tokenizer.save_pretrained(tmp_path / name)
    return lm


def test_toml_pair_loads_and_checks_its_vocabulary(tmp_path):
    _save_tiny(tmp_path, "tiny-llama", 0, "student")
    _save_tiny(tmp_path, "tiny-qwen3", 1, "teacher")
    (tmp_path / "prompts.txt").write_text("".join(f"prompt {i}\n" for i in range(30)))
    toml = tmp_path / "pair.toml"
    toml.write_text('name = "mine"\nstudent = "student"\nteacher = "teacher"\nprompts = "prompts.txt"\n'
                    'chat = false\nmax_new_tokens = 32\n')
    pair = mismatch.load_pair(str(toml))
    assert pair.name == "mine" and pair.task is None and pair.max_new_tokens == 32
    assert pair.student.model.config.model_type == "llama" and pair.teacher.model.config.model_type == "qwen3"
    held = pair.prompts("held_out", len(pair.prompt_source.prompts("held_out", 0)) or 1)
    assert all(p.startswith("prompt ") for p in held)

    toml.write_text('student = "student"\nteacher = "teacher"\nprompts = "prompts.txt"\nbogus = 1\n')
    with pytest.raises(InputError, match="unknown key.*bogus"):
        mismatch.load_pair(str(toml))
    toml.write_text('student = "student"\nprompts = "prompts.txt"\n')
    with pytest.raises(InputError, match="missing key.*teacher"):
        mismatch.load_pair(str(toml))
    toml.write_text('student = "student"\nteacher = "teacher"\nprompts = "prompts.txt"\nchat = false\n'
                    'teacher_system = "be brief"\n')
    with pytest.raises(InputError, match="needs chat = true"):
        mismatch.load_pair(str(toml))
    with pytest.raises(InputError, match="not found"):
        mismatch.load_pair(str(tmp_path / "nope.toml"))


@pytest.mark.smollm2
def test_vocabulary_mismatch_is_a_clear_error(tmp_path, smollm2):
    from mismatch.model.smollm2 import smollm2_checkpoint

    tiny = mismatch.load("tiny-llama")
    with pytest.raises(VocabMismatchError, match="different tokenizers"):
        check_same_vocabulary(tiny, smollm2, "x")
    _save_tiny(tmp_path, "tiny-llama", 0, "student")
    (tmp_path / "p.txt").write_text("a\nb\n")
    (tmp_path / "pair.toml").write_text(f'student = "student"\nteacher = "{smollm2_checkpoint()}"\n'
                                        'prompts = "p.txt"\n')
    res = runner.invoke(app, ["pairs", "show", str(tmp_path / "pair.toml")])
    assert res.exit_code == 2 and res.output.startswith("error: pair pair: student") and res.output.count("\n") == 1


def test_unknown_pair_is_a_clear_error():
    with pytest.raises(InputError, match="unknown pair 'nope'.*sort-gpt2"):
        mismatch.load_pair("nope")


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_concise_pair_has_a_measurable_gap():
    """Same weights on both sides; only the teacher's context differs, and it changes behaviour.
    Measured (greedy) on all 283 held-out questions: teacher 88.0% short answers, student 0.7%; on the 8
    checked here (seed 0): 87.5% and 0%."""
    import torch

    pair = mismatch.load_pair("smollm2-concise")
    assert pair.student.model is not pair.teacher.model
    for (name, a), b in zip(pair.student.model.state_dict().items(), pair.teacher.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert pair.chat and len(pair.teacher_context) == 7 and pair.student_context == ()
    prompts = pair.prompts("held_out", 8, seed=0)
    teacher = greedy_accuracy(pair.teacher, pair.task, prompts, chat=True, context=pair.teacher_context)
    student = greedy_accuracy(pair.student, pair.task, prompts, chat=True, context=pair.student_context)
    assert teacher >= 0.7 and student <= 0.15, (teacher, student)


@pytest.mark.smollm2
def test_a_pruned_pairs_members_load_by_name_as_the_pair_loads_them():
    """`smollm2-pruned:student` is no checkpoint (SmolLM2 less `PRUNED_BLOCKS`): `mismatch.load` builds it
    through its pair kind, with the pair's weights, and its digest (part of a probe's id) is its own."""
    import torch

    from mismatch.pairs.catalog import PRUNED_BLOCKS

    from mismatch.pairs.load import member_digest, student_architecture

    pair = mismatch.load_pair("smollm2-pruned")
    for role in ("student", "teacher"):
        lm = mismatch.load(f"smollm2-pruned:{role}")
        assert lm.name == f"smollm2-pruned:{role}"
        expected = getattr(pair, role).model.state_dict()
        got = lm.model.state_dict()
        assert list(got) == list(expected)
        assert all(torch.equal(got[k], expected[k]) for k in got)
    full = pair.teacher.model.config.num_hidden_layers
    assert pair.student.model.config.num_hidden_layers == full - len(PRUNED_BLOCKS)
    assert student_architecture("smollm2-pruned").config.num_hidden_layers == full - len(PRUNED_BLOCKS)
    digests = {member_digest("smollm2-pruned:student"), member_digest("smollm2-pruned:teacher"),
               member_digest("smollm2-135m")}
    assert len(digests) == 3
    assert member_digest("sort-gpt2:student") == load.weights_digest(catalog.member_spec("sort-gpt2:student"))


def test_every_pair_kind_is_registered_once():
    assert list(PAIR_KINDS) == ["pretrained", "pruned", "synthetic", "preset", "toml"]
    assert {spec.kind for spec in PAIRS.values()} == {"pretrained", "pruned", "synthetic", "preset"}
    assert all(kind.name == name and kind.description for name, kind in PAIR_KINDS.items())
    with pytest.raises(ValueError, match="'preset' is already registered"):
        register_pair_kind(PAIR_KINDS["preset"])
    with pytest.raises(TypeError):
        PAIR_KINDS["x"] = PAIR_KINDS["toml"]  # read-only view


def test_availability_and_loading_dispatch_on_the_kind(monkeypatch):
    spec = PAIRS["qwen3-4b-to-0.6b"]
    tiny = mismatch.load("tiny-llama")
    loaded = []

    def load(spec_, dtype, progress):
        loaded.append((spec_, dtype, progress))
        return Pair(name=spec_.name, student=tiny, teacher=tiny, task=None, prompt_source=None)

    kind = dataclasses.replace(PAIR_KINDS["preset"], availability=lambda s: f"spy {s.name}", load=load)
    monkeypatch.setitem(PAIR_KINDS._items, "preset", kind)
    assert availability(spec) == "spy qwen3-4b-to-0.6b"
    assert "qwen3-4b-to-0.6b" not in mismatch.list_pairs()
    pair = mismatch.load_pair("qwen3-4b-to-0.6b", dtype="bf16")
    assert pair.name == "qwen3-4b-to-0.6b" and loaded == [(spec, "bf16", None)]
    bogus = dataclasses.replace(spec, kind="bogus")
    with pytest.raises(InputError, match="unknown pair kind 'bogus'; valid: pretrained, pruned, synthetic, preset, toml"):
        availability(bogus)


def test_toml_spec_describes_a_user_pair(tmp_path):
    toml = tmp_path / "mine.toml"
    toml.write_text('student = "s"\nteacher = "t"\nprompts = "p.txt"\n')
    spec = toml_spec(toml)
    assert (spec.name, spec.kind, spec.student, spec.teacher, spec.source) == ("mine", "toml", "s", "t", toml)
    assert availability(spec) is None
    assert isinstance(spec, PairSpec) and PAIR_KINDS[spec.kind].name == "toml"


@pytest.mark.smollm2
def test_the_pretrained_digest_covers_the_questions_and_the_teacher_context(monkeypatch):
    """The pair's data is its weights and what its code defines: another question set or teacher
    context is another pair digest (so other run ids: a resumed study never reuses runs on old questions)."""
    from mismatch.pairs import tasks
    from mismatch.pairs.load import pair_digest

    before = pair_digest("smollm2-concise")
    monkeypatch.setattr(tasks, "_TOPICS", tasks._TOPICS[:60])
    fewer = pair_digest("smollm2-concise")
    monkeypatch.undo()
    monkeypatch.setattr(load, "CONCISE_CONTEXT", load.CONCISE_CONTEXT[:3])  # what the digest reads
    assert len({before, fewer, pair_digest("smollm2-concise")}) == 3


def test_mismatch_load_is_the_model_layers_load_with_the_pairs_registered():
    """`mismatch.load` is `mismatch.model.loader.load` (its real signature); the pairs register `PAIR:ROLE` with it,
    so a fresh process loads a pair's model through it, and a pair that is not here is one line, not a loop."""
    import subprocess
    import sys

    from mismatch.model.loader import RESOLVERS, load
    from mismatch.pairs.load import load_member

    assert mismatch.load is load and RESOLVERS["pair"] is load_member
    code = ("import mismatch, torch; lm = mismatch.load('sort-gpt2:student'); "
            "from mismatch.pairs.catalog import member_spec; ref = mismatch.load(member_spec('sort-gpt2:student')); "
            "print(lm.name, all(torch.equal(a, b) for a, b in zip(lm.model.state_dict().values(), "
            "ref.model.state_dict().values())))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["sort-gpt2:student", "True"]
    with pytest.raises(ModelNotAvailableError, match="unknown model 'no-such-pair:student'") as info:
        mismatch.load("no-such-pair:student")
    assert "\n" not in str(info.value)
