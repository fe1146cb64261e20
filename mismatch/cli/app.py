"""The `mismatch` command line. Thin: each command reads its options, calls one library function, prints.

    mismatch probe smollm2-135m --perturb fp8-e4m3:channel --perturb int4:group128 \\
        --prompts mismatch/data/prompts.txt --chat --max-new-tokens 64 --out results/quant
    mismatch opd --pair sort-gpt2 --rollout fp8-e4m3 --rollout stale:1 --baseline --out results/opd
    mismatch sweep sweeps/quick.toml --out results/quick [--resume] [--dry-run] [--workers 2]
    mismatch report results/quant results/opd --out-dir reports/mine
    mismatch check smollm2-135m --rollout fp8-e4m3:block128 [--preset slime] [--staleness 1] [--json]
    mismatch thresholds results/paper --out mismatch/data/admission_thresholds.json

A user error (missing model, bad input, mismatched vocabularies) prints one line on stderr and
exits with status 2; results already written are never touched by a failing run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from mismatch.cli import check as cli_check, engines as cli_engines
from mismatch.verdict import Tolerance  # stdlib only: the defaults live on its fields
from mismatch.cli.common import AccTol, Force, KlTol, Out, Overwrite, command, err, out

# The library (torch, transformers, …) is imported inside each command, so `--help` and a usage error
# cost only typer's start-up (benchmarks/bench_cli.py).

app = typer.Typer(help="Measure training–inference mismatch of LMs for on-policy distillation.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
pairs_app = typer.Typer(help="Student–teacher pairs: list them (no subcommand) or build the synthetic ones.",
                        invoke_without_command=True, add_completion=False)
app.add_typer(pairs_app, name="pairs")


USAGE_ERROR = typer.BadParameter.__mro__[1]  # typer's own click UsageError: a bad, unknown or missing option


def main() -> None:
    """The console script: `app`, with a usage error (`--max-new-tokens abc`) as the same one `error:`
    line every other error is (exit 2) and an interrupt outside a command as one line (exit 130). Its
    process never reaches for the hub and its tokenizers do not fork threads (set here, not on import)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        code = app(prog_name="mismatch", standalone_mode=False)  # a command's typer.Exit code, else None
        sys.exit(code if isinstance(code, int) else 0)
    except USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `mismatch` or a group alone: its help, as click prints it
            exc.show()
            sys.exit(2)
        where = exc.ctx.command_path if exc.ctx else "mismatch"
        typer.echo(f"error: {exc.format_message().splitlines()[0]} (see `{where} --help`)", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)


@command(app)
def models() -> None:
    """List the built-in model specs (any local HF directory or cached hub id works too)."""
    from rich.table import Table

    from mismatch.model.catalog import list_models  # names only: no torch import (benchmarks/bench_cli.py)

    table = Table("spec", "description", title="built-in models")
    for name, desc in list_models().items():
        table.add_row(name, desc)
    out.print(table)


@command(app)
def probe(
    reference: Annotated[str, typer.Argument(help="Reference model spec (the policy p being trained).")],
    candidate: Annotated[str | None, typer.Argument(help="Candidate model spec (the rollout copy q); omit it "
                                                        "with --perturb (the reference perturbed in place).")] = None,
    perturb: Annotated[list[str] | None, typer.Option(help="Perturbation spec of the candidate (fp8-e4m3:channel, "
                                                           "int4:group128, bnb-nf4, …); repeatable.")] = None,
    layers: Annotated[str, typer.Option(help="--perturb scope: linear, all, attn, mlp, experts, router, lm_head, 0-3,7, regex.")] = "linear",
    each_layer: Annotated[bool, typer.Option(help="Isolation map: each SPEC on one block at a time.")] = False,
    prompts: Annotated[Path | None, typer.Option(help="Text file, one prompt per line.")] = None,
    text: Annotated[list[str] | None, typer.Option(help="A prompt given inline; repeatable.")] = None,
    max_prompts: Annotated[int | None, typer.Option(help="Use only the first N prompts.")] = None,
    chat: Annotated[bool, typer.Option(help="Wrap each prompt in the tokenizer's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Score a reference response of ≤ N tokens (0: the text).")] = 0,
    min_new_tokens: Annotated[int, typer.Option(help="Forbid EOS before this many response tokens.")] = 0,
    temperature: Annotated[float, typer.Option(help="Response sampling temperature; 0 is greedy.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of sampling, of noise and of tiny random-init models.")] = 0,
    ref_dtype: Annotated[str, typer.Option(help="Reference dtype: fp32, bf16 or fp16.")] = "fp32",
    cand_dtype: Annotated[str, typer.Option(help="Candidate dtype: fp32, bf16 or fp16.")] = "fp32",
    per_layer: Annotated[bool, typer.Option(help="Also compare every layer's hidden states.")] = True,
    clip: Annotated[float, typer.Option(help="Importance ratios outside [1/clip, clip] are counted.")] = 2.0,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk of full-vocabulary work.")] = 1024,
    out_path: Out = None,
    overwrite: Overwrite = False,
) -> None:
    """Probe how far a candidate's next-token distributions are from REFERENCE's."""
    from mismatch.cli import tables as console
    from mismatch.probes.runs import ProbeConfig, run_probes

    config = ProbeConfig(reference=reference, candidate=candidate, perturb=tuple(perturb or ()), layers=layers,
                         each_layer=each_layer, prompts=None if prompts is None else str(prompts),
                         texts=tuple(text or ()), max_prompts=max_prompts, chat=chat, max_new_tokens=max_new_tokens,
                         min_new_tokens=min_new_tokens, temperature=temperature, seed=seed, ref_dtype=ref_dtype,
                         cand_dtype=cand_dtype, per_layer=per_layer, clip=clip, chunk_tokens=chunk_tokens)
    with err.status("probing…") as status:
        results = run_probes(config, out=out_path, overwrite=overwrite, status=status.update)
    out.print(console.probe_table(config, results))
    console.wrote(err, out_path)


