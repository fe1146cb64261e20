"""One sweep task — a probe group (one reference pass, many candidates) or one OPD run — run into a
results dataset, and the ledger that records how each task ended.

A task writes its rows into the results dataset (`mismatch.results`, parts written atomically) and,
when it ends, a ledger record `DIR/_sweep/<task id>.json` (also written to a temporary name and
renamed): `done`, or `failed` with the error's message and a traceback summary. A task that failed
because the disk was full (`WriteError.disk_full`) is marked `retry`: `--resume` runs it again once
space is freed, as it does a task killed mid-way (no record). Either runs again on resume: its new parts replace the old ones once it ends
(`ResultsWriter.finish`), so a resumed sweep ends with the same rows as an uninterrupted one. A
task's id (`task_id`) hashes its configuration, the digests of the data it reads and the toolkit
version."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from mismatch.errors import DISK_FULL
from mismatch.files import atomic_write_text
from mismatch.hashing import content_hash
from mismatch.hashing import sha256_file
from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_all, run_columns
from mismatch.probes.runs import ProbeConfig, model_digests, run_probes
from mismatch.version import ID_SCHEMA, __version__

LEDGER = "_sweep"  # the ledger folder inside the results directory (readers skip non-parquet files)
Task = ProbeConfig | OPDConfig
Progress = Callable[[int, int, str, str], None]  # (tasks finished, tasks, label, status)


def task_columns(task: Task) -> dict[str, object]:
    """What a task's id hashes: its configuration and the digests of the data it reads (the pair's
    weights for an OPD run; the reference's weights and the prompt file for a probe group)."""
    if isinstance(task, OPDConfig):
        return {"task": "opd", **run_columns(task)}
    prompts = Path(task.prompts) if task.prompts is not None else None
    columns = dataclasses.asdict(task)
    if prompts is not None and prompts.is_file():  # the file's content, not where the checkout lies
        columns["prompts"] = prompts.name
    return {"task": "probe group", **columns, **model_digests(task),
            "prompts_sha256": sha256_file(prompts) if prompts is not None and prompts.is_file() else None}


def task_id(task: Task) -> str:
    """Content hash (`mismatch.hashing.content_hash`) of the task's kind, configuration, data digests
    (`task_columns`) and the toolkit's version: a changed pair, prompt file or toolkit reruns it."""
    return content_hash({**task_columns(task), "mismatch_version": __version__, "id_schema": ID_SCHEMA})


def task_label(task: Task) -> str:
    """A short human label: `probe MODEL [scope] seed S` or `opd PAIR ROLLOUT [scope] loss lr [T tokens] seed`
    (the rollout's scope only where it is not every decoder linear, as a recipe's kept blocks; the response
    cap only where the study sets one, as a length ladder's rungs)."""
    if isinstance(task, ProbeConfig):
        scope = "isolation map" if task.each_layer else task.layers
        return f"probe {task.reference} [{scope}] seed {task.seed}"
    scope = "" if task.layers == "linear" else f" [{task.layers}]"
    length = "" if task.max_new_tokens is None else f" {task.max_new_tokens} tokens"
    return (f"opd {task.pair} {task.rollout}{scope} {task.loss} lr {task.lr:g} tis {task.tis_cap}{length} "
            f"seed {task.seed}")


def read_ledger(out: str | Path) -> dict[str, dict]:
    """`task id → record` of every finished task (`status` done or failed) in a results directory."""
    folder = Path(out) / LEDGER
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def write_record(out: Path, tid: str, record: dict) -> None:
    """Write a task's ledger record `out/_sweep/<tid>.json` atomically (temporary name, rename)."""
    atomic_write_text(out / LEDGER / f"{tid}.json", json.dumps(record, indent=1, default=str))


def _run_task(task: Task, out: Path) -> None:
    if isinstance(task, ProbeConfig):
        run_probes(task, out=out)
    else:
        run_all([task], out=out)


def execute(task: Task, out: str | Path, threads: int) -> dict:
    """Run one task into the results directory `out` and record how it ended in the ledger.

    Args:
        threads: torch intra-op threads for the task (the caller's count is restored after it). fp32
            sums depend on it in the last bits, so rows are bit-identical between runs with equal counts.

    Returns:
        The ledger record: `status` done / failed (with `error`, one line, and `traceback`, its last
        frames), `task` label, `seconds`, torch `threads`, the process `pid`, `config`. A task's own
        exception never propagates.
    """
    out = Path(out)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        _run_task(task, out)
        record: dict = {"status": "done"}
    except Exception as exc:  # noqa: BLE001 - a sweep records every failure and goes on
        message = str(exc).splitlines()[0] if str(exc) else ""
        record = {"status": "failed", "error": f"{type(exc).__name__}: {message}",
                  "traceback": traceback.format_exc(limit=-3).splitlines()[-6:]}
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:  # not the task's fault: run it again on resume
            record["retry"] = True
    finally:
        torch.set_num_threads(before)
    record.update(task=task_label(task), seconds=round(time.perf_counter() - start, 3),
                  threads=threads, pid=os.getpid(), config=dataclasses.asdict(task))
    write_record(out, task_id(task), record)
    return record


def record_status(record: dict, threads: int) -> str | None:
    """A ledger record's status as `--resume` reads it: None for no record, or one made at another torch
    thread count (its task runs again)."""
    return record.get("status") if record.get("threads", threads) == threads else None


def pending_tasks(tasks: Sequence[Task], out: Path, *, resume: bool, retry_failed: bool, threads: int = 1
                  ) -> tuple[list[Task], dict[str, str]]:
    """The tasks still to run (in their order) and those skipped, `id → status`: with `resume`, the ones
    the ledger in `out` records as done, and as failed unless `retry_failed` (a failure marked `retry`, a
    full disk, always runs again), at `threads` torch threads (a task that ran with another count runs
    again: its rows would differ in the last bits)."""
    ledger = read_ledger(out) if resume else {}
    todo, skipped = [], {}
    for task in tasks:
        record = ledger.get(task_id(task), {})
        status = record_status(record, threads)
        if status == "done" or (status == "failed" and not retry_failed and not record.get("retry")):
            skipped[task_id(task)] = status
        else:
            todo.append(task)
    return todo, skipped
