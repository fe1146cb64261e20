"""Sweep tasks as Ray tasks: a local Ray instance started for the sweep, or an existing cluster.

Each task runs `runner.execute` in a Ray worker process: it writes its own parts into the results
directory and its own ledger record, so the driver only schedules and reports. On a cluster the
results directory must be storage that every node shares (NFS, a mounted bucket) and every node
needs this package installed in the same environment. A task asks Ray for `threads` CPUs and runs
torch with that many threads, so `workers` tasks never oversubscribe the cores. A worker process
that dies (killed, out of memory) has its task retried once by Ray (`max_retries=1`); the retry's
parts replace the dead attempt's when it finishes (`ResultsWriter.finish`), so no row is counted
twice. A task that dies twice is recorded as failed. Tasks ask for no GPU: every run here is on the
CPU (models load on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mismatch.sweep.tasks import Progress, Task, execute, task_id, task_label, write_record

Execute = Callable[[Task, Path, int], dict]


def _init(workers: int | None, address: str | None, threads: int) -> bool:
    """Start or join Ray unless this process already did; returns whether this call started it."""
    import ray

    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": "ERROR", "configure_logging": True}
    if address is not None:
        ray.init(address=address, **quiet)
    else:
        ray.init(num_cpus=(workers or 1) * threads, include_dashboard=False, **quiet)
    return True


def run_on_ray(tasks: Sequence[Task], out: str | Path, *, workers: int | None = None, address: str | None = None,
               threads: int = 1, progress: Progress | None = None,
               execute_fn: Execute = execute, refill: Callable[[], Sequence[Task]] | None = None) -> list[dict]:
    """Run `tasks` as Ray tasks, at most `workers` at a time, and return their ledger records in order.

    Args:
        workers: tasks in flight at once; on a local instance also its size (default 1). With
            `address` and no `workers`, every task is submitted and the cluster schedules them.
        address: an existing cluster (`auto` or `HOST:PORT`); None: a local instance for this sweep
            (shut down at the end; one already started in this process is used as it is).
        threads: torch threads (and Ray CPUs) per task: the study's (`Study.threads`).
        execute_fn: what a worker runs for a task (`runner.execute`).
        refill: asked for more tasks whenever one ends with none left waiting (a worker would go idle): what
            it returns runs after them, its records appended to the ones returned, in the order given.
    """
    import ray

    out = Path(out)
    started = _init(workers, address, threads)
    remote = ray.remote(execute_fn).options(num_cpus=threads, max_retries=1, retry_exceptions=False)
    tasks = list(tasks)
    records: list[dict | None] = [None] * len(tasks)
    queue, in_flight = list(range(len(tasks))), {}
    limit = workers if workers is not None else float("inf")  # a cluster schedules every task submitted

    def take_more() -> None:
        for task in refill():
            tasks.append(task)
            records.append(None)
            queue.append(len(tasks) - 1)

    try:
        while True:
            if refill is not None and not queue and len(in_flight) < limit:  # a worker is idle
                take_more()
            while queue and len(in_flight) < limit:
                index = queue.pop(0)
                in_flight[remote.remote(tasks[index], out, threads)] = index
                if progress is not None:
                    progress(len(tasks) - len(queue) - len(in_flight), len(tasks), task_label(tasks[index]), "running")
                if refill is not None and not queue and len(in_flight) < limit:  # a worker would go idle
                    take_more()
            if not in_flight:
                break
            (ref,), _ = ray.wait(list(in_flight), num_returns=1)
            index = in_flight.pop(ref)
            try:
                records[index] = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the worker died twice (or Ray lost the task)
                records[index] = {"status": "failed", "task": task_label(tasks[index]),
                                  "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                write_record(out, task_id(tasks[index]), records[index])
            if progress is not None:
                progress(len(tasks) - len(queue) - len(in_flight), len(tasks), task_label(tasks[index]),
                         records[index]["status"])
    finally:
        if started:
            ray.shutdown()
    return records