@command(app)
def opd(
    pair: Annotated[str, typer.Option(help="Student–teacher pair (`mismatch pairs`) or a pair .toml.")],
    rollout: Annotated[list[str] | None, typer.Option(help="Rollout copy (spec, stale:K, none); repeatable.")] = None,
    staleness: Annotated[int, typer.Option(help="Rollouts from weights K steps old (also with --rollout).")] = 0,
    layers: Annotated[str, typer.Option(help="Layer scope of the rollout perturbation.")] = "linear",
    loss: Annotated[str, typer.Option(help="pg-rkl, full-rkl or full-fkl.")] = "full-rkl",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 120,
    batch_size: Annotated[int, typer.Option(help="Prompts (rollouts) per step.")] = 128,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3,
    tis_cap: Annotated[float | None, typer.Option(help="TIS cap C: token weights min(π_S/π_R, C).")] = None,
    temperature: Annotated[float, typer.Option(help="Rollout sampling temperature.")] = 1.0,
    top_p: Annotated[float | None, typer.Option(help="Rollout nucleus sampling; off by default.")] = None,
    eval_every: Annotated[int, typer.Option(help="Held-out evaluation every N steps.")] = 10,
    eval_prompts: Annotated[int, typer.Option(help="Held-out prompts per evaluation.")] = 128,
    seed: Annotated[int, typer.Option(help="Seed of prompts, sampling and noise.")] = 0,
    baseline: Annotated[bool, typer.Option(help="Also run the clean configuration and print verdicts.")] = False,
    kl_tol: KlTol = Tolerance.kl_tol,
    acc_tol: AccTol = Tolerance.acc_tol,
    out_path: Out = None,
    overwrite: Overwrite = False,
    save: Annotated[Path | None, typer.Option(help="Save final students as HF dirs (DIR or DIR/<label>).")] = None,
) -> None:
    """Train the pair's student by on-policy distillation with rollouts from a mismatched copy."""
    from mismatch.cli import tables as console
    from mismatch import opd as opd_lib
    from mismatch.opd.tolerance import run_verdicts

    base = opd_lib.make_config(pair=pair, staleness=staleness, layers=layers, loss=loss, steps=steps, lr=lr,
                               batch_size=batch_size, tis_cap=tis_cap, temperature=temperature, top_p=top_p,
                               eval_every=eval_every, eval_prompts=eval_prompts, seed=seed)
    configs = opd_lib.plan(base, rollout or (), baseline=baseline)
    with console.Bars(err) as bars:
        progress = lambda _i, lab, k, n, m: bars.update(f"opd {lab}", k, n, f"loss {m['loss']:.3g}")  # noqa: E731
        rows = opd_lib.run_all(configs, out=out_path, overwrite=overwrite, save_to=save, progress=progress)
    title = f"OPD on {base.pair}, {base.loss}, {base.steps} steps, seed {seed}"
    tolerance = Tolerance(acc_tol=acc_tol, kl_tol=kl_tol)
    out.print(console.verdict_table(run_verdicts(rows, tolerance=tolerance), title=title, tolerance=tolerance,
                                    baseline=baseline))
    console.wrote(err, out_path, save)


