"""Loading the student–teacher pairs of `mismatch.pairs.catalog`: `load_pair`, a pair's model alone
(`load_member`: `PAIR:student`, `PAIR:teacher`, what `mismatch.load` takes), the data digest that enters a
run's id (`pair_digest`), and the built-in pair kinds' loaders, availability checks and digests (registered
in the catalogue, imported from here on first use).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForCausalLM

from mismatch.errors import InputError, ModelNotAvailableError, VocabMismatchError, of_type
from mismatch.hashing import content_hash, sha256_file
from mismatch.model.catalog import locate, unknown_model, weights_digest
from mismatch.model.device import resolve_device
from mismatch.model.layout import drop_layers
from mismatch.model.loader import LM, load, place, register_resolver  # load: `mismatch.load`, re-exported here
from mismatch.model.smollm2 import smollm2_checkpoint, smollm2_gguf_path
from mismatch.model.tokenizer import vocab_fingerprint
from mismatch.pairs.build import cache_build_dir, synthetic_dir, valid_build
from mismatch.pairs.catalog import (CONCISE_CONTEXT, PAIRS, PRUNED_BLOCKS, SYNTHETIC_RECIPES, Message, PairSpec, Progress,
                                    availability, committed_dir, member_spec, pair_kind, pair_spec, read_pair_file)
from mismatch.pairs.tasks import TASKS, PromptList


@dataclass(frozen=True)
class Pair:
    """A loaded student–teacher pair.

    `prompts` yields prompt texts by split (from the task or a prompt file); `task` scores
    responses (None when the pair has no task: KL only). Each model sees a prompt as its own
    context turns (chat) followed by the prompt: `teacher_context` is the teacher's privileged
    context, `student_context` the student's (usually empty); responses are shared tokens.
    """

    name: str
    student: LM
    teacher: LM
    task: object | None
    prompt_source: object
    chat: bool = False
    teacher_context: tuple[Message, ...] = ()
    student_context: tuple[Message, ...] = ()
    max_new_tokens: int = 64
    description: str = ""
    info: dict = field(default_factory=dict)

    def prompts(self, split: str, n: int, seed: int = 0) -> list[str]:
        """`n` prompts of `split` (`train` / `held_out`), deterministic in `seed`."""
        return self.prompt_source.prompts(split, n, seed)

















# ---------------------------------------------------------------- availability


def _in_hf_cache(repo_id: str) -> bool:
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def preset_availability(spec: PairSpec) -> str | None:
    missing = [r for r in (spec.teacher, spec.student) if not _in_hf_cache(r)]
    return f"missing from the local Hugging Face cache: {', '.join(missing)}" if missing else None


def smollm2_availability(spec: PairSpec) -> str | None:
    try:
        smollm2_gguf_path()
    except ModelNotAvailableError as exc:
        return str(exc)
    return None


















def pair_sizes(spec: PairSpec) -> tuple[str, str]:
    """(teacher, student) parameter counts as text: measured for synthetic pairs with a build
    (committed or cached), nominal otherwise."""
    if spec.recipe is not None:
        build_name = spec.build or spec.name
        for directory in (committed_dir(build_name), cache_build_dir(build_name)):
            path = directory / "manifest.json"
            if path.is_file():
                manifest = json.loads(path.read_text())
                if manifest.get("recipe_hash") == spec.recipe.digest():
                    return f"{manifest['teacher_params'] / 1e3:.0f}k", f"{manifest['student_params'] / 1e3:.0f}k"
    return spec.params


def describe_pairs() -> list[dict[str, str]]:
    """One row per registered pair for listings: pair, kind, architecture, teacher, student,
    params (teacher / student), task, here (yes/no) and what is missing when it does not load here."""
    rows = []
    for name, spec in PAIRS.items():
        missing = availability(spec)
        teacher_params, student_params = pair_sizes(spec)
        rows.append({"pair": name, "kind": spec.kind, "architecture": spec.architecture, "teacher": spec.teacher,
                     "student": spec.student, "params": f"{teacher_params} / {student_params}", "task": spec.task,
                     "here": "yes" if missing is None else "no", "missing": missing or ""})
    return rows








# ---------------------------------------------------------------- loading


def checkpoint(spec: str) -> str:
    """What `load_member` reads for `spec`: `member_spec`, with a synthetic pair's weights verified (or built)."""
    return member_spec(spec, weights_dir=lambda name: synthetic_dir(name)[0])


