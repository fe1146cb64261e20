"""Running a study's plan into one results dataset: serial or on Ray, resumable, failures recorded.

Serially (the default) every task runs in this process, one after the other; with `workers` or
`ray_address` each runs as a Ray task (`mismatch.sweep.ray_pool`). Either way a task writes its own
parts and its ledger record (`mismatch.sweep.tasks.execute`), so `resume` works the same after
either, and both give the same rows bit for bit: every task runs with the study's torch thread
count (`Study.threads`), whatever the execution.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mismatch.errors import InputError
from mismatch.files import check_writable
from mismatch.rollout_spec import require_engines
from mismatch.results import FILE_SUFFIXES
from mismatch.sweep.estimate import longest_first
from mismatch.sweep.study import Study
from mismatch.sweep.tasks import Progress, execute, pending_tasks, task_id, task_label


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did: task ids run, skipped (already done) and failed (with their messages)."""

    ran: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]


def run_study(study: Study, out: str | Path, *, resume: bool = False, retry_failed: bool = False,
              workers: int | None = None, ray_address: str | None = None,
              progress: Progress | None = None) -> SweepReport:
    """Run every task of `study.plan` (probe groups first, then OPD runs) into the dataset `out`;
    on Ray, in the order of `estimate.longest_first` instead.

    Args:
        resume: skip tasks the ledger records as done (and, unless `retry_failed`, as failed).
        retry_failed: with `resume`, run failed tasks again.
        workers: run as Ray tasks, at most `workers` at a time, on a local Ray instance started for
            the sweep (`mismatch.sweep.ray_pool`); None with no `ray_address`: serial, in-process.
        ray_address: join an existing Ray cluster (`auto` or `HOST:PORT`) instead; `out` must then be
            storage every node shares, and every node needs this package installed.
        progress: `progress(finished, tasks, label, status)` when a task starts (`running`) and when it
            ends (`done` / `failed`); `finished` counts the tasks ended so far, this one included.

    Returns:
        Which tasks ran, were skipped, and failed (message); failures never stop the sweep.

    Raises:
        InputError: `out` is a results file rather than a directory; `workers` < 1.
    """
    out = Path(out)
    if out.suffix in FILE_SUFFIXES or out.is_file():
        raise InputError(f"a sweep writes into a results directory (with its ledger), not a file: {out}")
    if workers is not None and workers < 1:
        raise InputError(f"--workers must be ≥ 1, got {workers}")
    check_writable(out, "results", folder=True)
    require_engines([*(p for t in study.plan.probes for p in t.perturb), *(t.rollout for t in study.plan.opd)])
    threads = study.threads
    todo, skipped = pending_tasks((*study.plan.probes, *study.plan.opd), out, resume=resume,
                                  retry_failed=retry_failed, threads=threads)
    if workers is not None or ray_address is not None:
        from mismatch.sweep.ray_pool import run_on_ray  # Ray loads only when asked for

        order = longest_first(todo, out=out)  # the pool's makespan: long tasks first
        ran = run_on_ray([todo[i] for i in order], out, workers=workers, address=ray_address, threads=threads,
                         progress=progress)
        records = [record for _, record in sorted(zip(order, ran))]
    else:
        records = []
        for index, task in enumerate(todo):
            if progress is not None:
                progress(index, len(todo), task_label(task), "running")  # `index` tasks have ended
            records.append(execute(task, out, threads))
            if progress is not None:
                progress(index + 1, len(todo), task_label(task), records[-1]["status"])
    ids = [task_id(t) for t in todo]
    failed = {tid: r["error"] for tid, r in zip(ids, records) if r["status"] == "failed"}
    return SweepReport(tuple(ids), tuple(skipped), failed)
