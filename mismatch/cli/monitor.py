"""`mismatch monitor`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.cli.common import Json, MaybeLoss, Threads, ThresholdsFile, early, err, out
from mismatch.files import json_text
from mismatch.monitor.settings import MonitorSettings  # stdlib only: the defaults live on its fields

EXIT = {"within": 0, "crossed": 1, "rising": 3}


def monitor(
    log: Annotated[Path, typer.Argument(help="The run's log: trainer_state.json (or a TRL output dir), TensorBoard "
                                             "events, JSON lines of metric dicts (verl, prime-rl), or a results dataset.")],
    thresholds: ThresholdsFile = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write monitor.png, monitor.csv and monitor.json here.")] = None,
    patience: Annotated[int, typer.Option(help="Consecutive logged steps whose trailing window (the check's window statistic) lies above its limit that make an alarm.")] = MonitorSettings.patience,
    total_steps: Annotated[int | None, typer.Option(help="The run's planned steps: a rising trend is flagged when its line reaches the limit by then (default: the logged span once more).")] = None,
    trend_steps: Annotated[int, typer.Option(help="The last logged steps the trend line is fitted to.")] = MonitorSettings.trend_steps,
    run: Annotated[str | None, typer.Option(help="With a results dataset of several OPD runs: the run id.")] = None,
    json_out: Json = False,
    framework_config: Annotated[Path | None, typer.Option(help="The run's framework config (YAML, JSON or TOML: verl's hydra config.yaml, slime's args or W&B config.yaml, NeMo RL's YAML, prime-rl's TOML): the mode its logged names are read in. Without it, a name whose meaning depends on a setting the log does not show is not judged.")] = None,
    loss: MaybeLoss = None,
    threads: Threads = None,
) -> None:
    """Judge a training run's own log against the calibrated admission limits, step by step: at each logged
    step, the mean of the gating statistic over the last window of steps (the check's window statistic) against
    the window limit. Exit 0 within the limit, 1 crossed (on PATIENCE consecutive logged steps), 3 rising
    (below the limit, but its trend's slope is positive at 95% and reaches the limit within the run's steps),
    2 error. --loss names the trainer's loss: the gating statistic's limit is then that loss's own where
    `check --loss` would use it; without it, the limit pooled over losses (a log does not say its loss)."""
    early(files=(("no log at {path}", log), ("thresholds file not found: {path}", thresholds),
                 ("no framework config at {path}", framework_config)))
    from mismatch import monitor as monitor_lib
    from mismatch.cli import tables as console

    settings = MonitorSettings(patience=patience, trend_steps=trend_steps, total_steps=total_steps)
    report = monitor_lib.monitor(log, thresholds=thresholds, settings=settings, run=run, out_dir=out_dir,
                                 framework_config=framework_config, loss=loss)
    for path in report.written:
        console.wrote(err, path)
    if json_out:
        typer.echo(json_text(report.summary()))
    else:
        out.print(console.monitor_table(report))
    raise typer.Exit(EXIT[report.status])