def check_same_vocabulary(student: LM, teacher: LM, name: str) -> None:
    """Raise `VocabMismatchError` unless both tokenizers map the same tokens to the same ids and
    both output heads have the same size."""
    if vocab_fingerprint(student.tokenizer) != vocab_fingerprint(teacher.tokenizer):
        raise VocabMismatchError(f"pair {name}: student {student.name} and teacher {teacher.name} have "
                                 "different tokenizers (tokens map to different ids)")
    sv = student.model.get_output_embeddings().weight.shape[0]
    tv = teacher.model.get_output_embeddings().weight.shape[0]
    if sv != tv:
        raise VocabMismatchError(f"pair {name}: student {student.name} has {sv} output logits, "
                                 f"teacher {teacher.name} has {tv}")








def _built_member(spec: str) -> tuple[PairSpec, str] | None:
    """`(pair, role)` when `spec` is `PAIR:ROLE` of a kind whose members are built, not named by a model spec
    (`PairKind.member`); None otherwise. Raises what `member_spec` raises (type, unknown role)."""
    member_spec(spec)  # checks the type and the role; builds nothing
    name, _, role = os.fspath(spec).rpartition(":")
    pair = PAIRS.get(name)
    return (pair, role) if pair is not None and pair_kind(pair).member is not None else None


def load_member(spec: str, *, dtype: str | torch.dtype = torch.float32, seed: int = 0,
                device: str | torch.device = "cpu") -> LM:
    """Load a model from local files only: `mismatch.load`, which takes everything the CLI takes.

    Args:
        spec: a built-in name (`mismatch.list_models()`), a pair's model (`PAIR:student`,
            `PAIR:teacher`, `mismatch.list_pairs()`), a local checkpoint directory, or a hub id in the
            local Hugging Face cache.
        dtype: parameter dtype (`"fp32"` default, `"bf16"`, `"fp16"` or a `torch.dtype`).
        seed: initialisation seed of the tiny random-init models (ignored otherwise).
        device: `"cpu"` (default), `"cuda[:N]"`, `"auto"` or `"balanced"` (`mismatch.model.loader.load`).

    Returns:
        `LM(model, tokenizer, name=spec)` in eval mode on `device`.

    Raises:
        ModelNotAvailableError, InputError: the spec cannot be resolved without the network; an unknown
            device, or CUDA asked for where none is present.
    """
    built = _built_member(spec)
    if built is not None:
        resolve_device(device)  # before building the member: a wrong device fails at once
        pair, role = built
        lm = pair_kind(pair).member(pair, role, dtype)
        place(lm.model, device)
    else:
        path = checkpoint(spec)
        if path == os.fspath(spec) and locate(path) == "pair":
            raise unknown_model(path)  # `PAIR:ROLE` of no pair here: one line, not a loop through `load`
        lm = load(path, dtype=dtype, seed=seed, device=device)
    return LM(lm.model, lm.tokenizer, os.fspath(spec), None if built else lm.source)  # a built member: no file


def member_digest(spec: str) -> str:
    """16 hex digits identifying the weights `load_member(spec)` reads, without loading them: the files'
    (`mismatch.model.catalog.weights_digest`), or for a pair member that is not a checkpoint, the pair's
    data and the role."""
    built = _built_member(spec)
    if built is not None:
        return content_hash({"pair": pair_digest(built[0].name), "role": built[1]})
    return weights_digest(checkpoint(spec))


