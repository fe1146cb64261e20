"""On-policy distillation under training–inference mismatch: `train()` and its named steps.

`train(config)` reads as its steps (tinker-cookbook's on-policy loop, torchtune's recipes):
  1. `sample_rollouts` — the rollout copy (`RolloutCopy`: the student itself, a perturbed copy, or
     weights K steps old) samples one response per prompt with its own per-token log-probs;
  2. `score_with_teacher` — the teacher's head inputs at the response tokens (after its own
     context, if the pair gives it one);
  3. `update` — the student is scored on the same tokens with gradients; the loss (`losses.py`) is
     summed over token chunks — only `[chunk, V]` logits exist at a time: the head runs on a
     detached copy of the student's head inputs, each chunk back-propagates into it, and the trunk
     back-propagates once — then AdamW updates the student;
  4. `refresh` — the rollout copy follows the new weights (re-quantized, re-noised, or the ring of
     past weights advanced);
  5. `evaluate` (`mismatch.opd.evaluate`) — every `eval_every` steps (and at steps 0 and last): the teacher–student reverse
     KL on the student's own temperature-1 samples of fixed held-out prompts and, when the pair has
     a task, the exact match of those samples (`heldout_accuracy`, with its standard error), of greedy
     responses, and for a task with one correct response its expectation computed exactly.
Models stay in eval mode (dropout off) so the only difference between rollout and training
policies is the configured mismatch. The learning rate warms up linearly, then decays (cosine by
default, `lr_factor`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mismatch.errors import InputError, NumericsError
from mismatch.model.head import CACHE_ROWS, Head, is_identity_warp, logprob_chunks, token_chunks
from mismatch.metrics import rollout_stats, sampled_token_metrics
from mismatch.model.device import resolve_device
from mismatch.model.loader import LM, parse_dtype, quiet_loading
from mismatch.opd.config import OPDConfig, lr_factor
from mismatch.opd.precision import MasterWeights, cast_parameters_
from mismatch.opd.losses import get_loss, tis_weights, token_loss
from mismatch.rollout.copy import RolloutCopy, rollout_seed
from mismatch.verdict import diverged
from mismatch.pairs.load import Pair, load_pair
from mismatch.model.generate import Batch, Samples, encode, generate, reprompt, response_hidden, token_logprobs
from mismatch.opd.evaluate import copy_heldout_rkl, evaluate, initial_evaluation, probe_copy

Progress = Callable[[int, int, dict[str, float]], None]  # (step, steps, latest metrics)


@dataclass
class StepResult:
    loss: float
    logp_student: torch.Tensor  # [N] log π_S(y) of the sampled tokens, no grad
    logp_seconds: float  # time spent computing logp_student (only the mismatch metrics and TIS need it)


def teacher_hidden(teacher, teacher_batch: Batch) -> torch.Tensor:
    """The teacher's head inputs `[N, D]` at the response tokens' predicting positions, no grad; the
    tokens every row starts with (its context turns) run once (`head_inputs(share_prefix=True)`)."""
    with torch.no_grad():
        return response_hidden(teacher, teacher_batch, share_prefix=True)


def loss_backward(student, teacher, student_batch: Batch, teacher_hidden_ND: torch.Tensor,
                  logp_rollout_N: torch.Tensor | None, *, loss: str, tis_cap: float | None, chunk_tokens: int, temperature: float = 1.0,
                  top_p: float | None = None) -> StepResult:
    """Compute the OPD loss on a rollout batch and back-propagate it into the student.

    Args:
        student_batch: the rollout batch (the student's prompts and the response tokens).
        teacher_hidden_ND: `teacher_hidden(...)` on the same response tokens after the teacher's prompts.
        logp_rollout_N: `[N]` rollout log-probs of the response tokens (row-major order); None when
            the student itself sampled them with these weights: its log-probs from this pass are the
            rollout's, the same numbers a separate pass gives (one code path), without that pass.
        loss: one of `LOSSES`; tis_cap: truncated importance sampling cap or None.

    Returns:
        The loss value (mean over the N response tokens, nats) and the student's log-probs of the
        sampled tokens under the rollout's sampling `warp` (for the mismatch metrics and TIS).
    """
    student_hidden_ND = response_hidden(student, student_batch, share_prefix=True)  # [N, D], carries the trunk's graph
    token_N = student_batch.input_ids[student_batch.response_mask.bool()].to(student_hidden_ND.device)
    n = token_N.shape[0]
    leaf = student_hidden_ND.detach().requires_grad_()
    student_head = Head.of(student)
    t0 = time.perf_counter()
    warped = not is_identity_warp(temperature, top_p)  # else the sampled distribution is the policy itself
    student_logp_N = (token_logprobs(student_head, leaf.detach(), token_N, chunk_tokens, temperature=temperature, top_p=top_p)
                if warped else torch.empty(n, device=leaf.device))
    logp_seconds = time.perf_counter() - t0
    if logp_rollout_N is None:  # filled chunk by chunk below before any use, as `student_logp_N` is
        logp_rollout_N = student_logp_N
    logp_rollout_N = logp_rollout_N.to(leaf.device)  # a sampler's log-probs live on the CPU
    weighted = get_loss(loss).weighted
    teacher_parts = logprob_chunks(Head.of(teacher), teacher_hidden_ND, chunk_tokens, rows_per_pass=CACHE_ROWS)
    total = 0.0
    for rows in token_chunks(n, chunk_tokens):
        z_CV = student_head.logits(leaf[rows])  # one head matmul per chunk; carries the graph to `leaf` and the head
        grad_CV, terms_C = torch.empty_like(z_CV), torch.empty(z_CV.shape[0], device=z_CV.device)
        for part in token_chunks(z_CV.shape[0], CACHE_ROWS):  # the elementwise work, a few cached rows at a time
            r = slice(rows.start + part.start, rows.start + part.stop)
            z_PV = z_CV[part].detach().requires_grad_()
            student_logp_PV = torch.log_softmax(z_PV, dim=-1)
            with torch.no_grad():
                teacher_logp_PV = next(teacher_parts)[1]
                if not warped:
                    student_logp_N[r] = student_logp_PV.detach().gather(-1, token_N[r].unsqueeze(-1)).squeeze(-1)
            terms = token_loss(loss, student_logp_PV, teacher_logp_PV, token_N[r], logp_rollout_N[r], tis_cap)
            if tis_cap is not None and not weighted:
                terms = terms * tis_weights(student_logp_N[r], logp_rollout_N[r], tis_cap)
            (terms.sum() / n).backward()  # each row's gradient is what one pass over the chunk gives it
            grad_CV[part], terms_C[part] = z_PV.grad, terms.detach()
        z_CV.backward(grad_CV)
        total += float(terms_C.sum() / n)
    student_hidden_ND.backward(leaf.grad)
    return StepResult(total, student_logp_N, logp_seconds)


# ---------------------------------------------------------------- the run and its steps


@dataclass
class TrainingBatch:
    """A sampled rollout batch with the teacher's head inputs on it, and how many updates used it."""

    rollout: Samples
    teacher_hidden_ND: torch.Tensor  # [N, D]
    updates: int = 0


@dataclass
class OPDRun:
    """The live state of one run: the pair, the rollout copy, the optimizer, the prompt pools, and
    the current rollout batch (trained on for `config.rollout_spec.reuse` steps before a new one)."""

    config: OPDConfig
    pair: Pair
    rollout_copy: RolloutCopy
    weights: MasterWeights  # what the optimizer steps: the student's parameters, or fp32 masters of a bf16 copy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rng: random.Random
    train_pool: list[str]
    eval_set: list[str]
    max_new_tokens: int
    batch: TrainingBatch | None = None

    @property
    def student(self) -> LM:
        return self.pair.student


def setup(config: OPDConfig, pair: Pair | None = None) -> OPDRun:
    """Load (or take) the pair onto the run's device in the trainer's precision (`mismatch.opd.precision`: a
    given pair's models are moved and cast in place), draw the prompt pools, build the rollout copy and the
    optimizer."""
    pair = pair if pair is not None else load_pair(config.pair)
    device, dtype = resolve_device(config.device), parse_dtype(config.ref_dtype)
    pair.student.model.to(device)
    pair.teacher.model.to(device)
    pair.teacher.model.requires_grad_(False)
    cast_parameters_(pair.teacher.model, dtype)
    weights = MasterWeights(pair.student.model, dtype)  # reads the masters, then casts the student
    pair.student.model.eval()
    pair.teacher.model.eval()
    source = pair.prompt_source
    train_pool = pair.prompts("train", min(config.train_prompts, source.count("train")), seed=config.seed)
    eval_set = pair.prompts("held_out", min(config.eval_prompts, source.count("held_out")), seed=config.seed)
    if len(train_pool) < config.batch_size:
        raise InputError(f"pair {pair.name} has {len(train_pool)} train prompts, fewer than batch_size "
                         f"{config.batch_size}")
    rollout = config.rollout_spec
    spec = rollout.copy_spec
    calib = None
    if spec is not None and ":a8" in spec:  # quanto's static activation scales need data
        calib = torch.tensor([encode(pair.student.tokenizer, train_pool[:1], chat=pair.chat,
                                     context=pair.student_context)[0]])
    copy = RolloutCopy(pair.student.model, spec, rollout.staleness, layers=config.layers, seed=config.seed,
                       calibration_ids=calib, tokenizer=pair.student.tokenizer,
                       share=rollout.copy_spec is None and rollout.staleness == 0)  # reuse too: no copy needed
    opt = torch.optim.AdamW(weights.masters, lr=config.lr, weight_decay=config.weight_decay,
                            betas=(config.adam_beta1, 0.999))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(config, s + 1))
    return OPDRun(config, pair, copy, weights, opt, sched, random.Random(config.seed), train_pool, eval_set,
                  config.max_new_tokens or pair.max_new_tokens)


