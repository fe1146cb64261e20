"""`mismatch score-rollouts`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.defaults import DEFAULT_CLIP
from mismatch.cli.common import Clip, Device, Json, Threads, early, err, out
from mismatch.errors import InputError
from mismatch.files import json_text


def score_rollouts(
    model: Annotated[str | None, typer.Argument(
        metavar="MODEL", show_default=False,
        help="The trainer's checkpoint (a local checkpoint, a built-in, PAIR:student): it recomputes the trainer side "
             "teacher-forced. Left out, the trainer side is the log-probs the dump logged (prime-rl's token export, "
             "slime's --save-debug-train-data) and no model runs.")] = None,
    rollouts: Annotated[Path | None, typer.Argument(
        metavar="ROLLOUTS", show_default=False,
        help="The engine's dump: JSONL/JSON/parquet (mismatch, vLLM, SGLang or OpenAI-compatible records with "
             "per-token log-probs), prime-rl's token export (a rank file or a step_S/ folder) or slime's debug "
             "rollout or train data (.pt).")] = None,
    out_path: Annotated[Path | None, typer.Option("--out", help="Write the per-token table (.parquet or .csv).")] = None,
    clip: Clip = DEFAULT_CLIP,
    text_check: Annotated[bool, typer.Option(help="Check each response's ids decode to the engine's text.")] = True,
    json_out: Json = False,
    ref_dtype: Annotated[str, typer.Option(help="The trainer's precision, MODEL's dtype: fp32, bf16 or fp16.")] = "fp32",
    device: Device = "auto",
    threads: Threads = None,
) -> None:
    """Score an engine's sampled rollouts (with its own log-probs) against MODEL teacher-forced, or, without MODEL,
    against the trainer log-probs the dump logged."""
    if rollouts is None:  # one argument: the dump alone
        model, rollouts = None, None if model is None else Path(model)
    if rollouts is None:
        raise InputError("give the rollouts dump, after the trainer's checkpoint to recompute its log-probs")
    early(models=(model,), files=(("rollouts file not found: {path}", rollouts),))
    from mismatch.cli import tables as console
    from mismatch.dumps import score_rollouts as score_lib
    from mismatch.dumps.score import trainer_side

    with err.status(f"scoring {rollouts}{'' if model is None else f' with {model}'}…"):
        result = score_lib(model, rollouts, clip=clip, check_text=text_check, out=out_path, ref_dtype=ref_dtype,
                           device=device)
    if out_path is not None:
        console.wrote(err, out_path)
    for note in result.notes:
        err.print(f"warning: {note}", markup=False, highlight=False, soft_wrap=True)
    if json_out:
        typer.echo(json_text({"model": result.reference, "trainer": trainer_side(result), "rollouts": result.candidate,
                              **result.summary, "notes": result.notes}))
    else:
        out.print(console.score_table(result))