def student_architecture(pair: str):
    """The pair student's architecture on the meta device, from its `config.json` (shapes only, no weight
    read): what the rollout cost factors need when a run is written (`mismatch.rollout.cost.cost_factors`).

    Raises:
        MismatchError: the pair is unknown here, or its student has no local `config.json`.
    """
    spec = checkpoint(f"{pair}:student")
    pruned = PAIRS[pair].kind == "pruned" if pair in PAIRS else False
    if pruned:
        spec = "smollm2-135m"
    directory = smollm2_checkpoint() if spec == "smollm2-135m" else Path(spec)
    if not (directory / "config.json").is_file():
        raise ModelNotAvailableError(f"no config.json for {pair}'s student at {directory}")
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return drop_layers(model, PRUNED_BLOCKS) if pruned else model


def pair_digest(name: str) -> str:
    """16 hex digits identifying the data pair `name` reads — its weights (file contents), prompt
    file and build recipe — computed without loading it; part of an OPD run's id.

    Raises:
        InputError: unknown name, bad TOML.
    """
    spec = pair_spec(name)
    return content_hash({"kind": spec.kind, "data": pair_kind(spec).digest(spec)})


def load_pair(name: str, *, dtype: str = "fp32", progress: Progress | None = None) -> Pair:
    """Load a registered pair by name, or a user pair from a TOML file path.

    Args:
        name: a name from `list_pairs(include_unavailable=True)` or a path ending in `.toml`.
        dtype: parameter dtype of both models (`fp32` default; TOML pairs may set their own).
        progress: `progress(stage, done, total)` while a synthetic pair is being built.

    Raises:
        ModelNotAvailableError: a preset whose weights are not on disk (one line: where to put them).
        VocabMismatchError: student and teacher do not share a vocabulary.
        InputError: unknown name, bad TOML.
    """
    of_type(name, (str, os.PathLike), "a pair name")
    spec = pair_spec(os.fspath(name))
    pair = pair_kind(spec).load(spec, dtype, progress)
    check_same_vocabulary(pair.student, pair.teacher, pair.name)
    return pair


