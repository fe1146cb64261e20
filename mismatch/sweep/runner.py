"""Running a study's plan into one results dataset: serial, resumable, failures recorded.

Each planned task — a probe group (one reference pass, many candidates) or one OPD run — writes
its rows into the results dataset (`mismatch.results`, parts written atomically) and, when it
ends, a ledger record `DIR/_sweep/<task id>.json` (also written to a temporary name and renamed):
`done`, or `failed` with the error's message and a traceback summary. The sweep goes on after a
failure. `resume` skips tasks recorded done; `retry_failed` also reruns failed ones. A task killed
mid-way has no record and runs again on resume: its new parts replace the old ones once it ends
(`ResultsWriter.finish`), so a resumed sweep ends with the same rows as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mismatch.errors import InputError
from mismatch.opd.config import OPDConfig
from mismatch.opd.runs import run_all
from mismatch.probe_runs import ProbeConfig, run_probes
from mismatch.results import FILE_SUFFIXES, content_hash
from mismatch.sweep.study import Study

LEDGER = "_sweep"  # the ledger folder inside the results directory (readers skip non-parquet files)
Task = ProbeConfig | OPDConfig
Progress = Callable[[int, int, str, str], None]  # (task index, tasks, label, status)


def task_id(task: Task) -> str:
    """Content hash (`results.content_hash`) of the task's kind and configuration."""
    kind = "probe group" if isinstance(task, ProbeConfig) else "opd"
    return content_hash({"task": kind, **dataclasses.asdict(task)})


def task_label(task: Task) -> str:
    """A short human label: `probe MODEL [scope] seed S` or `opd PAIR ROLLOUT loss lr seed`."""
    if isinstance(task, ProbeConfig):
        scope = "isolation map" if task.each_layer else task.layers
        return f"probe {task.reference} [{scope}] seed {task.seed}"
    return f"opd {task.pair} {task.rollout} {task.loss} lr {task.lr:g} tis {task.tis_cap} seed {task.seed}"


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did: task ids run, skipped (already done) and failed (with their messages)."""

    ran: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]


def read_ledger(out: str | Path) -> dict[str, dict]:
    """`task id → record` of every finished task (`status` done or failed) in a results directory."""
    folder = Path(out) / LEDGER
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def _record(out: Path, tid: str, record: dict) -> None:
    folder = out / LEDGER
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{tid}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1, default=str))
    os.replace(tmp, folder / f"{tid}.json")


def _run_task(task: Task, out: Path) -> None:
    if isinstance(task, ProbeConfig):
        run_probes(task, out=out)
    else:
        run_all([task], out=out)


def run_study(study: Study, out: str | Path, *, resume: bool = False, retry_failed: bool = False,
              progress: Progress | None = None) -> SweepReport:
    """Run every task of `study.plan` (probe groups first, then OPD runs) into the dataset `out`.

    Args:
        resume: skip tasks the ledger records as done (and, unless `retry_failed`, as failed).
        retry_failed: with `resume`, run failed tasks again.
        progress: `progress(index, tasks, label, status)` before (`running`) and after each task.

    Returns:
        Which tasks ran, were skipped, and failed (message); failures never stop the sweep.

    Raises:
        InputError: `out` is a results file rather than a directory.
    """
    out = Path(out)
    if out.suffix in FILE_SUFFIXES or out.is_file():
        raise InputError(f"a sweep writes into a results directory (with its ledger), not a file: {out}")
    ledger = read_ledger(out) if resume else {}
    tasks = [*study.plan.probes, *study.plan.opd]
    ran, skipped, failed = [], [], {}
    for index, task in enumerate(tasks):
        tid, label = task_id(task), task_label(task)
        status = ledger.get(tid, {}).get("status")
        if status == "done" or (status == "failed" and not retry_failed):
            skipped.append(tid)
            continue
        if progress is not None:
            progress(index, len(tasks), label, "running")
        start = time.perf_counter()
        try:
            _run_task(task, out)
            record = {"status": "done"}
        except Exception as exc:  # noqa: BLE001 - a sweep records every failure and goes on
            message = str(exc).splitlines()[0] if str(exc) else ""
            record = {"status": "failed", "error": f"{type(exc).__name__}: {message}",
                      "traceback": traceback.format_exc(limit=-3).splitlines()[-6:]}
            failed[tid] = record["error"]
        _record(out, tid, {**record, "task": label, "seconds": round(time.perf_counter() - start, 3),
                           "config": dataclasses.asdict(task)})
        ran.append(tid)
        if progress is not None:
            progress(index, len(tasks), label, record["status"])
    return SweepReport(tuple(ran), tuple(skipped), failed)
