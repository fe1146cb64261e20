"""`mismatch pairs` (list), `pairs show` and `pairs build`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.cli.common import Threads, err, out


def pairs(ctx: typer.Context) -> None:
    """List every pair: kind, architecture, sizes, task, whether it loads here."""
    from mismatch.cli import tables as console
    from mismatch import pairs as pairs_lib

    if ctx.invoked_subcommand is None:
        rows = pairs_lib.describe_pairs()
        out.print(console.pairs_table(rows))
        for note in (f"{r['pair']}: {r['missing']}" for r in rows if r["missing"]):
            out.print(note, markup=False, highlight=False, soft_wrap=True)


def pairs_show(name: Annotated[str, typer.Argument(help="A pair name or a path to a pair .toml file.")]) -> None:
    """Load one pair (checking that student and teacher share a vocabulary) and describe it."""
    from mismatch.cli import tables as console
    from mismatch import pairs as pairs_lib

    with err.status(f"loading {name}…"):
        pair = pairs_lib.load_pair(name)
    out.print(console.pair_table(pair))


def pairs_build(
    name: Annotated[str | None, typer.Argument(help="A synthetic pair; default: all of them.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Build here, not in the cache (one pair).")] = None,
    threads: Threads = None,
) -> None:
    """Train synthetic pairs from scratch (deterministic; minutes on 2 cores) and report accuracies."""
    from mismatch.cli import tables as console
    from mismatch import pairs as pairs_lib

    for pair_name in pairs_lib.build_targets(name, out_dir):
        with console.Bars(err) as bars:
            build = pairs_lib.build_and_compare(pair_name, out_dir, lambda stage, done, total, pair_name=pair_name:
                                                bars.update(f"{pair_name}: {stage}", done, total))
        out.print(build.summary(), highlight=False)
