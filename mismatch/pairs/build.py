"""Train a synthetic student–teacher pair from scratch, deterministically, on the CPU.

Recipe (`BuildRecipe`, one frozen config per pair):
  1. the teacher, a small real `transformers` model, is trained by supervised next-token
     cross-entropy on the response tokens (answer + EOS) of train-split problems until it solves
     held-out problems greedily (≥ 95% exact match is checked at the end);
  2. the student, ≥ 4× fewer parameters, same tokenizer, gets a short supervised warm-up on the
     same data that stops at the first evaluation reaching `student_target` held-out exact match
     of its *sampled* responses (temperature 1, a fixed seed; evaluated every `student_eval_every`
     steps), so it starts between 20% and 60% and on-policy distillation has room to improve it.
     Sampled, not greedy: OPD trains on the student's temperature-1 samples, so that is the
     policy whose accuracy matters. (Stopping on greedy accuracy left students whose greedy
     answers were 30% right but whose samples were right 0.5–2% of the time: OPD then trained
     almost only on broken prefixes and lowered the KL without raising accuracy.)

Everything is seeded (`torch.Generator`s and `random.Random` from `recipe.seed`, dropout off)
and runs on a fixed number of threads, so building twice gives bit-identical weights on one
machine. `recipe_hash` keys the cache: change any number of the recipe (or `BUILDER_VERSION`)
and the pair is rebuilt.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from mismatch.errors import InputError
from mismatch.model.device import seeded
from mismatch.files import cache_dir
from mismatch.hashing import sha256_file
from mismatch.model.loader import LM, quiet_loading
from mismatch.pairs.evaluate import greedy_accuracy, sampled_accuracy
from mismatch.pairs.catalog import (SYNTHETIC_RECIPES, BuildRecipe, ModelShape, Progress,
                                    committed_dir, synthetic_recipe)
from mismatch.pairs.tasks import TASKS, SyntheticTask
from mismatch.model.tokenizer import byte_tokenizer

SAMPLE_SEED = 7919  # offset of the sampling seed of the student's accuracy
BUILD_THREADS = 2  # fixed: BLAS reductions (hence the weights' last bits) depend on the thread count







def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied head counts once)."""
    return sum(p.numel() for p in model.parameters())


def init_model(shape: ModelShape, seed: int) -> PreTrainedModel:
    """A freshly initialised model of `shape`, deterministic in `seed`."""
    with seeded(seed, torch.device("cpu")):
        return AutoModelForCausalLM.from_config(shape.config(), dtype=torch.float32)


def _examples(task: SyntheticTask, prompts: list[str]) -> list[tuple[list[int], int]]:
    """`(prompt + answer + EOS ids, prompt length)` per prompt."""
    tok = byte_tokenizer()
    out = []
    for p in prompts:
        prompt_ids = tok(p)["input_ids"]
        answer_ids = tok(task.answer(p))["input_ids"] + [tok.eos_token_id]
        out.append((prompt_ids + answer_ids, len(prompt_ids)))
    return out