def sample_rollouts(run: OPDRun, prompts: list[str], step: int) -> tuple[Samples, Batch]:
    """Step 1: the rollout copy's samples of `prompts` (seeded by the run's seed and `step`) with its
    own log-probs, and the same response tokens after the teacher's prompt encoding. When the copy is
    the student itself (clean, `resample`, `reuse`), its log-probs are left to the update, whose pass
    computes the same numbers (`Samples.logprobs` None until then): one teacher-forced pass, not two."""
    pair, cfg = run.pair, run.config
    seed = rollout_seed(cfg.seed, step, cfg.rollout_spec.resample)
    copy = run.rollout_copy
    if copy.is_student and copy.engine is None:  # its log-probs come from the update's own pass (`update`)
        rollout = Samples(generate(run.student, prompts, max_new_tokens=run.max_new_tokens, temperature=cfg.temperature,
                                   top_p=cfg.top_p, seed=seed, chat=pair.chat, context=pair.student_context), None)
    else:
        rollout = copy.sample(prompts, max_new_tokens=run.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                              seed=seed, chat=pair.chat, context=pair.student_context, name=f"rollout[{cfg.rollout}]")
    t_batch = rollout.batch if pair.teacher_context == pair.student_context else reprompt(
        rollout.batch, pair.teacher.tokenizer, prompts, chat=pair.chat, context=pair.teacher_context)
    return rollout, t_batch


