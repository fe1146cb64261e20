"""The `mismatch` command line. Thin: each command reads its options, calls one library function, prints.

    mismatch probe smollm2-135m --perturb fp8-e4m3:channel --perturb int4:group128 \\
        --prompts mismatch/data/prompts.txt --chat --max-new-tokens 64 --out results/quant
    mismatch opd --pair sort-gpt2 --rollout fp8-e4m3 --rollout stale:1 --baseline --out results/opd
    mismatch sweep sweeps/quick.toml --out results/quick [--resume] [--dry-run] [--workers 2]
    mismatch report results/quant results/opd --out reports/mine
    mismatch check smollm2-135m --rollout fp8-e4m3:block128 [--preset slime] [--staleness 1] [--json]
    mismatch thresholds results/paper --out mismatch/data/admission_thresholds.json
    mismatch monitor runs/trl-out/trainer_state.json --out monitor/ [--patience 3]

A user error (missing model, bad input, mismatched vocabularies) prints one line on stderr and
exits with status 2, as does any unexpected error (`mismatch --debug …` adds its traceback): exit 1
and 3 are only ever verdicts (`check`'s reject and uncertain, `monitor`'s crossed). Results already
written are never touched by a failing run.
"""

from __future__ import annotations

import os
import sys

import typer

from mismatch.cli import check, engines, monitor, opd, pairs, probe, report, sweep
from mismatch.cli.common import DEBUG_ENV, command

# The library (torch, transformers, …) is imported inside each command, so `--help` and a usage error
# cost only typer's start-up (benchmarks/bench_cli.py).

app = typer.Typer(help="Measure training–inference mismatch of LMs for on-policy distillation.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
pairs_app = typer.Typer(help="Student–teacher pairs: list them (no subcommand) or build the synthetic ones.",
                        invoke_without_command=True, add_completion=False)
app.add_typer(pairs_app, name="pairs")


@app.callback()
def options(debug: bool = typer.Option(False, "--debug", help="On an unexpected error, also print its traceback.")
            ) -> None:
    """Measure training–inference mismatch of LMs for on-policy distillation."""
    if debug:
        os.environ[DEBUG_ENV] = "1"


def main() -> None:
    """The console script: `app`, with a usage error (`--max-new-tokens abc`) as the same one `error:`
    line every other error is (exit 2) and an interrupt outside a command as one line (exit 130). Its
    process never reaches for the hub and its tokenizers do not fork threads (set here, not on import)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        code = app(prog_name="mismatch", standalone_mode=False)  # a command's typer.Exit code, else None
        sys.exit(code if isinstance(code, int) else 0)
    except typer.TyperException as exc:  # typer's (vendored click's) errors: a bad, unknown or missing option
        if type(exc).__name__ == "NoArgsIsHelpError":  # `mismatch` or a group alone: its help, as click prints it
            exc.show()
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx else "mismatch"
        typer.echo(f"error: {exc.format_message().splitlines()[0]} (see `{where} --help`)", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)


# one module per command group; each command goes through the one error handler (`common.command`)
for _name, _fn in (("models", probe.models), ("probe", probe.probe), ("opd", opd.opd), ("sweep", sweep.sweep),
                  ("report", report.report), ("check", check.check),
                  ("thresholds", check.thresholds), ("score-rollouts", engines.score_rollouts),
                  ("monitor", monitor.monitor)):
    command(app, _name)(_fn)
command(app, "add-costs", hidden=True)(report.add_costs)  # a migration of old results: off the menu
pairs_app.callback()(pairs.pairs)
command(pairs_app, "show")(pairs.pairs_show)
command(pairs_app, "build")(pairs.pairs_build)
