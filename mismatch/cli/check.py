"""`mismatch check` and `mismatch thresholds`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.verdict import Tolerance  # stdlib only: the defaults live on its fields
from mismatch.cli.common import (AccTol, Device, Json, KlTol, Layers, LearningRate, Loss, Threads, ThresholdsFile, TisCap,
                                 early, err, out, stages)
from mismatch.files import json_text

EXIT = {"admit": 0, "reject": 1, "uncertain": 3}


def check(
    model: Annotated[str, typer.Argument(help="Model spec: a local checkpoint, a built-in, PAIR:student.")],
    rollout: Annotated[str | None, typer.Option(help="The rollout copy, as `mismatch opd --rollout` takes it: a "
                                                   "perturbation spec (fp8-e4m3:block128, int4:group128, bnb-nf4, …), "
                                                   "or stale:K / reuse:R (the model itself, lagged).")] = None,
    dump: Annotated[Path | None, typer.Option(help="Instead of --rollout: an engine's rollout dump to score "
                                                       "(vLLM, SGLang, OpenAI, prime-rl, slime: see `mismatch "
                                                       "score-rollouts`).")] = None,
    prompts: Annotated[Path | None, typer.Option(help="Calibration prompts, one per line (default: built-in).")] = None,
    layers: Layers = "linear",
    staleness: Annotated[int, typer.Option(help="The pipeline's rollout lag K (measured with --teacher, else "
                                                "carried over from the study at the same settings).")] = 0,
    reuse: Annotated[int, typer.Option(help="Steps each rollout batch is trained on (as --staleness).")] = 1,
    teacher: Annotated[str | None, typer.Option(help="The OPD teacher: measure the pipeline (the rollout spec, "
                                                     "--staleness, --reuse) on MODEL by running its first OPD steps; "
                                                     "that window statistic then decides.")] = None,
    lr: LearningRate = 1e-3,
    adam_beta1: Annotated[float, typer.Option(help="The trainer's AdamW β1.")] = 0.9,
    loss: Loss = "full-rkl",
    tis_cap: TisCap = None,
    preset: Annotated[list[str] | None, typer.Option(help="Also apply practitioners' gates: verl, slime, nemo-rl.")] = None,
    thresholds: ThresholdsFile = None,
    max_prompts: Annotated[int, typer.Option(help="Calibration prompts: at most this many (of --prompts, the pair's held-out set, or the built-in prompts).")] = 16,
    max_new_tokens: Annotated[int | None, typer.Option(help="Tokens per calibration response (default 128).")] = None,
    response_tokens: Annotated[float | None, typer.Option(help="The pipeline's mean response length in tokens, where "
                                                              "the limits are applied (default: the calibration's "
                                                              "or the dump's).")] = None,
    seed: Annotated[int, typer.Option(help="Sampling and bootstrap seed.")] = 0,
    ref_dtype: Annotated[str, typer.Option(help="The trainer's precision, MODEL's dtype in the check: fp32, bf16 "
                                                "or fp16.")] = "fp32",
    recipe: Annotated[bool | None, typer.Option("--recipe/--no-recipe", help="Search a mixed-precision recipe "
                                                "whatever the answer / never (default: on a reject).")] = None,
    json_out: Json = False,
    device: Device = "auto",
    offload: Annotated[bool | None, typer.Option("--offload/--no-offload", help="Keep the weights the rollout copy "
                                                 "replaced out of memory while it runs (host memory from a GPU, a "
                                                 "temporary file from the CPU); default: for models of 1 GiB and more.")
                       ] = None,
    threads: Threads = None,
) -> None:
    """Is a cheaper rollout configuration (--rollout SPEC, or an engine's --dump FILE) safe for OPD on MODEL?
    The trainer's --loss picks the fitted limit: its own where the study fitted one and, leaving one pair out,
    it predicts the loss's levels at least as well as the pooled limit; else the pooled one. Beyond the fitted
    response lengths, the limit scales by the length law of that loss's ladder where one ran. Exit 0 admit, 1 reject,
    3 uncertain, 2 error."""
    early(models=(model, *((teacher,) if teacher else ())), specs=(rollout,), files=(("prompts file not found: {path}", prompts),
                                                     ("thresholds file not found: {path}", thresholds),
                                                     ("rollout dump not found: {path}", dump)))
    from mismatch import admission as admission_lib
    from mismatch.cli import tables as console

    trainer = admission_lib.TrainerSettings(lr=lr, adam_beta1=adam_beta1, loss=loss, tis_cap=tis_cap)
    with stages(f"checking {rollout or dump or 'the default rollout'} on {model}") as say:
        calibration = admission_lib.CalibrationSettings(prompts=prompts, max_prompts=max_prompts,
                                                        max_new_tokens=max_new_tokens)
        admission = admission_lib.check(model, rollout, layers=layers, calibration=calibration,
                                        pipeline=admission_lib.Pipeline(staleness=staleness, reuse=reuse, trainer=trainer,
                                                                         response_tokens=response_tokens),
                                        thresholds=thresholds, presets=tuple(preset or ()), seed=seed, recipe=recipe,
                                        dump=dump, teacher=teacher, ref_dtype=ref_dtype, device=device,
                                        offload=offload, progress=say)
    if json_out:
        typer.echo(json_text(admission.to_dict()))
    else:
        out.print(console.admission_table(admission))
        if admission.recipe is not None:
            out.print(console.recipe_text(admission.recipe), highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT[admission.status])


def thresholds(
    results: Annotated[list[Path], typer.Argument(help="Results dataset(s) of a study with clean twins.")],
    out_path: Annotated[Path, typer.Option("--out", help="Where to write the thresholds JSON.")],
    kl_tol: KlTol = Tolerance.kl_tol,
    acc_tol: AccTol = Tolerance.acc_tol,
    threads: Threads = None,
    json_out: Json = False,
) -> None:
    """Fit admission thresholds from a study's results (the shipped ones come from sweeps/paper.toml)."""
    from mismatch import admission as admission_lib
    from mismatch.cli import tables as console
    from mismatch.files import check_writable

    check_writable(out_path, "--out", folder=False)  # before the fit, not after it
    fitted = admission_lib.fit_thresholds(results, tolerance=Tolerance(acc_tol=acc_tol, kl_tol=kl_tol))
    written = fitted.to_json(out_path)
    if json_out:
        typer.echo(written.read_text(encoding="utf-8").rstrip())  # the file's own JSON
    else:
        out.print(console.thresholds_table(fitted))
    console.wrote(err, written)