def score_with_teacher(run: OPDRun, teacher_batch: Batch) -> torch.Tensor:
    """Step 2: the teacher's head inputs `[N, D]` at the response tokens."""
    return teacher_hidden(run.pair.teacher.model, teacher_batch)


def update(run: OPDRun, rollout: Samples, teacher_hidden_ND: torch.Tensor) -> tuple[StepResult, float, float]:
    """Step 3: loss, backward, gradient clipping, one AdamW step. Returns the step's result, the
    gradient norm before clipping and the learning rate the update used."""
    cfg, model = run.config, run.student.model
    run.weights.zero_grad()
    mask = rollout.batch.response_mask.bool()
    result = loss_backward(model, run.pair.teacher.model, rollout.batch, teacher_hidden_ND,
                           None if rollout.logprobs is None else rollout.logprobs[mask], loss=cfg.loss, tis_cap=cfg.tis_cap,
                           chunk_tokens=cfg.chunk_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    run.weights.grads_to_masters()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.weights.masters, cfg.grad_clip))
    lr = run.optimizer.param_groups[0]["lr"]
    run.optimizer.step()
    run.weights.write_back()
    run.scheduler.step()
    return result, grad_norm, lr


def refresh(run: OPDRun) -> int:
    """Step 4: the rollout copy follows the update; returns the version it served this step."""
    served = run.rollout_copy.served_version
    run.rollout_copy.refresh()
    return served