def _batch(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded `[B, T]` ids, attention mask and labels (-100 outside the responses)."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (seq, n_prompt) in enumerate(examples):
        ids[row, : len(seq)] = torch.tensor(seq)
        attn[row, : len(seq)] = 1
        labels[row, n_prompt: len(seq)] = torch.tensor(seq[n_prompt:])
    return ids, attn, labels


def supervised_steps(model: PreTrainedModel, examples: list[tuple[list[int], int]], *, steps: int,
                     lr: float, batch_size: int, seed: int,
                     on_step: Callable[[int, float], bool] | None = None) -> int:
    """AdamW on response-token cross-entropy, linear warm-up (5%) then cosine decay to 10% of `lr`.

    Args:
        examples: `(ids, prompt_length)` pairs; batches are drawn by a `random.Random(seed)`.
        on_step: called as `on_step(step, loss_nats)` after each step; returning True stops early.

    Returns:
        The number of steps taken.
    """
    tok = byte_tokenizer()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    rng = random.Random(seed)
    model.train()
    step = 0
    for step in range(1, steps + 1):
        ids, attn, labels = _batch(rng.sample(examples, batch_size), tok.pad_token_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if on_step is not None and on_step(step, float(loss.detach())):
            break
    model.eval()
    return step


def _warm_up_student(recipe: BuildRecipe, task: SyntheticTask, examples, warm_eval: list[str], tok,
                     progress: Progress | None) -> tuple[PreTrainedModel, int, list[tuple[int, float]]]:
    """Step 2: supervised warm-up of a fresh student until its temperature-1 samples reach
    `student_target` exact match on `warm_eval` (checked every `student_eval_every` steps).
    Returns the student, the steps taken and the curve `[(step, sampled accuracy)]`."""
    student = init_model(recipe.student, recipe.seed + 1)
    lm = LM(student, tok, "student")
    curve: list[tuple[int, float]] = []

    def student_step(step: int, _loss: float) -> bool:
        if progress:
            progress("student warm-up", step, recipe.student_max_steps)
        if step % recipe.student_eval_every:
            return False
        acc = sampled_accuracy(lm, task, warm_eval, seed=recipe.seed + SAMPLE_SEED)
        student.train()
        curve.append((step, acc))
        return acc >= recipe.student_target

    steps = supervised_steps(student, examples, steps=recipe.student_max_steps, lr=recipe.student_lr,
                             batch_size=recipe.batch_size, seed=recipe.seed + 1, on_step=student_step)
    return student, steps, curve


def train_pair(recipe: BuildRecipe, task: SyntheticTask,
               progress: Progress | None = None) -> tuple[PreTrainedModel, PreTrainedModel, dict]:
    """Train teacher and student of `recipe` (steps 1 and 2 of the module docstring).

    Returns:
        `(teacher, student, report)`, both models in eval mode; the report holds parameter
        counts, held-out exact match (on `recipe.eval_problems` problems) of the teacher's greedy
        responses (`teacher_accuracy`) and of the student's temperature-1 samples
        (`student_accuracy`), the other of each for reference, the warm-up curve
        `[(step, sampled accuracy)]`, seconds and versions.
    """
    if task.name != recipe.task:
        raise InputError(f"recipe is for task {recipe.task!r}, got {task.name!r}")
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    tok = byte_tokenizer()
    try:
        examples = _examples(task, task.prompts("train", recipe.train_pool, seed=recipe.seed))
        held_out = task.prompts("held_out", recipe.eval_problems, seed=recipe.seed)
        warm_eval = held_out[: recipe.warmup_eval_problems]

        teacher = init_model(recipe.teacher, recipe.seed)
        supervised_steps(teacher, examples, steps=recipe.teacher_steps, lr=recipe.teacher_lr,
                         batch_size=recipe.batch_size, seed=recipe.seed,
                         on_step=(lambda s, _l: progress("teacher", s, recipe.teacher_steps) or False)
                         if progress else None)
        teacher_acc = greedy_accuracy(LM(teacher, tok, "teacher"), task, held_out)

        student, steps, warm_curve = _warm_up_student(recipe, task, examples, warm_eval, tok, progress)
        student_acc = sampled_accuracy(LM(student, tok, "student"), task, held_out, seed=recipe.seed + SAMPLE_SEED)
        student_greedy = greedy_accuracy(LM(student, tok, "student"), task, held_out)
        teacher_sampled = sampled_accuracy(LM(teacher, tok, "teacher"), task, held_out, seed=recipe.seed + SAMPLE_SEED)
    finally:
        torch.set_num_threads(threads)
    report = {
        "recipe": dataclasses.asdict(recipe), "recipe_hash": recipe.digest(),
        "teacher_params": parameter_count(teacher), "student_params": parameter_count(student),
        "teacher_accuracy": teacher_acc, "student_accuracy": student_acc,
        "teacher_sampled_accuracy": teacher_sampled, "student_greedy_accuracy": student_greedy,
        "student_warmup_steps": steps, "student_warmup_curve": warm_curve,
        "held_out_problems": len(held_out), "build_seconds": round(time.perf_counter() - start, 1),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    return teacher, student, report


def build(recipe: BuildRecipe, task: SyntheticTask, out_dir: Path, progress: Progress | None = None) -> dict:
    """Train a pair (`train_pair`), check its accuracy bounds, save it under `out_dir`.

    Writes `out_dir/teacher/` and `out_dir/student/` (each a Hugging Face checkpoint: config,
    `model.safetensors`, tokenizer) and `out_dir/manifest.json` (the report of `train_pair` plus
    the SHA-256 of each weight file).

    Raises:
        InputError: the teacher ends below 95% greedy or the student outside 20–60% sampled
            held-out exact match (the recipe needs retuning); nothing is written then.
    """
    teacher, student, report = train_pair(recipe, task, progress)
    if report["teacher_accuracy"] < 0.95 or not 0.2 <= report["student_accuracy"] <= 0.6:
        raise InputError(f"recipe for {recipe.task} missed its bounds: teacher {report['teacher_accuracy']:.1%} "
                         f"(need ≥ 95%), student {report['student_accuracy']:.1%} sampled after "
                         f"{report['student_warmup_steps']} warm-up steps (need 20–60%)")
    tok = byte_tokenizer()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for role, model in (("teacher", teacher), ("student", student)):
        with quiet_loading():
            model.save_pretrained(out_dir / role)
            tok.save_pretrained(out_dir / role)
        files[f"{role}/model.safetensors"] = sha256_file(out_dir / role / "model.safetensors")
    report["files"] = files
    (out_dir / "manifest.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


# ---------------------------------------------------------------- the builds of the catalogue's synthetic pairs


def cache_build_dir(name: str) -> Path:
    """Where a synthetic pair built here is cached, keyed by its recipe's hash."""
    return cache_dir() / "pairs" / f"{name}-{SYNTHETIC_RECIPES[name].digest()}"


def valid_build(directory: Path, recipe: BuildRecipe) -> dict | None:
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
        manifest = valid_build(directory, recipe)
        if manifest is not None:
            return directory, manifest
    return build_pair(name, progress=progress)


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
