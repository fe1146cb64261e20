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
  5. `evaluate` — every `eval_every` steps (and at steps 0 and last): the teacher–student reverse
     KL on the student's own temperature-1 samples of fixed held-out prompts and, when the pair has
     a task, the exact match of those samples (`heldout_accuracy`, with its standard error), of greedy
     responses, and for a task with one correct response its expectation computed exactly.
Models stay in eval mode (dropout off) so the only difference between rollout and training
policies is the configured mismatch. The learning rate warms up linearly, then decays (cosine by
default, `lr_factor`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mismatch.errors import InputError, NumericsError
from mismatch.files import atomic_write_text
from mismatch.hashing import content_hash
from mismatch.model.head import CACHE_ROWS, Head, head_inputs, is_identity_warp, logprob_chunks, token_chunks
from mismatch.metrics import rollout_stats, sampled_token_metrics
from mismatch.model.device import resolve_device
from mismatch.model.loader import LM, parse_dtype, quiet_loading
from mismatch.opd.config import OPDConfig, lr_factor, where_columns
from mismatch.opd.precision import MasterWeights, cast_parameters_
from mismatch.opd.losses import full_rkl, get_loss, tis_weights, token_loss
from mismatch.opd.ring import RolloutCopy
from mismatch.opd.verdict import diverged
from mismatch.pairs import Pair, load_pair
from mismatch.pairs.registry import pair_digest
from mismatch.pairs.evaluate import batch_rewards, expected_accuracy, greedy_accuracy
from mismatch.model.positions import response_index
from mismatch.model.generate import Batch, Samples, encode, generate, reprompt, token_logprobs
from mismatch.probes.core import probe
from mismatch.version import ID_SCHEMA, __version__

Progress = Callable[[int, int, dict[str, float]], None]  # (step, steps, latest metrics)
EVAL_SEED_OFFSET = 7919  # held-out samples use their own seed, fixed across steps


def _hidden(model, batch: Batch, *, share_prefix: bool = False) -> torch.Tensor:
    return head_inputs(model, batch.input_ids, batch.attention_mask, response_index(batch.response_mask),
                       share_prefix=share_prefix).rows_ND


@dataclass
class StepResult:
    loss: float
    logp_student: torch.Tensor  # [N] log π_S(y) of the sampled tokens, no grad
    logp_seconds: float  # time spent computing logp_student (only the mismatch metrics and TIS need it)


def teacher_hidden(teacher, teacher_batch: Batch) -> torch.Tensor:
    """The teacher's head inputs `[N, D]` at the response tokens' predicting positions, no grad; the
    tokens every row starts with (its context turns) run once (`head_inputs(share_prefix=True)`)."""
    with torch.no_grad():
        return _hidden(teacher, teacher_batch, share_prefix=True)


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
    student_hidden_ND = _hidden(student, student_batch, share_prefix=True)  # [N, D], carries the trunk's graph
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


@torch.no_grad()
def heldout_rkl(student: LM, teacher: LM, prompts: list[str], *, chat: bool, student_context, teacher_context,
                max_new_tokens: int, seed: int, chunk_tokens: int, task=None) -> tuple[float, float, list[float]]:
    """Mean per-token reverse KL(π_S ‖ π_T) (nats) on the student's own samples (temperature 1,
    fixed `seed`) to `prompts`, its standard error with the prompts as the sampling unit (the ratio
    estimator's: `√(Σ_i (S_i − R·n_i)² / (m(m−1))) / n̄` for m prompts with KL sums S_i over n_i tokens,
    R the mean; NaN for one prompt) — the evaluation's own Monte-Carlo error — and the task's reward of
    each sample, in prompt order (empty without a task; a sample not ended by EOS scores 0)."""
    batch = generate(student, prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed, chat=chat,
                     context=student_context)  # `sample`'s tokens, without its log-prob pass (unused here)
    rewards = batch_rewards(batch, student.tokenizer, task, prompts) if task is not None else []
    t_batch = batch if teacher_context == student_context else reprompt(
        batch, teacher.tokenizer, prompts, chat=chat, context=teacher_context)
    student_hidden_ND = _hidden(student.model, batch, share_prefix=True)
    teacher_hidden_ND = _hidden(teacher.model, t_batch, share_prefix=True)
    teacher_chunks = logprob_chunks(Head.of(teacher.model), teacher_hidden_ND, chunk_tokens)
    kl_N = torch.empty(student_hidden_ND.shape[0], dtype=torch.float64, device=student_hidden_ND.device)
    for rows, student_logp_PV in logprob_chunks(Head.of(student.model), student_hidden_ND, chunk_tokens):
        kl_N[rows] = full_rkl(student_logp_PV, next(teacher_chunks)[1]).double()
    row_N = batch.response_mask.bool().nonzero()[:, 0]
    kl_N = kl_N.cpu()  # per-prompt sums on the CPU, beside the batch
    sums_M = torch.zeros(len(prompts), dtype=torch.float64).index_add_(0, row_N, kl_N)
    counts_M = torch.bincount(row_N, minlength=len(prompts)).double()
    mean = float(kl_N.sum()) / len(kl_N)
    m = len(prompts)
    se = (math.sqrt(float(((sums_M - mean * counts_M) ** 2).sum()) / (m * (m - 1))) / float(counts_M.mean())
          if m > 1 else math.nan)
    return mean, se, rewards


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


def rollout_seed(seed: int, step: int, resample: int = 0) -> int:
    """The sampling seed of optimizer step `step` of a run with seed `seed`: `seed·1000003 + step`, or for
    the A/A control's stream S ≥ 1 (`resample:S`) 32 bits of SHA-256 of (seed, step, S) — torch's CPU
    generator keeps 32 bits of a seed, so an offset stream would wrap onto the clean ones."""
    if resample == 0:
        return seed * 1_000_003 + step
    return int.from_bytes(hashlib.sha256(f"resample/{resample}/{seed}/{step}".encode()).digest()[:4], "little")


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


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean of per-prompt rewards and its standard error, sd (ddof 1) / √n — for 0/1 rewards the
    binomial √(p(1−p)/(n−1)): the evaluation's sampling noise at a fixed prompt set (NaN for n < 2)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


COPY_PROBE_METRICS = ("kl_fwd_mean", "kl_fwd_p99", "kl_rev_mean", "tv_mean", "top1_agree")


def probe_copy(run: OPDRun) -> dict[str, float]:
    """The rollout copy as it is now (quantized, noisy, stale, an engine) probed against the student
    with the probe code (`mismatch.probes.core.probe`) on the student's temperature-1 samples of the first
    `eval_probe` held-out prompts (their own seed, fixed across steps): the
    full-vocabulary per-token metrics (`copy_kl_fwd_mean`, …, `copy_top1_agree`) and, for a copy in
    PyTorch, the relative L2 error of every layer's hidden states (`copy_rel_l2_mean` over layers,
    `copy_rel_l2_final` of the last). Nothing when the copy is the student itself — clean and
    resample (0 by construction) and reuse (its batches come from the student a few updates back,
    whose weights are not kept) — or `eval_probe` is 0. The same statistics a static probe gives a
    format, so every source with a copy of its own — staleness too — has them."""
    copy, cfg = run.rollout_copy, run.config
    if cfg.eval_probe == 0 or (copy.is_student and copy.engine is None):
        return {}
    pair = run.pair
    samples = generate(run.student, run.eval_set[:cfg.eval_probe], max_new_tokens=run.max_new_tokens, temperature=1.0,
                       seed=cfg.seed + EVAL_SEED_OFFSET + 1, chat=pair.chat, context=pair.student_context)
    external = copy.engine is not None
    result = probe(run.student.model, copy.engine if external else copy.model, samples.input_ids,
                   samples.attention_mask, samples.response_mask, per_layer=not external, clip=cfg.clip,
                   chunk_tokens=cfg.chunk_tokens)
    out = {f"copy_{k}": result.summary[k] for k in COPY_PROBE_METRICS}
    if not external:
        rel = result.per_layer["rel_l2"].astype(float)
        out.update(copy_rel_l2_mean=float(rel.mean()), copy_rel_l2_final=float(rel.iloc[-1]))
    return out


def copy_heldout_rkl(run: OPDRun) -> dict[str, float]:
    """The rollout copy judged by the teacher, as `evaluate` judges the student (its own temperature-1
    samples of the same held-out prompts, same seed and length): `copy_heldout_rkl` and its standard
    error. Its gap to the student's `heldout_rkl` at the same step is how much worse the sampler is at
    the task (the teacher-side candidate of `mismatch.admission.transfer`). Measured at step 0 only, for a
    copy with weights of its own there — a format or noise, not a copy equal to the student (clean,
    resample, reuse; a stale copy before its first update: gap 0 by construction), not an engine — and only
    with `eval_probe` (the copy is probed)."""
    copy, cfg, pair = run.rollout_copy, run.config, run.pair
    if cfg.eval_probe == 0 or copy.is_student or copy.engine is not None or cfg.rollout_spec.copy_spec is None:
        return {}
    rkl, se, _ = heldout_rkl(LM(copy.model, run.student.tokenizer, "rollout copy"), pair.teacher, run.eval_set,
                             chat=pair.chat, student_context=pair.student_context,
                             teacher_context=pair.teacher_context, max_new_tokens=run.max_new_tokens,
                             seed=cfg.seed + EVAL_SEED_OFFSET, chunk_tokens=cfg.chunk_tokens)
    return {"copy_heldout_rkl": rkl, "copy_heldout_rkl_se": se}


def evaluate(run: OPDRun) -> dict[str, float]:
    """Step 5: held-out reverse KL and, with a task, sampled exact match with its standard error
    (`heldout_accuracy`, `heldout_accuracy_se`: `mean_se`) and (`eval_greedy`) greedy exact match, and for
    a task with one correct response the expected sampled exact match, computed exactly
    (`heldout_expected_accuracy`, `mismatch.pairs.evaluate.expected_accuracy`)."""
    pair, cfg = run.pair, run.config
    rkl, rkl_se, rewards = heldout_rkl(run.student, pair.teacher, run.eval_set, chat=pair.chat,
                               student_context=pair.student_context, teacher_context=pair.teacher_context,
                               max_new_tokens=run.max_new_tokens, seed=cfg.seed + EVAL_SEED_OFFSET,
                               chunk_tokens=cfg.chunk_tokens, task=pair.task)
    out = {"heldout_rkl": rkl, "heldout_rkl_se": rkl_se}
    if pair.task is not None:
        out["heldout_accuracy"], out["heldout_accuracy_se"] = mean_se(rewards)
    if pair.task is not None and hasattr(pair.task, "answer"):  # one correct response: its probability, exactly
        out["heldout_expected_accuracy"] = expected_accuracy(run.student, pair.task, run.eval_set,
                                                             max_new_tokens=run.max_new_tokens, chat=pair.chat,
                                                             context=pair.student_context, chunk_tokens=cfg.chunk_tokens)
    if pair.task is not None and cfg.eval_greedy:
        out["heldout_greedy_accuracy"] = greedy_accuracy(run.student, pair.task, run.eval_set,
                                                         max_new_tokens=run.max_new_tokens, chat=pair.chat,
                                                         context=pair.student_context)
    return out


INITIAL_EVAL_FIELDS = ("pair", "seed", "eval_prompts", "chunk_tokens", "eval_greedy")  # what step 0's evaluation reads


def initial_evaluation(run: OPDRun, cache: str | Path | None = None) -> dict[str, float]:
    """Step 0's evaluation: the initial student on the held-out prompts — the same for every run of a pair
    that shares `INITIAL_EVAL_FIELDS`, the effective max_new_tokens, the pair's data (`pair_digest`), the
    torch thread count, the device and precision (`where_columns`), whatever its rollout, loss or learning rate. With `cache` (a folder) it is
    computed once and read back from `cache/<key>.json` by every other such run (written atomically);
    the values are the computation's own, so a run's rows are the same bit for bit with or without it."""
    if cache is None:
        return evaluate(run)
    cfg = run.config
    key = content_hash({**{f: getattr(cfg, f) for f in INITIAL_EVAL_FIELDS}, "max_new_tokens": run.max_new_tokens,
                        "pair_sha256": pair_digest(cfg.pair), "threads": torch.get_num_threads(),
                        "mismatch_version": __version__, "id_schema": ID_SCHEMA,
                        **where_columns(cfg)})  # where and in which precision it ran; {} on the CPU in fp32
    path = Path(cache) / f"{key}.json"
    if path.is_file():
        try:
            return {k: float(v) for k, v in json.loads(path.read_text()).items()}
        except (ValueError, AttributeError):  # a damaged entry: computed again and replaced
            pass
    values = evaluate(run)
    atomic_write_text(path, json.dumps({k: repr(float(v)) for k, v in values.items()}))  # repr: every bit
    return values


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
        without sampling: the accuracy verdicts compare there, `mismatch.opd.verdict.accuracy_metric`)
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
