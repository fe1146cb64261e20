"""The student–teacher pairs: registry, availability, loading (building synthetic ones on demand).

Offline pairs (run here, no network):
  * `smollm2-concise` — context distillation on the real SmolLM2-135M-Instruct weights. The
    teacher is the model given privileged context (a system prompt asking for one-sentence answers
    and three short question/answer turns); the student is the same weights without it. Measured
    here on held-out questions: the teacher gives a short (≤ 30 words, EOS within 64 tokens) answer
    far more often than the student. On-policy distillation with the per-token reverse KL to the
    context-conditioned teacher on the student's own responses is context distillation (Snell et
    al. 2022, "Learning by Distilling Context"; Askell et al. 2021): a fair OPD pair because the
    teacher is a fixed policy over the same vocabulary, the student samples its own responses,
    and the gap is a behaviour the student can learn (the same weights produce it in context).
  * `sort-gpt2`, `reverse-qwen3` — small GPT-2 / Qwen3 models trained here from scratch
    (`mismatch.pairs.build`), teacher ≥ 95% held-out exact match (greedy), student ≥ 4× smaller
    with a short warm-up to 20–60% (of its temperature-1 samples, the policy OPD trains). Their weights are committed under `mismatch/data/pairs/` (built by
    `mismatch pairs build`, keyed by the recipe's hash); a changed recipe is rebuilt into the
    cache (`$MISMATCH_CACHE/pairs/`) on first load.

Presets for real checkpoints (hub ids from the local Hugging Face cache only): Qwen3-8B→1.7B,
Qwen3-4B→0.6B, Llama-3.1-8B-Instruct→Llama-3.2-1B-Instruct. A user pair is a TOML file
(`load_pair("my_pair.toml")`, keys in `TOML_KEYS`).

Each pair kind (`pretrained`, `synthetic`, `preset`, `toml`) is registered once in `PAIR_KINDS`
with its availability check and loader; `availability` and `load_pair` dispatch on
`PairSpec.kind` through it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForCausalLM

from mismatch.errors import InputError, ModelNotAvailableError, VocabMismatchError, of_type
from mismatch.hashing import content_hash
from mismatch.model.layout import drop_layers
from mismatch.model.device import resolve_device
from mismatch.model.loader import LM, cache_dir, load, place, sha256_file, smollm2_checkpoint, smollm2_gguf_path, weights_digest
from mismatch.pairs.build import BuildRecipe, ModelShape, Progress, build
from mismatch.pairs.tasks import BlockSortTask, ConciseTask, PromptList, ReverseTask, SortTask
from mismatch.registry import Registry
from mismatch.model.tokenizer import vocab_fingerprint
from mismatch.files import read_toml

Message = tuple[str, str]  # (role, content) of a chat turn
PRUNED_BLOCKS = tuple(range(18, 24))  # smollm2-pruned's student: SmolLM2 without these 6 of its 30 blocks

CONCISE_CONTEXT: tuple[Message, ...] = (
    ("system", "You are a concise assistant: answer every question in one short sentence."),
    ("user", "What is the boiling point of water?"),
    ("assistant", "Water boils at 100 °C at sea level."),
    ("user", "Who wrote Romeo and Juliet?"),
    ("assistant", "William Shakespeare wrote Romeo and Juliet."),
    ("user", "How do plants get energy?"),
    ("assistant", "Plants turn sunlight into sugar through photosynthesis."),
)


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


@dataclass(frozen=True, kw_only=True)
class PairSpec:
    """A registry entry: what a pair is, before any weights are loaded."""

    name: str
    kind: str  # a registered pair kind: pretrained | synthetic | preset | toml
    teacher: str
    student: str
    architecture: str
    task: str
    description: str
    recipe: BuildRecipe | None = None
    build: str | None = None  # the synthetic build whose weights it loads (default: its own name)
    params: tuple[str, str] = ("?", "?")  # nominal sizes (teacher, student)
    source: Path | None = None  # the pair file of a `toml` pair


@dataclass(frozen=True, kw_only=True)
class PairKind:
    """One registered kind of pair.

    Attributes:
        name: the `PairSpec.kind` it serves.
        availability: `spec -> None` when such a pair loads here offline, else what is missing.
        load: `(spec, dtype, progress) -> Pair`, before the shared vocabulary check.
        digest: `spec -> str`, 16 hex digits identifying the data such a pair reads (weights,
            prompt files) without loading it (`pair_digest`).
        description: one line.
        member: `(spec, role, dtype) -> LM` for a kind whose models are not checkpoints a model spec
            names (a student made by removing blocks): what `PAIR:student` / `PAIR:teacher` load;
            None where `member_spec` names them.
    """

    name: str
    availability: Callable[[PairSpec], str | None]
    load: Callable[[PairSpec, str, Progress | None], Pair]
    digest: Callable[[PairSpec], str]
    description: str
    member: Callable[[PairSpec, str, str | torch.dtype], LM] | None = None


PAIR_KINDS: Registry[PairKind] = Registry("pair kind", InputError)  # read-only mapping


def register_pair_kind(kind: PairKind) -> PairKind:
    """Register a pair kind under its name; returns it. Raises `ValueError` when the name is taken."""
    return PAIR_KINDS.register(kind.name, kind)


def pair_kind(spec: PairSpec) -> PairKind:
    """The registered kind of `spec`.

    Raises:
        InputError: `spec.kind` is not registered.
    """
    return PAIR_KINDS.get(spec.kind)


SYNTHETIC_RECIPES = {
    "sort-gpt2": BuildRecipe(
        task="sort",
        teacher=ModelShape(family="gpt2", width=96, layers=4, heads=4, kv_heads=4, ffn=384),
        student=ModelShape(family="gpt2", width=48, layers=2, heads=4, kv_heads=4, ffn=192),
        teacher_steps=1500),
    "reverse-qwen3": BuildRecipe(
        task="reverse",
        teacher=ModelShape(family="qwen3", width=96, layers=4, heads=4, kv_heads=2, ffn=256),
        student=ModelShape(family="qwen3", width=48, layers=2, heads=4, kv_heads=2, ffn=128),
        teacher_steps=1000),
}
TASKS = {"sort": SortTask(), "reverse": ReverseTask(), "concise": ConciseTask(), "sortk": BlockSortTask()}

_PRESETS = {
    "qwen3-8b-to-1.7b": ("Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B", "Qwen3", ("8.2B", "1.7B")),
    "qwen3-4b-to-0.6b": ("Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B", "Qwen3", ("4.0B", "0.6B")),
    "llama3.1-8b-to-3.2-1b": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
                              "Llama", ("8.0B", "1.2B")),
}

PAIRS: dict[str, PairSpec] = {
    "smollm2-concise": PairSpec(
        name="smollm2-concise", kind="pretrained", teacher="smollm2-135m + concise context",
        student="smollm2-135m", architecture="Llama (SmolLM2)", task="concise",
        description="context distillation of short answers on SmolLM2-135M-Instruct", params=("134.5M", "134.5M")),
    "smollm2-pruned": PairSpec(
        name="smollm2-pruned", kind="pruned", teacher="smollm2-135m", student=f"smollm2-135m less blocks "
        f"{PRUNED_BLOCKS[0]}–{PRUNED_BLOCKS[-1]}", architecture="Llama (SmolLM2)", task="chat (KL only)",
        description="SmolLM2-135M-Instruct distilled into itself with part of its decoder removed, on general "
                    "questions, judged by held-out reverse KL", params=("134.5M", "113.3M")),
    **{name: PairSpec(name=name, kind="synthetic", teacher=f"{r.teacher.layers} layers × {r.teacher.width}",
                      student=f"{r.student.layers} layers × {r.student.width}",
                      architecture={"gpt2": "GPT-2", "qwen3": "Qwen3"}[r.teacher.family], task=r.task,
                      description=f"{r.task} task, trained here from scratch", recipe=r)
       for name, r in SYNTHETIC_RECIPES.items()},
    **{name: PairSpec(name=name, kind="preset", teacher=t, student=s, architecture=arch, task="prompts (chat)",
                      description=f"{t} → {s}, local Hugging Face cache only", params=sizes)
       for name, (t, s, arch, sizes) in _PRESETS.items()},
}

TOML_KEYS = {"name", "student", "teacher", "prompts", "chat", "dtype", "teacher_system", "student_system",
             "max_new_tokens"}


# ---------------------------------------------------------------- availability


def _in_hf_cache(repo_id: str) -> bool:
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _preset_availability(spec: PairSpec) -> str | None:
    missing = [r for r in (spec.teacher, spec.student) if not _in_hf_cache(r)]
    return f"missing from the local Hugging Face cache: {', '.join(missing)}" if missing else None


def _pretrained_availability(spec: PairSpec) -> str | None:
    try:
        smollm2_gguf_path()
    except ModelNotAvailableError as exc:
        return str(exc)
    return None


def _always_available(spec: PairSpec) -> str | None:
    return None  # synthetic pairs are committed or built here; a TOML pair's paths are checked on load


def availability(spec: PairSpec) -> str | None:
    """None when the pair can be loaded here without the network, else what is missing (one line)."""
    return pair_kind(spec).availability(spec)


def list_pairs(include_unavailable: bool = False) -> list[str]:
    """Names of the registered pairs that load here offline (all of them with `include_unavailable`)."""
    return [name for name, spec in PAIRS.items() if include_unavailable or availability(spec) is None]


# ---------------------------------------------------------------- synthetic weights


def committed_dir(name: str) -> Path:
    """Where the committed weights of a synthetic pair live inside the package."""
    return Path(str(resources.files("mismatch") / "data" / "pairs" / name))


def cache_build_dir(name: str) -> Path:
    """Where a synthetic pair built here is cached, keyed by its recipe's hash."""
    return cache_dir() / "pairs" / f"{name}-{SYNTHETIC_RECIPES[name].digest()}"