def opd_step(run: OPDRun, step: int) -> dict[str, float]:
    """Steps 1–4 for optimizer step `step` (1-based); returns the step's metrics with timings.

    With `reuse:R` a new batch is sampled and scored by the teacher only every R steps; the steps
    between train on the same tokens (the teacher's scores of them are kept: they do not change).
    """
    t0 = time.perf_counter()
    fresh = run.batch is None or run.batch.updates >= run.config.rollout_spec.reuse
    if fresh:
        prompts = run.rng.sample(run.train_pool, run.config.batch_size)
        rollout, t_batch = sample_rollouts(run, prompts, step)
        t1 = time.perf_counter()
        run.batch = TrainingBatch(rollout, score_with_teacher(run, t_batch))
    else:
        t1 = t0
    rollout, teacher_hidden_ND, age = run.batch.rollout, run.batch.teacher_hidden_ND, run.batch.updates
    run.batch.updates += 1
    t2 = time.perf_counter()
    result, grad_norm, lr = update(run, rollout, teacher_hidden_ND)
    t3 = time.perf_counter()
    mask = rollout.batch.response_mask.bool()
    logp_student_N = result.logp_student.cpu()  # beside the rollout's, which live on the CPU
    if rollout.logprobs is None:  # the student sampled: its log-probs before this update are the rollout's
        logprobs_BT = torch.zeros(rollout.batch.input_ids.shape, dtype=torch.float32)
        logprobs_BT[mask] = logp_student_N
        rollout = run.batch.rollout = Samples(rollout.batch, logprobs_BT)
    mismatch = sampled_token_metrics(logp_student_N, rollout.logprobs[mask], run.config.clip)
    seq = torch.unique(mask.nonzero()[:, 0], return_inverse=True)[1]  # each response token's sequence
    frameworks = rollout_stats(logp_student_N, rollout.logprobs[mask], seq)  # verl / slime / NeMo RL names
    t4 = time.perf_counter()
    served = refresh(run)
    t5 = time.perf_counter()
    n_tokens = rollout.batch.response_tokens
    return {"loss": result.loss, "grad_norm": grad_norm, "lr": lr, "tokens": n_tokens,
            "rollout_s": t1 - t0, "teacher_s": t2 - t1, "update_s": t3 - t2,
            "metrics_s": t4 - t3 + result.logp_seconds, "refresh_s": t5 - t4,
            "wall_s": t5 - t0, "tokens_per_s": n_tokens / (t5 - t0), "served_version": served,
            "rollouts": len(rollout.batch.input_ids) if fresh else 0, "batch_age": age,
            **{f"mismatch_{k}": v for k, v in mismatch.items()}, **frameworks}


