"""`mismatch report` and `mismatch add-costs`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.verdict import Tolerance  # stdlib only: the defaults live on its fields
from mismatch.cli.common import AccTol, Force, KlTol, Threads, err


def report(
    results: Annotated[list[Path], typer.Argument(help="Results: dataset directories or .parquet/.csv files.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the Markdown tables and the plots.")] = Path("reports"),
    kl_tol: KlTol = Tolerance.kl_tol,
    acc_tol: AccTol = Tolerance.acc_tol,
    force: Force = False,
    threads: Threads = None,
) -> None:
    """Write Markdown tables and plots from results (probe: summary.md + plots; OPD: curves + verdicts)."""
    from mismatch.cli import tables as console
    from mismatch.report import report as write_report

    console.wrote(err, *write_report(results, out_dir, tolerance=Tolerance(acc_tol=acc_tol, kl_tol=kl_tol), force=force))


def add_costs(
    results: Annotated[Path, typer.Argument(help="A results dataset directory or .parquet/.csv file.")],
    threads: Threads = None,
) -> None:
    """Write the rollout cost factors onto OPD runs written before mismatch stored them (the cost frontier reads them)."""
    from mismatch.opd.runs import add_cost_factors

    with err.status(f"costing the OPD runs of {results}…"):
        n = add_cost_factors(results)
    err.print(f"{n} OPD run{'s' if n != 1 else ''} given cost factors in {results}")