def _valid_build(directory: Path, recipe: BuildRecipe) -> dict | None:
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("recipe_hash") != recipe.digest():
        return None
    for rel, digest in manifest["files"].items():
        if not (directory / rel).is_file() or sha256_file(directory / rel) != digest:
            return None
    return manifest


def synthetic_dir(name: str, progress: Progress | None = None) -> tuple[Path, dict]:
    """Directory and manifest of a synthetic pair's weights: the committed ones when their recipe
    hash and file hashes match, else the cache, building there first if needed."""
    recipe = SYNTHETIC_RECIPES[name]
    for directory in (committed_dir(name), cache_build_dir(name)):
        manifest = _valid_build(directory, recipe)
        if manifest is not None:
            return directory, manifest
    return build_pair(name, progress=progress)


def synthetic_recipe(name: str) -> BuildRecipe:
    """The build recipe of a synthetic pair; `InputError` naming the buildable pairs otherwise."""
    if name not in SYNTHETIC_RECIPES:
        raise InputError(f"only synthetic pairs are built: {', '.join(SYNTHETIC_RECIPES)}; got {name!r}")
    return SYNTHETIC_RECIPES[name]


def build_pair(name: str, out_dir: Path | None = None, progress: Progress | None = None) -> tuple[Path, dict]:
    """Build a synthetic pair from scratch into `out_dir` (default: its cache directory),
    replacing what is there only once the build succeeded. Returns the directory and manifest."""
    recipe = synthetic_recipe(name)
    target = Path(out_dir) if out_dir is not None else cache_build_dir(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
    try:
        manifest = build(recipe, TASKS[recipe.task], staging, progress)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, manifest


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


@dataclass(frozen=True)
class BuildReport:
    """A finished build: where it went, its manifest, and whether it reproduced the committed
    weights (None when there is nothing to compare with, or it replaced them)."""

    name: str
    directory: Path
    manifest: dict
    same_as_committed: bool | None

    def summary(self) -> str:
        """One line: accuracies, sizes, build time, destination, and the comparison."""
        m = self.manifest
        line = (f"{self.name}: held-out exact match teacher {m['teacher_accuracy']:.1%} (greedy) / "
                f"student {m['student_accuracy']:.1%} (temperature-1 samples) "
                f"({m['teacher_params']:,} / {m['student_params']:,} parameters), "
                f"built in {m['build_seconds']:.0f} s -> {self.directory}")
        if self.same_as_committed is None:
            return line
        return line + f"; identical to the committed weights: {'yes' if self.same_as_committed else 'no'}"


def build_targets(name: str | None, out_dir: Path | None) -> list[str]:
    """The synthetic pairs `mismatch pairs build [NAME] [--out DIR]` builds: NAME, or all of them.

    Raises:
        InputError: NAME is not a synthetic pair, or `out_dir` is given for more than one pair.
    """
    names = [name] if name is not None else list(SYNTHETIC_RECIPES)
    if out_dir is not None and len(names) != 1:
        raise InputError("--out needs exactly one pair NAME")
    for n in names:
        synthetic_recipe(n)  # an unknown name fails before any work
    return names


def build_and_compare(name: str, out_dir: Path | None = None, progress: Progress | None = None) -> BuildReport:
    """`build_pair`, then compare the new weights' hashes with the committed build's."""
    directory, manifest = build_pair(name, out_dir, progress)
    committed = committed_dir(name) / "manifest.json"
    same = None
    if committed.is_file() and directory.resolve() != committed.parent.resolve():
        same = json.loads(committed.read_text()).get("files") == manifest["files"]
    return BuildReport(name, directory, manifest, same)


# ---------------------------------------------------------------- loading


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


def pair_spec(name: str) -> PairSpec:
    """The `PairSpec` of a registered name or of a pair `.toml` file.

    Raises:
        InputError: unknown name, bad TOML.
    """
    if name.endswith(".toml"):
        return toml_spec(Path(name).expanduser())
    if name in PAIRS:
        return PAIRS[name]
    raise InputError(f"unknown pair {name!r}; known: {', '.join(PAIRS)} (or a path to a pair .toml)")


MEMBER_ROLES = ("student", "teacher")


def member_spec(spec: str, *, build: bool = True) -> str:
    """The model spec `mismatch.load` takes for `PAIR:student` / `PAIR:teacher` (a pair's model as a
    probe reference: the synthetic pairs' weight directory, `smollm2-135m`, a preset's hub id);
    any other spec is returned unchanged. `build=False` (what reports use: they read results, never
    train) names the committed weight directory of a synthetic pair without checking or building it.

    Raises:
        InputError: `PAIR:ROLE` with an unknown pair or role.
    """
    of_type(spec, (str, os.PathLike), "a model spec")
    spec = os.fspath(spec)
    name, sep, role = spec.rpartition(":")
    if not sep or name not in PAIRS:
        return spec
    if role not in MEMBER_ROLES:
        raise InputError(f"{spec}: a pair's model is PAIR:student or PAIR:teacher")
    pair = PAIRS[name]
    if pair_kind(pair).member is not None:
        return spec  # not a checkpoint: `load_member` builds it
    if pair.kind == "synthetic":
        build_name = pair.build or name
        return str((synthetic_dir(build_name)[0] if build else committed_dir(build_name)) / role)
    if pair.kind == "pretrained":
        return "smollm2-135m"
    return pair.student if role == "student" else pair.teacher


def _built_member(spec: str) -> tuple[PairSpec, str] | None:
    """`(pair, role)` when `spec` is `PAIR:ROLE` of a kind whose members are built, not named by a model spec
    (`PairKind.member`); None otherwise. Raises what `member_spec` raises (type, unknown role)."""
    member_spec(spec, build=False)  # checks the type and the role; builds nothing
    name, _, role = os.fspath(spec).rpartition(":")
    pair = PAIRS.get(name)
    return (pair, role) if pair is not None and pair_kind(pair).member is not None else None


def load_member(spec: str, **kwargs) -> LM:
    """Load a model from local files only: `mismatch.load`, which takes everything the CLI takes.

    Args:
        spec: a built-in name (`mismatch.list_models()`), a pair's model (`PAIR:student`,
            `PAIR:teacher`, `mismatch.list_pairs()`), a local checkpoint directory, or a hub id in the
            local Hugging Face cache.
        kwargs: `dtype` (`"fp32"` default, `"bf16"`, `"fp16"` or a `torch.dtype`), `seed` (of the tiny
            random-init models), `device` (`"cpu"` default, `"cuda[:N]"`, `"auto"`), as
            `mismatch.model.loader.load` takes them.

    Returns:
        `LM(model, tokenizer, name=spec)` in eval mode on `device`.

    Raises:
        ModelNotAvailableError, InputError: the spec cannot be resolved without the network; an unknown
            device, or CUDA asked for where none is present.
    """
    built = _built_member(spec)
    if built is not None:
        device = kwargs.get("device", "cpu")
        resolve_device(device)  # before building the member: a wrong device fails at once
        pair, role = built
        lm = pair_kind(pair).member(pair, role, kwargs.get("dtype", torch.float32))
        place(lm.model, device)
    else:
        lm = load(member_spec(spec), **kwargs)
    return LM(lm.model, lm.tokenizer, os.fspath(spec))


def member_digest(spec: str) -> str:
    """16 hex digits identifying the weights `load_member(spec)` reads, without loading them: the files'
    (`mismatch.model.loader.weights_digest`), or for a pair member that is not a checkpoint, the pair's
    data and the role."""
    built = _built_member(spec)
    if built is not None:
        return content_hash({"pair": pair_digest(built[0].name), "role": built[1]})
    return weights_digest(member_spec(spec))


def student_architecture(pair: str):
    """The pair student's architecture on the meta device, from its `config.json` (shapes only, no weight
    read): what the rollout cost factors need when a run is written (`mismatch.rollout_cost.cost_factors`).

    Raises:
        MismatchError: the pair is unknown here, or its student has no local `config.json`.
    """
    spec = member_spec(f"{pair}:student")
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


def _load_pretrained(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """`smollm2-concise`: the same SmolLM2 weights twice; the teacher gets the concise context."""
    student, teacher = load("smollm2-135m", dtype=dtype), load("smollm2-135m", dtype=dtype)
    task = TASKS[spec.task]
    return Pair(name=spec.name, student=student, teacher=teacher, task=task, prompt_source=task, chat=True,
                teacher_context=CONCISE_CONTEXT, max_new_tokens=task.max_new_tokens, description=spec.description)


def _pruned_member(spec: PairSpec, role: str, dtype: str | torch.dtype) -> LM:
    """`smollm2-pruned`'s teacher (SmolLM2-135M-Instruct) or student (the same weights without
    `PRUNED_BLOCKS`, `mismatch.model.layout.drop_layers`)."""
    lm = load("smollm2-135m", dtype=dtype)
    if role == "student":
        drop_layers(lm.model, PRUNED_BLOCKS)
    return lm


def _load_pruned(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """`smollm2-pruned`: `_pruned_member`'s teacher and student; both see the questions of the `concise`
    task plainly (no context), and there is no task to score: the pair is judged by its held-out reverse KL."""
    teacher = _pruned_member(spec, "teacher", dtype)
    student = _pruned_member(spec, "student", dtype)
    questions = TASKS["concise"]
    return Pair(name=spec.name, student=LM(student.model, student.tokenizer, f"{spec.name}/student"), teacher=teacher,
                task=None, prompt_source=questions, chat=True, max_new_tokens=questions.max_new_tokens,
                description=spec.description)


def _load_synthetic(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """A pair trained here: committed weights, or the cache (built there first if needed)."""
    directory, manifest = synthetic_dir(spec.build or spec.name, progress)
    student = load(str(directory / "student"), dtype=dtype)
    teacher = load(str(directory / "teacher"), dtype=dtype)
    student = LM(student.model, student.tokenizer, f"{spec.name}/student")
    teacher = LM(teacher.model, teacher.tokenizer, f"{spec.name}/teacher")
    task = TASKS[spec.task]
    return Pair(name=spec.name, student=student, teacher=teacher, task=task, prompt_source=task,
                max_new_tokens=task.max_new_tokens, description=spec.description, info=manifest)


def _load_preset(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """Real checkpoints from the local Hugging Face cache, prompted with the default prompt list."""
    missing = _preset_availability(spec)
    if missing:
        raise ModelNotAvailableError(
            f"pair {spec.name} needs {spec.teacher} and {spec.student} on disk ({missing}); download them "
            f"where there is network (`hf download {spec.teacher}`) into this machine's Hugging Face "
            "cache, or declare their directories in a pair .toml (see docs/pairs.md)")
    student, teacher = load(spec.student, dtype=dtype), load(spec.teacher, dtype=dtype)
    return Pair(name=spec.name, student=student, teacher=teacher, task=None, prompt_source=PromptList.default(),
                chat=True, max_new_tokens=256, description=spec.description)


def _read_toml(path: Path) -> dict:
    """A pair file's keys, checked: it exists, parses, has only `TOML_KEYS` and the required ones."""
    cfg = read_toml(path, "pair file")
    unknown = sorted(set(cfg) - TOML_KEYS)
    if unknown:
        raise InputError(f"{path}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(TOML_KEYS))}")
    missing = sorted({"student", "teacher", "prompts"} - set(cfg))
    if missing:
        raise InputError(f"{path}: missing key(s) {', '.join(missing)}")
    for role in ("teacher", "student"):
        if cfg.get(f"{role}_system") is not None and not cfg.get("chat", True):
            raise InputError(f"{path}: {role}_system needs chat = true")
    return cfg


def toml_spec(path: Path) -> PairSpec:
    """The `PairSpec` of a user pair file (checked; no weights loaded).

    Raises:
        InputError: the file is missing, not TOML, or has unknown / missing keys.
    """
    cfg = _read_toml(path)
    return PairSpec(name=str(cfg.get("name", path.stem)), kind="toml", teacher=str(cfg["teacher"]),
                    student=str(cfg["student"]), architecture="from the checkpoints", task="prompts",
                    description=f"user pair from {path}", source=path)


def _load_toml(spec: PairSpec, dtype: str, progress: Progress | None) -> Pair:
    """A user pair: checkpoints (paths relative to the file, or hub ids) and a prompt file."""
    path = spec.source
    if path is None:
        raise InputError(f"pair {spec.name}: a toml pair needs its pair file (PairSpec.source)")
    cfg = _read_toml(path)

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


def _synthetic_digest(spec: PairSpec) -> str:
    """The files of a valid build (committed or cached), else the recipe it will be built from; for a rung
    of a shared build (`PairSpec.build`), its task too."""
    name = spec.build or spec.name
    recipe = SYNTHETIC_RECIPES[name]
    task = {} if spec.build is None else {"task": repr(TASKS[spec.task])}
    for directory in (committed_dir(name), cache_build_dir(name)):
        manifest = _valid_build(directory, recipe)
        if manifest is not None:
            return content_hash({"files": manifest["files"], **task}) if task else content_hash(manifest["files"])
    return content_hash({"recipe": recipe.digest(), **task}) if task else f"recipe:{recipe.digest()}"


def _toml_digest(spec: PairSpec) -> str:
    path = spec.source
    if path is None or not path.is_file():
        return f"unavailable:{path}"
    cfg = _read_toml(path)
    models = {role: weights_digest(str(path.parent / cfg[role]) if (path.parent / cfg[role]).exists() else cfg[role])
              for role in ("student", "teacher")}
    prompts = path.parent / cfg["prompts"]
    return content_hash({"file": sha256_file(path), **models,
                           "prompts": sha256_file(prompts) if prompts.is_file() else f"unavailable:{prompts}"})


def _pretrained_digest(spec: PairSpec) -> str:
    """The weights, and what the pair's code defines: its task's questions and scoring, the teacher's context."""
    task = TASKS[spec.task]
    return content_hash({"weights": weights_digest("smollm2-135m"), "prompts": task.all_prompts(),
                         "task": repr(task), "teacher_context": CONCISE_CONTEXT})


register_pair_kind(PairKind(name="pretrained", availability=_pretrained_availability, load=_load_pretrained,
                            digest=_pretrained_digest,
                            description="context distillation on the real SmolLM2-135M-Instruct weights"))
register_pair_kind(PairKind(name="pruned", availability=_pretrained_availability, load=_load_pruned,
                            digest=lambda spec: content_hash({"weights": weights_digest("smollm2-135m"),
                                                              "prompts": TASKS["concise"].all_prompts(),
                                                              "dropped": PRUNED_BLOCKS}),
                            description="a real checkpoint distilled into itself with decoder blocks removed",
                            member=_pruned_member))
register_pair_kind(PairKind(name="synthetic", availability=_always_available, load=_load_synthetic,
                            digest=_synthetic_digest,
                            description="small models trained here from scratch (committed or cached weights)"))
register_pair_kind(PairKind(name="preset", availability=_preset_availability, load=_load_preset,
                            digest=lambda spec: content_hash({r: weights_digest(r) for r in (spec.student, spec.teacher)}),
                            description="real checkpoints from the local Hugging Face cache only"))
register_pair_kind(PairKind(name="toml", availability=_always_available, load=_load_toml, digest=_toml_digest,
                            description="a user pair declared in a .toml file (keys in TOML_KEYS)"))
