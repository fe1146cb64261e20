"""Running a study's plan into one results dataset: serial or on Ray, resumable, failures recorded.

Serially (the default) every task runs in this process, one after the other; with `workers` or
`ray_address` each runs as a Ray task (`mismatch.sweep.ray_pool`). Either way a task writes its own
parts and its ledger record (`mismatch.sweep.tasks.execute`), so `resume` works the same after
either, and both give the same rows bit for bit: every task runs with the study's torch thread
count (`Study.threads`), whatever the execution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from mismatch.errors import InputError, MismatchError
from mismatch.files import check_writable
from mismatch.rollout.spec import require_engines
from mismatch.results import FILE_SUFFIXES
from mismatch.sweep.estimate import longest_first
from mismatch.sweep.study import Study
from mismatch.sweep.tasks import LEDGER, Progress, Task, execute, pending_tasks, task_id, task_label


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did: task ids run, skipped (done before) and skipped as failed before (with
    `resume`, without `retry_failed`), failed (with their messages), and with `decide` the rounds of
    adaptive seeds it found (`mismatch.sweep.decide.Round`)."""

    ran: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]
    rounds: tuple = ()
    skipped_failed: tuple[str, ...] = ()


class SweepBusyError(InputError):
    """Another sweep is writing the results directory (its lock is held)."""


class DiskFullError(MismatchError):
    """A sweep stopped because its disk is full (the failed task's ledger record says `retry`)."""


