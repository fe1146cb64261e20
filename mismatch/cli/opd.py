"""`mismatch opd`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.opd.config import OPDConfig, field_help  # names and help only: no torch
from mismatch.verdict import Tolerance  # stdlib only: the defaults live on its fields
from mismatch.files import json_text
from mismatch.cli.common import (AccTol, Device, Json, KlTol, Layers, LearningRate, Loss, Out, Overwrite, Threads, TisCap,
                                 early, err, out)


def opd(
    pair: Annotated[str, typer.Option(help=field_help(OPDConfig, "pair"))],
    rollout: Annotated[list[str] | None, typer.Option(help="Rollout copy (spec, stale:K, none); repeatable.")] = None,
    staleness: Annotated[int, typer.Option(help=field_help(OPDConfig, "staleness"))] = OPDConfig.staleness,
    layers: Layers = OPDConfig.layers,
    loss: Loss = OPDConfig.loss,
    steps: Annotated[int, typer.Option(help=field_help(OPDConfig, "steps"))] = OPDConfig.steps,
    batch_size: Annotated[int, typer.Option(help=field_help(OPDConfig, "batch_size"))] = OPDConfig.batch_size,
    lr: LearningRate = OPDConfig.lr,
    tis_cap: TisCap = OPDConfig.tis_cap,
    temperature: Annotated[float, typer.Option(help=field_help(OPDConfig, "temperature"))] = OPDConfig.temperature,
    top_p: Annotated[float | None, typer.Option(help=field_help(OPDConfig, "top_p"))] = OPDConfig.top_p,
    eval_every: Annotated[int, typer.Option(help=field_help(OPDConfig, "eval_every"))] = OPDConfig.eval_every,
    eval_prompts: Annotated[int, typer.Option(help=field_help(OPDConfig, "eval_prompts"))] = OPDConfig.eval_prompts,
    seed: Annotated[int, typer.Option(help=field_help(OPDConfig, "seed"))] = OPDConfig.seed,
    baseline: Annotated[bool, typer.Option(help="Also run the clean configuration and print verdicts.")] = False,
    kl_tol: KlTol = Tolerance.kl_tol,
    acc_tol: AccTol = Tolerance.acc_tol,
    out_path: Out = None,
    overwrite: Overwrite = False,
    save: Annotated[Path | None, typer.Option(help="Save final students as HF dirs (DIR or DIR/<label>).")] = None,
    threads: Threads = None,
    device: Device = "auto",
    ref_dtype: Annotated[str, typer.Option(help=field_help(OPDConfig, "ref_dtype"))] = OPDConfig.ref_dtype,
    json_out: Json = False,
) -> None:
    """Train the pair's student by on-policy distillation with rollouts from a mismatched copy."""
    early(specs=tuple(rollout or ()))
    from mismatch.cli import tables as console
    from mismatch import opd as opd_lib
    from mismatch.analysis.tolerance import run_verdicts

    base = opd_lib.OPDConfig(pair=pair, staleness=staleness, layers=layers, loss=loss, steps=steps, lr=lr,
                               batch_size=batch_size, tis_cap=tis_cap, temperature=temperature, top_p=top_p,
                               eval_every=eval_every, eval_prompts=eval_prompts, seed=seed, device=device,
                               ref_dtype=ref_dtype)
    configs = opd_lib.plan(base, rollout or (), baseline=baseline)
    with console.Bars(err) as bars:
        progress = lambda _i, lab, k, n, m: bars.update(f"opd {lab}", k, n, f"loss {m['loss']:.3g}")  # noqa: E731
        rows = opd_lib.run_all(configs, out=out_path, overwrite=overwrite, save_to=save, progress=progress)
    title = f"OPD on {base.pair}, {base.loss}, {base.steps} steps, seed {seed}"
    tolerance = Tolerance(acc_tol=acc_tol, kl_tol=kl_tol)
    verdicts = run_verdicts(rows, tolerance=tolerance)
    if json_out:  # one record per run: its settings, its comparison with its clean twin, its level's verdict
        typer.echo(json_text(verdicts.to_dict("records")))
    else:
        out.print(console.verdict_table(verdicts, title=title, tolerance=tolerance, baseline=baseline))
    console.wrote(err, out_path, save)
