"""On-policy distillation under training–inference mismatch: one config, one `train()`.

Each step (top to bottom in `train`):
  1. the rollout copy (`RolloutCopy`: the student itself, a perturbed copy, or weights K steps
     old) samples one response per prompt, temperature 1, with its own per-token log-probs;
  2. the teacher scores the response tokens (after its own context, if the pair gives it one);
  3. the student is scored on the same tokens with gradients; the loss (`losses.py`) is summed
     over token chunks — only `[chunk, V]` logits exist at a time: the head runs on a detached
     copy of the student's head inputs, each chunk back-propagates into it, and the trunk
     back-propagates once — then AdamW updates the student;
  4. the rollout copy is refreshed from the new weights (re-quantized, re-noised, or the ring of
     past weights advanced).
Every `eval_every` steps (and at steps 0 and last) the student is evaluated on fixed held-out
prompts: the teacher–student reverse KL on the student's own temperature-1 samples and, when the
pair has a task, the exact match of those samples (`heldout_accuracy`) and of greedy responses.
Models stay in eval mode (dropout off) so the only difference between rollout and training
policies is the configured mismatch. The learning rate warms up linearly, then decays (cosine by
default, `lr_factor`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mismatch.errors import InputError, NumericsError
from mismatch.layout import Head, head_inputs, model_layout
from mismatch.metrics import sampled_token_metrics
from mismatch.models import LM
from mismatch.opd.losses import LOSSES, tis_weights, token_loss
from mismatch.opd.ring import RolloutCopy, split_rollout_spec
from mismatch.rollout import Batch, encode, position_ids, reprompt, response_index, sample

Progress = Callable[[int, int, dict[str, float]], None]  # (step, steps, latest metrics)


@dataclass(frozen=True, kw_only=True)
class OPDConfig:
    """One OPD run. Flattens to result columns (`dataclasses.asdict`)."""

    pair: str
    rollout: str = "none"  # perturbation spec of the rollout copy, `stale:K`, or none
    staleness: int = 0  # K: rollouts from weights K optimizer steps old
    layers: str = "linear"  # scope of the rollout perturbation
    loss: str = "full-rkl"  # measured on the synthetic pairs: the lowest-variance signal (README)
    steps: int = 120
    batch_size: int = 128  # prompts per step
    lr: float = 1e-3
    warmup_steps: int = 10  # linear learning-rate warm-up: a fresh AdamW's first steps move every weight by ~lr
    decay: str = "cosine"  # after warm-up: cosine to final_lr_frac·lr at the last step, or constant
    final_lr_frac: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    temperature: float = 1.0
    top_p: float | None = None
    tis_cap: float | None = None  # truncated importance sampling cap C; None = off
    max_new_tokens: int | None = None  # None: the pair's
    train_prompts: int = 4096  # pool of train-split prompts the batches are drawn from
    eval_prompts: int = 128
    eval_every: int = 10
    clip: float = 2.0  # is_ratio_outside_frac counts r outside [1/clip, clip]
    chunk_tokens: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; valid: {', '.join(LOSSES)}")
        if self.staleness < 0:
            raise ValueError(f"staleness must be ≥ 0, got {self.staleness}")
        for name in ("steps", "batch_size", "train_prompts", "eval_prompts", "eval_every", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.decay not in ("cosine", "constant"):
            raise ValueError(f"decay must be cosine or constant, got {self.decay!r}")
        if not 0 <= self.final_lr_frac <= 1:
            raise ValueError(f"final_lr_frac must be in [0, 1], got {self.final_lr_frac}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be ≥ 0, got {self.warmup_steps}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")
        if not self.lr > 0 or not self.temperature > 0:
            raise ValueError("lr and temperature must be > 0")
        split_rollout_spec(self.rollout, self.staleness)  # a bad spec fails here, before any work

    @property
    def rollout_spec(self) -> str | None:
        return split_rollout_spec(self.rollout, self.staleness)[0]

    @property
    def rollout_staleness(self) -> int:
        return split_rollout_spec(self.rollout, self.staleness)[1]


def lr_factor(config: OPDConfig, step: int) -> float:
    """Multiplier of `config.lr` at optimizer step `step` (1-based): linear warm-up over
    `warmup_steps`, then constant or cosine decay reaching `final_lr_frac` at `config.steps` (the
    decay settles the policy, so the final evaluation measures where the run ended rather than
    where the last few steps threw it)."""
    warm = min(1.0, step / (config.warmup_steps + 1))
    if config.decay == "constant":
        return warm
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, max(0.0, (step - config.warmup_steps) / span))
    return warm * (config.final_lr_frac + (1 - config.final_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def _hidden(model, batch: Batch) -> torch.Tensor:
    return head_inputs(model, batch.input_ids, batch.attention_mask, position_ids(batch.attention_mask),
                       response_index(batch.response_mask))


@dataclass
class StepResult:
    loss: float
    logp_student: torch.Tensor  # [N] log π_S(y) of the sampled tokens, no grad
    logp_seconds: float  # time spent computing logp_student (only the mismatch metrics and TIS need it)


def teacher_hidden(teacher, teacher_batch: Batch) -> torch.Tensor:
    """The teacher's head inputs `[N, D]` at the response tokens' predicting positions, no grad."""
    with torch.no_grad():
        return _hidden(teacher, teacher_batch)


def loss_backward(student, teacher, student_batch: Batch, hidden_T: torch.Tensor, logp_rollout_N: torch.Tensor,
                  *, loss: str, tis_cap: float | None, chunk_tokens: int, temperature: float = 1.0,
                  top_p: float | None = None) -> StepResult:
    """Compute the OPD loss on a rollout batch and back-propagate it into the student.

    Args:
        student_batch: the rollout batch (the student's prompts and the response tokens).
        hidden_T: `teacher_hidden(...)` on the same response tokens after the teacher's prompts.
        logp_rollout_N: `[N]` rollout log-probs of the response tokens (row-major order).
        loss: one of `LOSSES`; tis_cap: truncated importance sampling cap or None.

    Returns:
        The loss value (mean over the N response tokens, nats) and the student's log-probs of the
        sampled tokens under the same `warp` as the rollout (for the mismatch metrics).
    """
    from mismatch.rollout import warp

    token_N = student_batch.input_ids[student_batch.response_mask.bool()]
    n = token_N.shape[0]
    head_T = Head.of(teacher, model_layout(teacher).head, copy=False)
    head_S = Head.of(student, model_layout(student).head, copy=False)
    hidden_S = _hidden(student, student_batch)  # [N, D], carries the trunk's graph
    leaf = hidden_S.detach().requires_grad_()
    total, logp_S_N, logp_seconds = 0.0, torch.empty(n), 0.0
    for start in range(0, n, chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        z_S = head_S.logits(leaf[rows])
        logp_S = torch.log_softmax(z_S, dim=-1)
        with torch.no_grad():
            logp_T = torch.log_softmax(head_T.logits(hidden_T[rows]), dim=-1)
            t0 = time.perf_counter()
            sampled = torch.log_softmax(warp(z_S.detach(), temperature, top_p), dim=-1)
            logp_S_N[rows] = sampled.gather(-1, token_N[rows].unsqueeze(-1)).squeeze(-1)
            logp_seconds += time.perf_counter() - t0
        terms = token_loss(loss, logp_S, logp_T, token_N[rows])
        if tis_cap is not None:
            terms = terms * tis_weights(logp_S_N[rows], logp_rollout_N[rows], tis_cap)
        chunk_loss = terms.sum() / n
        chunk_loss.backward()
        total += float(chunk_loss.detach())
    hidden_S.backward(leaf.grad)
    return StepResult(total, logp_S_N, logp_seconds)


@torch.no_grad()
def heldout_rkl(student: LM, teacher: LM, prompts: list[str], *, chat: bool, student_context, teacher_context,
                max_new_tokens: int, seed: int, chunk_tokens: int, task=None) -> tuple[float, float]:
    """Mean per-token reverse KL(π_S ‖ π_T) (nats) on the student's own samples (temperature 1,
    fixed `seed`) to `prompts`, and the task's mean reward of those samples (NaN without a task;
    a sample not ended by EOS scores 0)."""
    from mismatch.opd.losses import full_rkl
    from mismatch.pairs.evaluate import batch_rewards

    rollout = sample(student, prompts, max_new_tokens=max_new_tokens, seed=seed, chat=chat, context=student_context)
    batch = rollout.batch
    reward = math.nan
    if task is not None:
        reward = sum(batch_rewards(batch, student.tokenizer, task, prompts)) / len(prompts)
    t_batch = batch if teacher_context == student_context else reprompt(
        batch, teacher.tokenizer, prompts, chat=chat, context=teacher_context)
    h_S, h_T = _hidden(student.model, batch), _hidden(teacher.model, t_batch)
    head_S = Head.of(student.model, model_layout(student.model).head, copy=False)
    head_T = Head.of(teacher.model, model_layout(teacher.model).head, copy=False)
    total = 0.0
    for start in range(0, h_S.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        total += float(full_rkl(torch.log_softmax(head_S.logits(h_S[rows]), -1),
                                torch.log_softmax(head_T.logits(h_T[rows]), -1)).double().sum())
    return total / h_S.shape[0], reward


def train(config: OPDConfig, *, pair=None, on_rows: Callable[[list[dict]], None] | None = None,
          progress: Progress | None = None) -> list[dict]:
    """Run OPD as configured; return (and stream to `on_rows`) tidy metric rows.

    Args:
        config: the run.
        pair: an already loaded `Pair` to use (its student is trained in place); default: load
            `config.pair` fresh.
        on_rows: called with each step's rows as soon as they exist (write them to disk there:
            an interrupted run keeps what it wrote).
        progress: `progress(step, steps, metrics)` after each step.

    Returns:
        Rows `{"step", "metric", "value"}` (plus nothing else: the caller adds the config
        columns). Metrics per step: loss, grad_norm, lr (the learning rate of this step's update), tokens, tokens_per_s, wall_s, rollout_s,
        teacher_s, update_s (includes metrics_s: the time spent on the student's sampled-token
        log-probs and the mismatch metrics), refresh_s, the mismatch metrics on the step's own rollout tokens (mismatch_kl,
        mismatch_k3, mismatch_logp_abs_diff_mean/max, mismatch_is_ratio_outside_frac,
        mismatch_chi2_token), served_version; at evaluation steps heldout_rkl, and with a task
        heldout_accuracy (exact match of the student's temperature-1 samples: the policy OPD
        trains, and the accuracy the verdict compares) and heldout_greedy_accuracy.
    """
    from mismatch.pairs import load_pair
    from mismatch.pairs.evaluate import greedy_accuracy

    pair = pair if pair is not None else load_pair(config.pair)
    student, teacher = pair.student, pair.teacher
    teacher.model.requires_grad_(False)
    student.model.eval()
    teacher.model.eval()
    max_new = config.max_new_tokens or pair.max_new_tokens
    train_pool = pair.prompts("train", min(config.train_prompts, _available(pair, "train")), seed=config.seed)
    eval_set = pair.prompts("held_out", min(config.eval_prompts, _available(pair, "held_out")), seed=config.seed)
    if len(train_pool) < config.batch_size:
        raise InputError(f"pair {pair.name} has {len(train_pool)} train prompts, fewer than batch_size "
                         f"{config.batch_size}")
    calib = None
    spec = config.rollout_spec
    if spec is not None and ":a8" in spec:
        calib = torch.tensor([encode(student.tokenizer, train_pool[:1], chat=pair.chat,
                                     context=pair.student_context)[0]])
    rollout_copy = RolloutCopy(student.model, spec, config.rollout_staleness, layers=config.layers, seed=config.seed,
                       calibration_ids=calib, share=config.rollout in ("none", ""))
    rollout_lm = LM(rollout_copy.model, student.tokenizer, f"rollout[{config.rollout}]")
    opt = torch.optim.AdamW(student.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(config, s + 1))
    rng = random.Random(config.seed)
    rows: list[dict] = []

    def emit(step: int, metrics: dict[str, float]) -> None:
        new = [{"step": step, "metric": k, "value": float(v)} for k, v in metrics.items()]
        rows.extend(new)
        if on_rows is not None:
            on_rows(new)

    def evaluate(step: int) -> dict[str, float]:
        rkl, sampled = heldout_rkl(student, teacher, eval_set, chat=pair.chat, student_context=pair.student_context,
                                   teacher_context=pair.teacher_context, max_new_tokens=max_new,
                                   seed=config.seed + 7919, chunk_tokens=config.chunk_tokens, task=pair.task)
        out = {"heldout_rkl": rkl}
        if pair.task is not None:
            out["heldout_accuracy"] = sampled
            out["heldout_greedy_accuracy"] = greedy_accuracy(student, pair.task, eval_set, max_new_tokens=max_new,
                                                      chat=pair.chat, context=pair.student_context)
        return out

    emit(0, evaluate(0))
    for step in range(1, config.steps + 1):
        t0 = time.perf_counter()
        prompts = rng.sample(train_pool, config.batch_size)
        rollout = sample(rollout_lm, prompts, max_new_tokens=max_new, temperature=config.temperature,
                         top_p=config.top_p, seed=config.seed * 1_000_003 + step, chat=pair.chat,
                         context=pair.student_context)
        batch = rollout.batch
        t_batch = batch if pair.teacher_context == pair.student_context else reprompt(
            batch, teacher.tokenizer, prompts, chat=pair.chat, context=pair.teacher_context)
        t1 = time.perf_counter()
        hidden_T = teacher_hidden(teacher.model, t_batch)
        t_teacher = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        result = loss_backward(student.model, teacher.model, batch, hidden_T,
                               rollout.logprobs[batch.response_mask.bool()], loss=config.loss,
                               tis_cap=config.tis_cap, chunk_tokens=config.chunk_tokens,
                               temperature=config.temperature, top_p=config.top_p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(student.model.parameters(), config.grad_clip))
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        t2 = time.perf_counter()
        mismatch = sampled_token_metrics(result.logp_student, rollout.logprobs[batch.response_mask.bool()],
                                         config.clip)
        t_metrics = time.perf_counter()
        served = rollout_copy.served_version
        rollout_copy.refresh()
        t3 = time.perf_counter()
        n_tokens = batch.response_tokens
        metrics = {"loss": result.loss, "grad_norm": grad_norm, "lr": lr, "tokens": n_tokens,
                   "rollout_s": t1 - t0, "teacher_s": t_teacher - t1, "update_s": t2 - t_teacher,
                   "metrics_s": t_metrics - t2 + result.logp_seconds, "refresh_s": t3 - t_metrics,
                   "wall_s": t3 - t0, "tokens_per_s": n_tokens / (t3 - t0), "served_version": served,
                   **{f"mismatch_{k}": v for k, v in mismatch.items()}}
        if step % config.eval_every == 0 or step == config.steps:
            metrics.update(evaluate(step))
        if not math.isfinite(result.loss):
            emit(step, metrics)
            raise NumericsError(f"OPD loss became {result.loss} at step {step} (rows up to it are written)")
        emit(step, metrics)
        if progress is not None:
            progress(step, config.steps, metrics)
    return rows


def _available(pair, split: str) -> int:
    """How many prompts of `split` the pair can give (synthetic tasks: unbounded in practice)."""
    source = pair.prompt_source
    if hasattr(source, "all_prompts"):
        from mismatch.pairs.tasks import split_of

        return sum(split_of(p) == split for p in source.all_prompts())
    if hasattr(source, "items"):
        from mismatch.pairs.tasks import split_of

        return sum(split_of(p) == split for p in source.items)
    return 10 ** 9


def config_columns(config: OPDConfig) -> dict[str, object]:
    """The config as result columns (`None` → empty string, so parquet columns keep one type)."""
    return {k: ("" if v is None else v) for k, v in dataclasses.asdict(config).items()}
