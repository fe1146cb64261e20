"""`mismatch score-rollouts`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mismatch.cli.common import err, out


def score_rollouts(
    model: Annotated[str, typer.Argument(help="The trainer's checkpoint: a local checkpoint, a built-in, PAIR:student.")],
    rollouts: Annotated[Path, typer.Argument(help="The engine's dump: JSONL/JSON/parquet (mismatch, vLLM, SGLang or "
                                                  "OpenAI-compatible records with per-token log-probs), prime-rl's "
                                                  "token export (a rank file or a step_S/ folder) or slime's debug "
                                                  "rollout data (.pt).")],
    out_path: Annotated[Path | None, typer.Option("--out", help="Write the per-token table (.parquet or .csv).")] = None,
    clip: Annotated[float, typer.Option(help="IS ratios outside [1/clip, clip] count as outside.")] = 2.0,
    text_check: Annotated[bool, typer.Option(help="Check each response's ids decode to the engine's text.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Score an engine's sampled rollouts (with its own log-probs) against MODEL teacher-forced."""
    from mismatch.cli import tables as console
    from mismatch.engines import score_rollouts as score_lib

    with err.status(f"scoring {rollouts} with {model}…"):
        result = score_lib(model, rollouts, clip=clip, check_text=text_check, out=out_path)
    if out_path is not None:
        console.wrote(err, out_path)
    for note in result.notes:
        err.print(f"warning: {note}", markup=False, highlight=False, soft_wrap=True)
    if json_out:
        typer.echo(json.dumps({"model": result.reference, "rollouts": result.candidate, **result.summary,
                               "notes": result.notes}, indent=1))
    else:
        out.print(console.score_table(result))
