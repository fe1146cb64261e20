"""What every `mismatch` command module shares: the consoles it prints on, the common options and the
`command` decorator (one-line errors, interrupts)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mismatch.opd.config import OPDConfig, field_help  # names and help only: no torch
from mismatch.errors import InputError, MismatchError

err = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables
Out = Annotated[Path | None, typer.Option("--out", help="Results: a dataset directory or a .parquet/.csv file.")]
Overwrite = Annotated[bool, typer.Option(help="Replace --out's content instead of appending, once the command "
                                                 "has succeeded (a failed or interrupted one removes nothing).")]
Layers = Annotated[str, typer.Option(help=field_help(OPDConfig, "layers"))]
Loss = Annotated[str, typer.Option(help=field_help(OPDConfig, "loss"))]
MaybeLoss = Annotated[str | None, typer.Option(help=field_help(OPDConfig, "loss"))]  # None: not known
LearningRate = Annotated[float, typer.Option("--lr", help=field_help(OPDConfig, "lr"))]
TisCap = Annotated[float | None, typer.Option(help=field_help(OPDConfig, "tis_cap"))]
ThresholdsFile = Annotated[Path | None, typer.Option("--thresholds", help="Fitted limits JSON (`mismatch thresholds`; "
                                                                         "default: the shipped ones).")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON (stdout), nothing else.")]
Clip = Annotated[float, typer.Option(help="Importance ratios outside [1/CLIP, CLIP] count in is_ratio_outside_frac.")]
KlTol = Annotated[float, typer.Option(help="OPD verdict: final held-out KL within (1 + KL_TOL) × clean.")]
AccTol = Annotated[float, typer.Option(help="OPD verdict: final accuracy at least clean − ACC_TOL.")]
Force = Annotated[bool, typer.Option(help="Replace the report of other results that --out holds.")]
Device = Annotated[str, typer.Option(help="Where models run: auto (CUDA when present), cpu, cuda, cuda:N, or "
                                           "balanced (a model larger than one GPU spread over every CUDA device; "
                                           "not for opd).")]
Threads = Annotated[int | None, typer.Option(help="Torch CPU threads for this command (default: torch's, one per "
                                                  "core; on a shared or loaded machine 1 is often fastest).")]


def early(*, models: tuple = (), specs: tuple = (), files: tuple = ()) -> None:
    """Check what can be checked without torch before a command imports the library (seconds of torch and
    transformers start-up): model specs resolve to something (`locate`), rollout and perturbation specs parse,
    input files exist (`files`: `(message, path)`, the message the library raises for that file missing, with a
    `{path}` field). Each problem is the library's own one-line error, only sooner."""
    from mismatch.model.catalog import locate
    from mismatch.rollout.spec import RolloutSpec

    for model in models:
        if model is not None:
            locate(model)
    for spec in specs:
        if spec is not None:
            RolloutSpec.parse(spec)
    for missing, path in files:  # `missing`: the library's own words for the absent file
        if path is not None and not Path(path).exists():
            raise InputError(missing.format(path=path))


def set_threads(threads: int | None) -> None:
    """The command's torch intra-op thread count: before torch is imported through the variables it reads
    (`OMP_NUM_THREADS`, `MKL_NUM_THREADS`), after it through `torch.set_num_threads`."""
    if threads is None:
        return
    if threads < 1:
        raise InputError(f"--threads must be ≥ 1, got {threads}")
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # already loaded (a caller's process): the CLI itself never imports it
        sys.modules["torch"].set_num_threads(threads)


@contextlib.contextmanager
def stages(first: str):
    """Progress on stderr while a long call runs: yields `say(message)`. A spinner on a terminal; off one (a
    log, CI, `nohup`) one timestamped line per stage, so a long command is never silent."""
    if err.is_terminal:
        with err.status(first) as status:
            yield status.update
        return

    def say(message: str) -> None:
        err.print(f"{time.strftime('%H:%M:%S')} {message}", markup=False, highlight=False, soft_wrap=True)

    say(first)
    yield say


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


DEBUG_ENV = "MISMATCH_DEBUG"  # set (`mismatch --debug …` sets it): an unexpected error also prints its traceback


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unexpected(exc: BaseException) -> str:
    """One line for an error the toolkit did not foresee: an OS error as the system says it with the file
    it concerns (a full disk, a truncated checkpoint's read), else the exception's type and first line, and
    how to see the traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    hint = "" if debugging() else f" (`mismatch --debug …` or {DEBUG_ENV}=1 prints the traceback)"
    return f"{type(exc).__name__}: {first_line(exc)}{hint}"


def command(group: typer.Typer, name: str | None = None, *, hidden: bool = False):
    """Register a command on `group` (`hidden`: callable, but off the menu) with one-line errors (exit 2: a user error, and any unexpected one,
    whose traceback only `--debug` prints, so exit 1 and 3 stay verdicts), one line on an interrupt saying
    what was kept (exit 130) and quiet `transformers` logging."""
    def register(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            quiet_process()
            try:
                set_threads(kwargs.get("threads"))
                return fn(*args, **kwargs)
            except MismatchError as exc:
                typer.echo(f"error: {first_line(exc)}", err=True)  # one line, never wrapped
                raise typer.Exit(2) from None
            except KeyboardInterrupt:
                typer.echo(f"interrupted: {kept(fn.__name__, kwargs)}", err=True)
                raise typer.Exit(130) from None
            except typer.Exit:
                raise
            except Exception as exc:  # noqa: BLE001 - exit 1 and 3 are verdicts (check, monitor): a crash is 2
                typer.echo(f"error: {unexpected(exc)}", err=True)
                if debugging():
                    traceback.print_exc()
                raise typer.Exit(2) from None
        return group.command(name, hidden=hidden)(wrapper)
    return register
