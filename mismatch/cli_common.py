"""What every `mismatch` command module shares: the consoles it prints on and the common options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

err = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables
Out = Annotated[Path | None, typer.Option("--out", help="Results: a dataset directory or a .parquet/.csv file.")]
Overwrite = Annotated[bool, typer.Option(help="Start --out afresh instead of appending to it.")]
KlTol = Annotated[float, typer.Option(help="OPD verdict: final held-out KL within (1 + KL_TOL) × clean.")]
AccTol = Annotated[float, typer.Option(help="OPD verdict: final accuracy at least clean − ACC_TOL.")]