def train(config: OPDConfig, *, pair: Pair | None = None, on_rows: Callable[[list[dict]], None] | None = None,
          progress: Progress | None = None, save_to: str | Path | None = None,
          eval_cache: str | Path | None = None) -> list[dict]:
    """Run OPD as configured; return (and stream to `on_rows`) tidy metric rows.

    Args:
        config: the run. pair: an already loaded `Pair` (its student is trained in place);
            default: load `config.pair` fresh.
        on_rows: called with each step's rows as soon as they exist (an interrupted run keeps them).
        progress: `progress(step, steps, metrics)` after each step.
        save_to: write the final student there as a Hugging Face directory (`save_student`).
        eval_cache: a folder where step 0's evaluation is shared by every run it is the same for
            (`initial_evaluation`; only for a registered pair loaded here, not a given `pair`).

    Returns:
        Rows `{"step", "metric", "value"}`. Per step: loss, grad_norm, lr (of this step's update),
        tokens, tokens_per_s, wall_s, rollout_s, teacher_s, update_s, metrics_s (the student's
        sampled-token log-probs and the mismatch metrics), refresh_s, served_version, rollouts
        (responses sampled this step: the batch size, or 0 on a step that reuses the batch),
        batch_age (updates the batch had before this one: 0 when fresh) and the
        mismatch metrics on the step's own rollout tokens (mismatch_kl, mismatch_k3,
        mismatch_logp_abs_diff_mean/max, mismatch_is_ratio_outside_frac, mismatch_chi2_token, and the
        same tokens under verl's, slime's and NeMo RL's names: `mismatch.metrics.rollout_stats`); at
        evaluation steps heldout_rkl and, with a task, heldout_accuracy (exact match of the
        student's temperature-1 samples) with its standard error heldout_accuracy_se, for a task with
        one correct response heldout_expected_accuracy (the same exact match's expectation, computed
        without sampling: the accuracy verdicts compare there, `mismatch.analysis.twins.accuracy_metric`)
        and, with `eval_greedy`, heldout_greedy_accuracy; with `eval_probe`, the rollout copy probed
        against the student on held-out samples (`probe_copy`: copy_kl_fwd_mean, …, copy_rel_l2_final)
        and, at step 0 for a perturbed copy, its own held-out reverse KL to the teacher
        (`copy_heldout_rkl`, `copy_heldout_rkl_se`).

    Raises:
        NumericsError: the loss became NaN/Inf (the rows up to that step are emitted first).
    """
    run = setup(config, pair)
    rows: list[dict] = []

    def emit(step: int, metrics: dict[str, float]) -> None:
        new = [{"step": step, "metric": k, "value": float(v)} for k, v in metrics.items()]
        rows.extend(new)
        if on_rows is not None:
            on_rows(new)

    emit(0, {**initial_evaluation(run, eval_cache if pair is None else None), **probe_copy(run),
             **copy_heldout_rkl(run)})
    for step in range(1, config.steps + 1):
        metrics = opd_step(run, step)
        if step % config.eval_every == 0 or step == config.steps:
            metrics.update(evaluate(run), **probe_copy(run))
        if step == config.steps:  # marked in the run's own rows: the held-out KL ended far above its start
            metrics["diverged"] = float(diverged([*rows, *({"step": step, "metric": k, "value": v}
                                                           for k, v in metrics.items())]))
        emit(step, metrics)
        if not math.isfinite(metrics["loss"]):
            raise NumericsError(f"OPD loss became {metrics['loss']} at step {step} (rows up to it are written)")
        if progress is not None:
            progress(step, config.steps, metrics)
    if save_to is not None:
        save_student(run.student, save_to)
    return rows


def save_student(student: LM, directory: str | Path) -> Path:
    """Write `student` as a Hugging Face directory (config, safetensors weights, tokenizer) that
    `mismatch.load(directory)` and `transformers`' `from_pretrained` load back. Returns the path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with quiet_loading():  # no "Writing model shards" bar in the caller's stderr
        student.model.save_pretrained(directory)
        student.tokenizer.save_pretrained(directory)
    return directory
