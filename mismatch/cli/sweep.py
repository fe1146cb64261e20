"""`mismatch sweep`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from mismatch.cli.common import err, out


def sweep(
    study: Annotated[Path, typer.Argument(help="Study file (TOML): a static probe grid and a dynamic OPD grid.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Results dataset directory (shared storage on a cluster).")],
    resume: Annotated[bool, typer.Option(help="Skip tasks already done (failed ones too, unless retried).")] = False,
    retry_failed: Annotated[bool, typer.Option(help="With --resume, run failed tasks again.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Print the planned tasks (with --resume: those still to run) and "
                                               "stop.")] = False,
    workers: Annotated[int | None, typer.Option(help="Run N tasks at a time as Ray tasks on a local Ray.")] = None,
    ray_address: Annotated[str | None, typer.Option(help="Join this Ray cluster (auto or HOST:PORT).")] = None,
    decide: Annotated[bool | None, typer.Option(
        "--decide/--no-decide", help="After the plan, add seeds in rounds to every level whose interval straddles "
        "a threshold (default: the study's `decide`).")] = None,
    max_seeds: Annotated[int | None, typer.Option(help="With --decide, the most seeds per level (default: the "
                                                       "study's `max_seeds`, else 10).")] = None,
    threads: Annotated[int | None, typer.Option(help="Torch threads per task (default: the study's `threads`, else "
                                                     "1); a resumed task done at another count runs again.")] = None,
) -> None:
    """Run a study: every probe group and OPD run of STUDY into one results dataset, resumably."""
    from mismatch.cli import tables as console
    from mismatch import sweep as sweep_lib
    from mismatch.sweep.estimate import estimates, measured_seconds

    plan = sweep_lib.load_study(study)
    if threads is not None:  # the study's own count, overridden: each task's rows depend on it in the last bits
        plan = dataclasses.replace(plan, threads=threads)
    decide = plan.decide if decide is None else decide
    max_seeds = plan.max_seeds if max_seeds is None else max_seeds
    if dry_run:
        found = []
        if decide:  # the rounds the results on disk call for, the next one included
            plan, found = sweep_lib.with_rounds(plan, out_dir, max_seeds=max_seeds)
        if resume:
            tasks = [*plan.plan.probes, *plan.plan.opd]
            done, seconds = measured_seconds(tasks, out_dir, plan.threads)
            out.print(console.measured_line(done, len(tasks), seconds, workers))
            plan = sweep_lib.still_to_run(plan, out_dir, retry_failed=retry_failed)
        out.print(console.plan_table(plan, estimates([*plan.plan.probes, *plan.plan.opd], out=out_dir), workers))
        return out.print(console.rounds_table(found)) if found else None
    with console.Bars(err) as bars:
        progress = lambda done, n, lab, _status: bars.update(f"sweep {plan.name}", done, n, lab)  # noqa: E731
        done = sweep_lib.run_study(plan, out_dir, resume=resume, retry_failed=retry_failed, workers=workers,
                                   ray_address=ray_address, progress=progress, decide=decide, max_seeds=max_seeds)
    out.print(console.sweep_summary(done, out_dir))
    if done.rounds:
        out.print(console.rounds_table(done.rounds))
