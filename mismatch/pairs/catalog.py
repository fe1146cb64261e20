"""The student–teacher pairs as data: what each pair is (`PAIRS`, `PairSpec`), the registered pair kinds
(`PAIR_KINDS`: the extension point), build recipes, and which model spec a pair's member names — all
without torch (a report reads this). Loading is `mismatch.pairs.load`, building `mismatch.pairs.build`.

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

Each pair kind (`pretrained`, `pruned`, `synthetic`, `preset`, `toml`) is registered once in `PAIR_KINDS`
with its availability check, loader and data digest; `availability`, `load_pair` and `pair_digest` dispatch on
`PairSpec.kind` through it. A new kind registers its own (`register_pair_kind`); the built-in kinds' functions
live in `mismatch.pairs.load` and are imported on first call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from mismatch.errors import InputError, of_type
from mismatch.files import read_toml
from mismatch.registry import Registry

if TYPE_CHECKING:
    import torch

    from mismatch.model.loader import LM
    from mismatch.pairs.load import Pair

Progress = Callable[[str, int, int], None]  # (stage, done, total) of a synthetic pair's build
BUILDER_VERSION = "2"  # bump when the training code (`mismatch.pairs.build`) changes what it produces


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """Size of one model of a synthetic pair (vocabulary: the 259-token byte tokenizer)."""

    family: str  # qwen3 | llama | gpt2
    width: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int = 64

    def __post_init__(self) -> None:
        if self.family not in ("qwen3", "llama", "gpt2"):
            raise ValueError(f"family must be qwen3, llama or gpt2, got {self.family!r}")
        if self.width % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"width {self.width}, heads {self.heads}, kv_heads {self.kv_heads} do not divide")

    def config(self):
        """The `transformers` config of this shape, dropout off, embeddings tied."""
        from transformers import GPT2Config, LlamaConfig, Qwen3Config

        from mismatch.model.tokenizer import byte_tokenizer

        tok = byte_tokenizer()
        special = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
        if self.family == "gpt2":
            return GPT2Config(n_embd=self.width, n_layer=self.layers, n_head=self.heads, n_inner=self.ffn,
                              n_positions=self.context, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                              **special)
        cls = Qwen3Config if self.family == "qwen3" else LlamaConfig
        return cls(hidden_size=self.width, num_hidden_layers=self.layers, num_attention_heads=self.heads,
                   num_key_value_heads=self.kv_heads, intermediate_size=self.ffn,
                   head_dim=self.width // self.heads, max_position_embeddings=self.context, **special)


@dataclass(frozen=True, kw_only=True)
class BuildRecipe:
    """Everything that decides a synthetic pair's weights."""

    task: str
    teacher: ModelShape
    student: ModelShape
    seed: int = 0
    train_pool: int = 40_000  # distinct train-split problems the models learn from
    batch_size: int = 64
    teacher_steps: int = 3000
    teacher_lr: float = 3e-3
    student_lr: float = 1e-3
    student_max_steps: int = 1500
    student_eval_every: int = 25
    student_target: float = 0.3  # sampled (temperature-1) held-out exact match that ends the warm-up
    eval_problems: int = 256  # held-out problems for the accuracies of the build report
    warmup_eval_problems: int = 128  # held-out problems checked during the student warm-up

    def __post_init__(self) -> None:
        if not 0 < self.student_target < 1:
            raise ValueError(f"student_target must be in (0, 1), got {self.student_target}")
        for name in ("train_pool", "batch_size", "teacher_steps", "student_max_steps", "student_eval_every",
                     "eval_problems", "warmup_eval_problems"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")

    def digest(self) -> str:
        """Content hash of the recipe and the builder version (16 hex digits)."""
        text = json.dumps({"recipe": dataclasses.asdict(self), "builder": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


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


def committed_dir(name: str) -> Path:
    """Where the committed weights of a synthetic pair live inside the package."""
    return Path(str(resources.files("mismatch") / "data" / "pairs" / name))


def synthetic_recipe(name: str) -> BuildRecipe:
    """The build recipe of a synthetic pair; `InputError` naming the buildable pairs otherwise."""
    if name not in SYNTHETIC_RECIPES:
        raise InputError(f"only synthetic pairs are built: {', '.join(SYNTHETIC_RECIPES)}; got {name!r}")
    return SYNTHETIC_RECIPES[name]


def read_pair_file(path: Path) -> dict:
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
    cfg = read_pair_file(path)
    return PairSpec(name=str(cfg.get("name", path.stem)), kind="toml", teacher=str(cfg["teacher"]),
                    student=str(cfg["student"]), architecture="from the checkpoints", task="prompts",
                    description=f"user pair from {path}", source=path)


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


def member_spec(spec: str, *, weights_dir: Callable[[str], Path] = committed_dir) -> str:
    """The model spec `mismatch.load` takes for `PAIR:student` / `PAIR:teacher` (a pair's model as a
    probe reference: the synthetic pairs' weight directory, `smollm2-135m`, a preset's hub id);
    any other spec is returned unchanged. `weights_dir(build name)` is where a synthetic pair's weights
    are: the committed directory by default (a report names them without checking or building them); the
    loaders pass `mismatch.pairs.build.synthetic_dir`'s (verified, or built first).

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
        return str(weights_dir(pair.build or name) / role)
    if pair.kind == "pretrained":
        return "smollm2-135m"
    return pair.student if role == "student" else pair.teacher


def availability(spec: PairSpec) -> str | None:
    """None when the pair can be loaded here without the network, else what is missing (one line)."""
    return pair_kind(spec).availability(spec)


def list_pairs(include_unavailable: bool = False) -> list[str]:
    """Names of the registered pairs that load here offline (all of them with `include_unavailable`)."""
    return [name for name, spec in PAIRS.items() if include_unavailable or availability(spec) is None]


def _deferred(name: str) -> Callable:
    """The built-in kinds' function `name` of `mismatch.pairs.load`, imported on its first call (loading needs
    torch; the catalogue does not)."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module("mismatch.pairs.load"), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


register_pair_kind(PairKind(name="pretrained", availability=_deferred("smollm2_availability"),
                            load=_deferred("load_pretrained"), digest=_deferred("pretrained_digest"),
                            description="context distillation on the real SmolLM2-135M-Instruct weights"))
register_pair_kind(PairKind(name="pruned", availability=_deferred("smollm2_availability"),
                            load=_deferred("load_pruned"), digest=_deferred("pruned_digest"),
                            description="a real checkpoint distilled into itself with decoder blocks removed",
                            member=_deferred("pruned_member")))
register_pair_kind(PairKind(name="synthetic", availability=lambda spec: None,  # committed, or built here
                            load=_deferred("load_synthetic"), digest=_deferred("synthetic_digest"),
                            description="small models trained here from scratch (committed or cached weights)"))
register_pair_kind(PairKind(name="preset", availability=_deferred("preset_availability"),
                            load=_deferred("load_preset"), digest=_deferred("preset_digest"),
                            description="real checkpoints from the local Hugging Face cache only"))
register_pair_kind(PairKind(name="toml", availability=lambda spec: None,  # its paths are checked on load
                            load=_deferred("load_toml"), digest=_deferred("toml_digest"),
                            description="a user pair declared in a .toml file (keys in TOML_KEYS)"))