@pairs_app.callback()
def pairs(ctx: typer.Context) -> None:
    """List every pair: kind, architecture, sizes, task, whether it loads here."""
    from mismatch.cli import tables as console
    from mismatch import pairs as pairs_lib

    if ctx.invoked_subcommand is None:
        rows = pairs_lib.describe_pairs()
        out.print(console.pairs_table(rows))
        for note in (f"{r['pair']}: {r['missing']}" for r in rows if r["missing"]):
            out.print(note, markup=False, highlight=False, soft_wrap=True)


@command(pairs_app, "show")
def pairs_show(name: Annotated[str, typer.Argument(help="A pair name or a path to a pair .toml file.")]) -> None:
    """Load one pair (checking that student and teacher share a vocabulary) and describe it."""
    from mismatch.cli import tables as console
    from mismatch import pairs as pairs_lib

    with err.status(f"loading {name}…"):
        pair = pairs_lib.load_pair(name)
    out.print(console.pair_table(pair))


@command(pairs_app, "build")
def pairs_build(
    name: Annotated[str | None, typer.Argument(help="A synthetic pair; default: all of them.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Build here, not in the cache (one pair).")] = None,
) -> None:
    """Train synthetic pairs from scratch (deterministic; minutes on 2 cores) and report accuracies."""
    from mismatch.cli import tables as console
    from mismatch import pairs as pairs_lib

    for pair_name in pairs_lib.build_targets(name, out_dir):
        with console.Bars(err) as bars:
            build = pairs_lib.build_and_compare(pair_name, out_dir, lambda stage, done, total, pair_name=pair_name:
                                                bars.update(f"{pair_name}: {stage}", done, total))
        out.print(build.summary(), highlight=False)


@command(app)
def sweep(
    study: Annotated[Path, typer.Argument(help="Study file (TOML): a static probe grid and a dynamic OPD grid.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Results dataset directory (shared storage on a cluster).")],
    resume: Annotated[bool, typer.Option(help="Skip tasks already done (failed ones too, unless retried).")] = False,
    retry_failed: Annotated[bool, typer.Option(help="With --resume, run failed tasks again.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Print the planned tasks and stop.")] = False,
    workers: Annotated[int | None, typer.Option(help="Run N tasks at a time as Ray tasks on a local Ray.")] = None,
    ray_address: Annotated[str | None, typer.Option(help="Join this Ray cluster (auto or HOST:PORT).")] = None,
) -> None:
    """Run a study: every probe group and OPD run of STUDY into one results dataset, resumably."""
    from mismatch.cli import tables as console
    from mismatch import sweep as sweep_lib
    from mismatch.sweep.estimate import estimates

    plan = sweep_lib.load_study(study)
    if dry_run:
        return out.print(console.plan_table(plan, estimates([*plan.plan.probes, *plan.plan.opd], out=out_dir), workers))
    with console.Bars(err) as bars:
        progress = lambda done, n, lab, _status: bars.update(f"sweep {plan.name}", done, n, lab)  # noqa: E731
        done = sweep_lib.run_study(plan, out_dir, resume=resume, retry_failed=retry_failed, workers=workers,
                                   ray_address=ray_address, progress=progress)
    out.print(console.sweep_summary(done, out_dir))


@command(app)
def report(
    results: Annotated[list[Path], typer.Argument(help="Results: dataset directories or .parquet/.csv files.")],
    out_dir: Annotated[Path, typer.Option(help="Folder for the Markdown tables and the plots.")] = Path("reports"),
    kl_tol: KlTol = Tolerance.kl_tol,
    acc_tol: AccTol = Tolerance.acc_tol,
    force: Force = False,
) -> None:
    """Write Markdown tables and plots from results (probe: summary.md + plots; OPD: curves + verdicts)."""
    from mismatch.cli import tables as console
    from mismatch.report import report as write_report

    console.wrote(err, *write_report(results, out_dir, tolerance=Tolerance(acc_tol=acc_tol, kl_tol=kl_tol), force=force))


@command(app, name="add-costs")
def add_costs(
    results: Annotated[Path, typer.Argument(help="A results dataset directory or .parquet/.csv file.")],
) -> None:
    """Write the rollout cost factors onto OPD runs written before mismatch stored them (the cost frontier reads them)."""
    from mismatch.opd.runs import add_cost_factors

    with err.status(f"costing the OPD runs of {results}…"):
        n = add_cost_factors(results)
    err.print(f"{n} OPD run{'s' if n != 1 else ''} given cost factors in {results}")


for _name, _fn in (("check", cli_check.check), ("thresholds", cli_check.thresholds),
                  ("score-rollouts", cli_engines.score_rollouts)):
    command(app, _name)(_fn)
