"""Step 5 of an OPD run, and what it measures of the rollout copy: the student judged by the teacher on
fixed held-out prompts (`evaluate`, `heldout_rkl`; step 0's computed once per pair and settings:
`initial_evaluation`), and the rollout copy probed against the student (`probe_copy`) and judged by the
teacher (`copy_heldout_rkl`). The trainer (`mismatch.opd.trainer`) calls them; they read its `OPDRun`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mismatch.files import atomic_write_text
from mismatch.hashing import content_hash
from mismatch.model.generate import generate, reprompt, response_hidden
from mismatch.model.head import Head, logprob_chunks
from mismatch.model.loader import LM
from mismatch.opd.config import where_columns
from mismatch.opd.losses import full_rkl
from mismatch.pairs.evaluate import batch_rewards, expected_accuracy, greedy_accuracy
from mismatch.pairs.load import pair_digest
from mismatch.probes.core import probe
from mismatch.version import ID_SCHEMA, __version__

if TYPE_CHECKING:
    from mismatch.opd.trainer import OPDRun

EVAL_SEED_OFFSET = 7919  # held-out samples use their own seed, fixed across steps


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
    student_hidden_ND = response_hidden(student.model, batch, share_prefix=True)
    teacher_hidden_ND = response_hidden(teacher.model, t_batch, share_prefix=True)
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