def load_pretrained(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """`smollm2-concise`: the same SmolLM2 weights twice; the teacher gets the concise context."""
    student, teacher = load("smollm2-135m", dtype=dtype), load("smollm2-135m", dtype=dtype)
    task = TASKS[spec.task]
    return Pair(name=spec.name, student=student, teacher=teacher, task=task, prompt_source=task, chat=True,
                teacher_context=CONCISE_CONTEXT, max_new_tokens=task.max_new_tokens, description=spec.description)


def pruned_member(spec: PairSpec, role: str, dtype: str | torch.dtype) -> LM:
    """`smollm2-pruned`'s teacher (SmolLM2-135M-Instruct) or student (the same weights without
    `PRUNED_BLOCKS`, `mismatch.model.layout.drop_layers`)."""
    lm = load("smollm2-135m", dtype=dtype)
    if role == "student":
        drop_layers(lm.model, PRUNED_BLOCKS)
    return lm


def load_pruned(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """`smollm2-pruned`: `pruned_member`'s teacher and student; both see the questions of the `concise`
    task plainly (no context), and there is no task to score: the pair is judged by its held-out reverse KL."""
    teacher = pruned_member(spec, "teacher", dtype)
    student = pruned_member(spec, "student", dtype)
    questions = TASKS["concise"]
    return Pair(name=spec.name, student=LM(student.model, student.tokenizer, f"{spec.name}/student"), teacher=teacher,
                task=None, prompt_source=questions, chat=True, max_new_tokens=questions.max_new_tokens,
                description=spec.description)


def load_synthetic(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """A pair trained here: committed weights, or the cache (built there first if needed)."""
    directory, manifest = synthetic_dir(spec.build or spec.name, progress)
    student = load(str(directory / "student"), dtype=dtype)
    teacher = load(str(directory / "teacher"), dtype=dtype)
    student = LM(student.model, student.tokenizer, f"{spec.name}/student")
    teacher = LM(teacher.model, teacher.tokenizer, f"{spec.name}/teacher")
    task = TASKS[spec.task]
    return Pair(name=spec.name, student=student, teacher=teacher, task=task, prompt_source=task,
                max_new_tokens=task.max_new_tokens, description=spec.description, info=manifest)


def load_preset(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """Real checkpoints from the local Hugging Face cache, prompted with the default prompt list."""
    missing = preset_availability(spec)
    if missing:
        raise ModelNotAvailableError(
            f"pair {spec.name} needs {spec.teacher} and {spec.student} on disk ({missing}); download them "
            f"where there is network (`hf download {spec.teacher}`) into this machine's Hugging Face "
            "cache, or declare their directories in a pair .toml (see docs/pairs.md)")
    student, teacher = load(spec.student, dtype=dtype), load(spec.teacher, dtype=dtype)
    return Pair(name=spec.name, student=student, teacher=teacher, task=None, prompt_source=PromptList.default(),
                chat=True, max_new_tokens=256, description=spec.description)






def load_toml(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """A user pair: checkpoints (paths relative to the file, or hub ids) and a prompt file."""
    path = spec.source
    if path is None:
        raise InputError(f"pair {spec.name}: a toml pair needs its pair file (PairSpec.source)")
    cfg = read_pair_file(path)

    def resolve(value: str) -> str:  # paths are relative to the TOML file; hub ids stay as they are
        candidate = (path.parent / value).expanduser()
        return str(candidate) if candidate.exists() else value

    dtype = cfg.get("dtype", dtype)
    student, teacher = load(resolve(cfg["student"]), dtype=dtype), load(resolve(cfg["teacher"]), dtype=dtype)
    contexts = {role: (("system", str(cfg[f"{role}_system"])),) if cfg.get(f"{role}_system") else ()
                for role in ("teacher", "student")}
    return Pair(name=spec.name, student=student, teacher=teacher, task=None,
                prompt_source=PromptList.from_file(path.parent / cfg["prompts"]), chat=bool(cfg.get("chat", True)),
                teacher_context=contexts["teacher"], student_context=contexts["student"],
                max_new_tokens=int(cfg.get("max_new_tokens", 256)), description=spec.description)


def synthetic_digest(spec: PairSpec) -> str:
    """The files of a valid build (committed or cached), else the recipe it will be built from; for a rung
    of a shared build (`PairSpec.build`), its task too."""
    name = spec.build or spec.name
    recipe = SYNTHETIC_RECIPES[name]
    task = {} if spec.build is None else {"task": repr(TASKS[spec.task])}
    for directory in (committed_dir(name), cache_build_dir(name)):
        manifest = valid_build(directory, recipe)
        if manifest is not None:
            return content_hash({"files": manifest["files"], **task}) if task else content_hash(manifest["files"])
    return content_hash({"recipe": recipe.digest(), **task}) if task else f"recipe:{recipe.digest()}"


def toml_digest(spec: PairSpec) -> str:
    path = spec.source
    if path is None or not path.is_file():
        return f"unavailable:{path}"
    cfg = read_pair_file(path)
    models = {role: weights_digest(str(path.parent / cfg[role]) if (path.parent / cfg[role]).exists() else cfg[role])
              for role in ("student", "teacher")}
    prompts = path.parent / cfg["prompts"]
    return content_hash({"file": sha256_file(path), **models,
                           "prompts": sha256_file(prompts) if prompts.is_file() else f"unavailable:{prompts}"})


def pretrained_digest(spec: PairSpec) -> str:
    """The weights, and what the pair's code defines: its task's questions and scoring, the teacher's context."""
    task = TASKS[spec.task]
    return content_hash({"weights": weights_digest("smollm2-135m"), "prompts": task.all_prompts(),
                         "task": repr(task), "teacher_context": CONCISE_CONTEXT})


def pruned_digest(spec: PairSpec) -> str:
    """The weights it starts from, its questions, and the blocks its student lacks."""
    return content_hash({"weights": weights_digest("smollm2-135m"), "prompts": TASKS["concise"].all_prompts(),
                         "dropped": PRUNED_BLOCKS})


def preset_digest(spec: PairSpec) -> str:
    """Both checkpoints' files."""
    return content_hash({r: weights_digest(r) for r in (spec.student, spec.teacher)})


register_resolver("pair", load_member)  # `mismatch.load("PAIR:student")`: the model layer knows no pair
