"""What every `mismatch` command module shares: the consoles it prints on, the common options and the
`command` decorator (one-line errors, interrupts)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mismatch.errors import MismatchError

err = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables
Out = Annotated[Path | None, typer.Option("--out", help="Results: a dataset directory or a .parquet/.csv file.")]
Overwrite = Annotated[bool, typer.Option(help="Replace --out's content instead of appending, once the command "
                                                 "has succeeded (a failed or interrupted one removes nothing).")]
KlTol = Annotated[float, typer.Option(help="OPD verdict: final held-out KL within (1 + KL_TOL) × clean.")]
AccTol = Annotated[float, typer.Option(help="OPD verdict: final accuracy at least clean − ACC_TOL.")]
Force = Annotated[bool, typer.Option(help="Replace the report of other results that --out-dir holds.")]


def kept(command: str, options: dict) -> str:
    """What an interrupted `command` left, from its options: its results destination keeps every run
    finished before (an OPD run's rows up to its last evaluation); `--overwrite` removed nothing."""
    dest = options.get("out_path") or options.get("out_dir")
    if dest is None or command in ("report", "pairs_build"):
        return "nothing was removed" if dest is None else f"{dest} may hold part of the new report"
    extra = "; --overwrite removed nothing (it takes effect only when the command ends)" if options.get("overwrite") else ""
    resume = "; `--resume` continues where it stopped" if command == "sweep" else ""
    return f"{dest} keeps every run finished before (and an OPD run's rows up to its last evaluation){extra}{resume}"


def quiet_process() -> None:
    """The CLI's own process: transformers' info logs and progress bars off. Before transformers is
    imported, by the variables it reads at import (so a command that needs no model, `mismatch models`,
    imports no transformers); after, through its logging API."""
    if "transformers" in sys.modules:
        from mismatch.model.loader import quiet_transformers

        quiet_transformers()
    else:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def command(group: typer.Typer, name: str | None = None):
    """Register a command on `group` with one-line errors (exit 2), one line on an interrupt saying
    what was kept (exit 130) and quiet `transformers` logging."""
    def register(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            quiet_process()
            try:
                return fn(*args, **kwargs)
            except MismatchError as exc:
                typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)  # one line, never wrapped
                raise typer.Exit(2) from None
            except KeyboardInterrupt:
                typer.echo(f"interrupted: {kept(fn.__name__, kwargs)}", err=True)
                raise typer.Exit(130) from None
        return group.command(name)(wrapper)
    return register