def sweep_lock(out: Path) -> FileLock:
    """The lock a sweep holds on its results directory (`DIR/_sweep/.lock`) while it runs: a second sweep
    into the same directory is refused at once (`SweepBusyError`) instead of racing it for the same tasks."""
    (out / LEDGER).mkdir(parents=True, exist_ok=True)
    lock = FileLock(out / LEDGER / ".lock", blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise SweepBusyError(f"{out} is being written by another sweep: wait for it to end (then `--resume` "
                             "continues), or write to another --out") from None
    return lock


def with_rounds(study: Study, out: str | Path, *, max_seeds: int) -> tuple[Study, list]:
    """`study` with the adaptive rounds its results in `out` call for (`mismatch.sweep.decide.rounds`):
    its plan's OPD runs plus every round so far and the next one; and those rounds."""
    from mismatch.results import read_results
    from mismatch.sweep.decide import rounds
    from mismatch.sweep.tasks import read_ledger

    _check_seed_caps(study, max_seeds)
    out = Path(out)
    has_parts = out.is_dir() and any(out.glob("*.parquet"))
    rows = read_results(out) if has_parts else None
    if rows is None:
        return study, []
    opd, found = rounds(study.plan.opd, rows, read_ledger(out),
                        max_seeds=lambda config: study.plan.max_seeds(config, max_seeds))
    return dataclasses.replace(study, plan=dataclasses.replace(study.plan, opd=opd)), found


def run_study(study: Study, out: str | Path, *, resume: bool = False, retry_failed: bool = False,
              workers: int | None = None, ray_address: str | None = None,
              progress: Progress | None = None, decide: bool = False, max_seeds: int = 10) -> SweepReport:
    """Run every task of `study.plan` (probe groups first, then OPD runs) into the dataset `out`;
    on Ray, in the order of `estimate.longest_first` instead. With `decide`, also the rounds of
    adaptive seeds (`mismatch.sweep.decide`) until every level is decided or has `max_seeds` seeds: a
    judging group's next look is planned whenever a worker would go idle and the group's runs have ended.

    Args:
        resume: skip tasks the ledger records as done (and, unless `retry_failed`, as failed).
        retry_failed: with `resume`, run failed tasks again.
        workers: run as Ray tasks, at most `workers` at a time, on a local Ray instance started for
            the sweep (`mismatch.sweep.ray_pool`); None with no `ray_address`: serial, in-process.
        ray_address: join an existing Ray cluster (`auto` or `HOST:PORT`) instead; `out` must then be
            storage every node shares, and every node needs this package installed.
        progress: `progress(finished, tasks, label, status)` when a task starts (`running`) and when it
            ends (`done` / `failed`); `finished` counts the tasks ended so far, this one included.
        decide: after the plan, add seeds round by round to every level whose interval straddles a
            threshold (each round resumes: what is done is not run again).
        max_seeds: with `decide`, the most seeds a level gets.

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
    if decide and max_seeds < 2:
        raise InputError(f"--max-seeds must be ≥ 2 (an interval needs two seeds), got {max_seeds}")
    if decide:
        _check_seed_caps(study, max_seeds)
    check_writable(out, "results", folder=True)
    require_engines([*(p for t in study.plan.probes for p in t.perturb), *(t.rollout for t in study.plan.opd)])
    lock = sweep_lock(out)
    seen: list = []  # every round met, in order: a round whose runs decided its levels is not replayed later

    def next_looks() -> list[Task]:
        """The runs of every judging group's next look that its ended runs call for (`with_rounds`): asked when a
        worker would go idle, so a group's look starts when its own runs have ended, not every group's."""
        extended, found = with_rounds(study, out, max_seeds=max_seeds)
        seen.extend(r for r in found if r not in seen)
        return [*extended.plan.probes, *extended.plan.opd]

    try:
        # with `decide`, until no group has a look left: every level decided, at max_seeds, or its runs failed
        report = _run_plan(study, out, resume=resume, retry_failed=retry_failed, workers=workers,
                           ray_address=ray_address, progress=progress, more=next_looks if decide else None)
        report = dataclasses.replace(report, rounds=tuple(seen))
    finally:
        lock.release()
    return report


def still_to_run(study: Study, out: str | Path, *, retry_failed: bool = False) -> Study:
    """`study` with only the tasks `run_study(study, out, resume=True, retry_failed=…)` would run (what
    `mismatch sweep --resume --dry-run` lists): the ones the ledger in `out` does not record as done (or as
    failed, unless `retry_failed`) at the study's torch threads."""
    todo, _ = pending_tasks((*study.plan.probes, *study.plan.opd), Path(out), resume=True, retry_failed=retry_failed,
                            threads=study.threads)
    kept = {task_id(t) for t in todo}
    plan = dataclasses.replace(study.plan, probes=tuple(t for t in study.plan.probes if task_id(t) in kept),
                               opd=tuple(t for t in study.plan.opd if task_id(t) in kept))
    return dataclasses.replace(study, plan=plan)


def _check_seed_caps(study: Study, max_seeds: int) -> None:
    """Refuse a cap on adaptive seeds below the seeds a level already plans: the rounds could never add one, and
    the cap would read as the design's when the plan is."""
    planned: dict = {}
    for run in study.plan.opd:
        if not run.is_clean:
            planned.setdefault(dataclasses.replace(run, seed=0), set()).add(run.seed)
    for level, seeds in planned.items():
        cap = study.plan.max_seeds(level, max_seeds)
        if len(seeds) > cap:
            raise InputError(f"max_seeds {cap} is fewer than the {len(seeds)} seeds the study lists for "
                             f"{level.pair} {level.rollout}: raise it or list fewer seeds")


def _run_plan(study: Study, out: Path, *, resume: bool, retry_failed: bool, workers: int | None,
              ray_address: str | None, progress: Progress | None,
              more: Callable[[], list[Task]] | None = None) -> SweepReport:
    """Run what `study.plan` has still to run; with `more`, also the tasks it returns whenever a worker would go
    idle (tasks already handed out are left out), until it returns none new."""
    threads = study.threads
    todo, skipped = pending_tasks((*study.plan.probes, *study.plan.opd), out, resume=resume,
                                  retry_failed=retry_failed, threads=threads)
    on_ray = workers is not None or ray_address is not None
    handed = {task_id(t) for t in todo} | set(skipped)

    def in_run_order(tasks: list[Task]) -> list[Task]:
        return [tasks[i] for i in longest_first(tasks, out=out)] if on_ray else tasks  # the pool's makespan

    def refill() -> list[Task]:
        pending, _ = pending_tasks(more(), out, resume=True, retry_failed=False, threads=threads)  # not done
        new = in_run_order([t for t in pending if task_id(t) not in handed])  # nor running here
        handed.update(task_id(t) for t in new)
        todo.extend(new)
        return new

    if on_ray:
        from mismatch.sweep.ray_pool import run_on_ray  # Ray loads only when asked for

        first = in_run_order(list(todo))
        ran = run_on_ray(first, out, workers=workers, address=ray_address, threads=threads, progress=progress,
                         refill=refill if more is not None else None)
        by_id = {task_id(t): r for t, r in zip(first + todo[len(first):], ran)}  # refilled ones: in run order
        records = [by_id[task_id(t)] for t in todo]  # the plan's order, then what was added
    else:
        records, index = [], 0
        while True:
            if index == len(todo) and more is not None:
                refill()
            if index == len(todo):
                break
            task = todo[index]
            if progress is not None:
                progress(index, len(todo), task_label(task), "running")  # `index` tasks have ended
            records.append(execute(task, out, threads))
            if progress is not None:
                progress(index + 1, len(todo), task_label(task), records[-1]["status"])
            if records[-1].get("retry"):  # a full disk: every later task would fail the same way
                raise DiskFullError(f"{records[-1]['error'].split(': ', 1)[-1]} (task {task_label(task)}); "
                                    f"{index} of {len(todo)} tasks finished, their rows kept: free space, then "
                                    "rerun with --resume")
            index += 1
    ids = [task_id(t) for t in todo]
    failed = {tid: r["error"] for tid, r in zip(ids, records) if r["status"] == "failed"}
    return SweepReport(tuple(ids), tuple(t for t, s in skipped.items() if s == "done"), failed,
                       skipped_failed=tuple(t for t, s in skipped.items() if s == "failed"))
