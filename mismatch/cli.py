"""The `mismatch` command line. Thin: each command builds its inputs and calls the library.

    mismatch models
    mismatch probe smollm2-135m smollm2-135m --cand-dtype bf16 --prompts mismatch/data/prompts.txt \\
        --chat --min-new-tokens 64 --max-new-tokens 96 --out results/smollm2_bf16.parquet
    mismatch report results/smollm2_bf16.parquet --out-dir reports

A user error (missing model, bad input, mismatched vocabularies) prints one line on stderr and
exits with status 2; result files already written are never touched by a failing run.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mismatch.errors import MismatchError

app = typer.Typer(help="Measure training–inference mismatch of LMs for on-policy distillation.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables


def _one_line_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MismatchError as exc:
            typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)  # one line, never wrapped
            raise typer.Exit(2) from None
    return wrapper


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@app.command()
def models() -> None:
    """List the built-in model specs (any local HF directory or cached hub id works too)."""
    from mismatch.models import list_models

    table = Table("spec", "description", title="built-in models")
    for name, desc in list_models().items():
        table.add_row(name, desc)
    out.print(table)


SUMMARY_COLUMNS = ("kl_fwd_mean", "kl_fwd_p99", "kl_fwd_max", "tv_mean", "top1_agree", "logp_abs_diff_mean",
                   "is_ratio_outside_frac", "chi2_token")


@app.command()
@_one_line_errors
def probe(
    reference: Annotated[str, typer.Argument(help="Reference model spec (the policy p being trained).")],
    candidate: Annotated[str | None, typer.Argument(
        help="Candidate model spec (the rollout copy q). Omit it with --perturb: the candidate is then "
             "the reference model perturbed in place.")] = None,
    perturb: Annotated[list[str] | None, typer.Option(
        help="Perturbation spec of the candidate (e.g. fp8-e4m3:channel, int4:group128, bnb-nf4, "
             "quanto-int8, noise:0.01); repeatable: every spec is compared with one reference pass.")] = None,
    layers: Annotated[str, typer.Option(
        help="Layer scope of --perturb: linear, all, attn, mlp, lm_head, index ranges (0-3,7) or a regex.")] = "linear",
    each_layer: Annotated[bool, typer.Option(
        help="Per-layer isolation map: apply each --perturb SPEC to one decoder block at a time "
             "(replaces --layers; one probe per block).")] = False,
    prompts: Annotated[Path | None, typer.Option(help="Text file, one prompt per line.")] = None,
    text: Annotated[list[str] | None, typer.Option(help="A prompt given inline; repeatable.")] = None,
    max_prompts: Annotated[int | None, typer.Option(help="Use only the first N prompts.")] = None,
    chat: Annotated[bool, typer.Option(help="Wrap each prompt in the tokenizer's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(
        help="Generate a response of at most this many tokens with the reference and score only the "
             "response; 0 scores the prompt text itself.")] = 0,
    min_new_tokens: Annotated[int, typer.Option(help="Forbid EOS before this many response tokens.")] = 0,
    temperature: Annotated[float, typer.Option(help="Response sampling temperature; 0 is greedy.")] = 0.0,
    seed: Annotated[int, typer.Option(
        help="Seed of response sampling, of noise perturbations and of tiny random-init models.")] = 0,
    ref_dtype: Annotated[str, typer.Option(help="Reference dtype: fp32, bf16 or fp16.")] = "fp32",
    cand_dtype: Annotated[str, typer.Option(help="Candidate dtype: fp32, bf16 or fp16.")] = "fp32",
    per_layer: Annotated[bool, typer.Option(help="Also compare every layer's hidden states.")] = True,
    clip: Annotated[float, typer.Option(help="Importance ratios outside [1/clip, clip] are counted.")] = 2.0,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk of full-vocabulary work.")] = 1024,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write tidy rows to this .parquet or .csv.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out instead of appending to it.")] = False,
) -> None:
    """Probe how far a candidate's next-token distributions are from REFERENCE's."""
    import mismatch
    from mismatch.errors import InputError
    from mismatch.layout import model_layout
    from mismatch.models import parse_dtype
    from mismatch.perturb import parse_spec, perturbed, select
    from mismatch.perturb.scope import first_block
    from mismatch.results import to_rows, write_results
    from mismatch.rollout import generate, read_prompts, teacher_forced

    if (prompts is None) == (not text):
        raise InputError("give exactly one of --prompts FILE or --text TEXT")
    if out_file is not None and out_file.suffix not in (".parquet", ".csv"):
        raise InputError(f"--out must end in .parquet or .csv, got {out_file.name}")
    specs = [str(parse_spec(p)) for p in perturb or []]  # fail fast on a bad spec
    if specs and candidate not in (None, reference):
        raise InputError("--perturb perturbs the reference model itself: omit CANDIDATE")
    if not specs and candidate is None:
        raise InputError("give a CANDIDATE model or at least one --perturb SPEC")
    if each_layer and not specs:
        raise InputError("--each-layer needs at least one --perturb SPEC")
    ref_dt, cand_dt = parse_dtype(ref_dtype), parse_dtype(cand_dtype)
    texts = read_prompts(prompts) if prompts is not None else list(text)
    if max_prompts is not None:
        if max_prompts < 1:
            raise InputError(f"--max-prompts must be ≥ 1, got {max_prompts}")
        texts = texts[:max_prompts]
    _quiet_transformers()
    with err.status("loading models…"):
        ref_lm = mismatch.load(reference, dtype=ref_dt, seed=seed)
        if specs:
            select(ref_lm.model, layers)  # fail fast on a bad scope
            cand_lm = None
        else:
            same = (reference, ref_dt) == (candidate, cand_dt)
            cand_lm = ref_lm if same else mismatch.load(candidate, dtype=cand_dt, seed=seed)
    if max_new_tokens > 0:
        with err.status(f"generating {len(texts)} responses with {reference}…"):
            batch = generate(ref_lm, texts, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                             chat=chat, temperature=temperature, seed=seed)
    else:
        batch = teacher_forced(ref_lm, texts, chat=chat)
    base = {"ref_dtype": ref_dtype, "cand_dtype": cand_dtype if not specs else ref_dtype, "clip": clip,
            "seed": seed, "chat": chat, "max_new_tokens": max_new_tokens, "min_new_tokens": min_new_tokens,
            "temperature": temperature, "prompts": str(prompts) if prompts is not None else "inline",
            "n_prompts": len(texts)}
    results = []

    def record(result, perturb_spec: str, scope: str) -> None:
        results.append((perturb_spec, scope, result))
        if out_file is not None:  # written run by run: a later failure loses nothing
            first = overwrite and len(results) == 1
            write_results(to_rows(result, {**base, "perturb": perturb_spec, "layers": scope}), out_file,
                          overwrite=first)

    with err.status(f"probing {batch.response_tokens} tokens…") as status:
        if not specs:
            record(mismatch.probe(ref_lm, cand_lm, batch.input_ids, batch.attention_mask, batch.response_mask,
                                  per_layer=per_layer, clip=clip, chunk_tokens=chunk_tokens), "none", "none")
        else:
            n_blocks = len(model_layout(ref_lm.model).layers)
            scopes = [str(i) for i in range(n_blocks)] if each_layer else [layers]
            # several candidates: keep the reference log-probs (skips its head per probe) if ≤ 2 GiB
            cache_bytes = batch.response_tokens * ref_lm.model.get_output_embeddings().weight.shape[0] * 4
            # scopes that leave the first blocks alone: replay them from the reference pass if ≤ 2 GiB
            skips = each_layer or first_block(ref_lm.model, select(ref_lm.model, layers)) > 0
            blocks_bytes = batch.input_ids.numel() * ref_lm.model.get_input_embeddings().weight.shape[1] * n_blocks * 4
            ref = mismatch.reference(ref_lm, batch.input_ids, batch.attention_mask, batch.response_mask,
                                     per_layer=per_layer, chunk_tokens=chunk_tokens,
                                     cache_logprobs=len(specs) * len(scopes) > 1 and cache_bytes <= 2 << 30,
                                     keep_block_outputs=skips and blocks_bytes <= 2 << 30)
            for spec in specs:
                for scope in scopes:
                    status.update(f"probing {batch.response_tokens} tokens under {spec} [{scope}]…")
                    with perturbed(ref_lm.model, spec, layers=scope, seed=seed,
                                   calibration_ids=batch.input_ids) as cand:
                        result = mismatch.probe(ref, mismatch.LM(cand, ref_lm.tokenizer, reference),
                                                per_layer=per_layer, clip=clip, chunk_tokens=chunk_tokens)
                    record(result, spec, scope)

    if each_layer:
        table = Table("block", *specs, title=escape(f"{reference}: kl_fwd_mean with one block perturbed"))
        by = {(spec, scope): result for spec, scope, result in results}
        for scope in scopes:
            table.add_row(scope, *(f"{by[spec, scope].summary['kl_fwd_mean']:.4g}" for spec in specs))
    elif len(results) == 1:
        label = specs[0] if specs else f"{candidate} [{cand_dtype}]"
        table = Table("metric", "value", title=escape(f"{label} vs {reference} [{ref_dtype}]"))
        for key, value in results[0][2].summary.items():
            table.add_row(key, f"{value:.6g}")
    else:
        table = Table("perturb", *SUMMARY_COLUMNS, title=escape(f"{reference} [{layers}]"))
        for spec, _, result in results:
            table.add_row(escape(spec), *(f"{result.summary[k]:.4g}" for k in SUMMARY_COLUMNS))
    out.print(table)
    if out_file is not None:
        err.print(f"wrote {out_file}", highlight=False)


@app.command()
@_one_line_errors
def opd(
    pair: Annotated[str, typer.Option(help="Student–teacher pair (`mismatch pairs`) or a pair .toml.")],
    rollout: Annotated[list[str] | None, typer.Option(
        help="Rollout copy: a perturbation spec (fp8-e4m3:channel, int4:group128, noise:0.01, bnb-nf4, …), "
             "stale:K, or none (the student itself). Repeat for several runs (same seed and prompts).")] = None,
    staleness: Annotated[int, typer.Option(help="Rollouts from weights K optimizer steps old (with --rollout "
                                                 "too: a stale, perturbed copy).")] = 0,
    layers: Annotated[str, typer.Option(help="Layer scope of the rollout perturbation.")] = "linear",
    loss: Annotated[str, typer.Option(help="pg-rkl, full-rkl or full-fkl.")] = "full-rkl",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 120,
    batch_size: Annotated[int, typer.Option(help="Prompts (rollouts) per step.")] = 128,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3,
    tis_cap: Annotated[float | None, typer.Option(
        help="Truncated importance sampling: weight tokens by min(π_student/π_rollout, CAP); off by default.")] = None,
    temperature: Annotated[float, typer.Option(help="Rollout sampling temperature.")] = 1.0,
    top_p: Annotated[float | None, typer.Option(help="Rollout nucleus sampling; off by default.")] = None,
    eval_every: Annotated[int, typer.Option(help="Held-out evaluation every N steps.")] = 10,
    eval_prompts: Annotated[int, typer.Option(help="Held-out prompts per evaluation.")] = 128,
    seed: Annotated[int, typer.Option(help="Seed of prompts, sampling and noise.")] = 0,
    baseline: Annotated[bool, typer.Option(
        help="Also run the clean configuration (same seed and prompts) and print the tolerance verdict.")] = False,
    kl_tol: Annotated[float, typer.Option(help="Verdict: final held-out KL within (1 + KL_TOL) × clean.")] = 0.10,
    acc_tol: Annotated[float, typer.Option(help="Verdict: final accuracy at least clean − ACC_TOL.")] = 0.02,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Folder for metrics.parquet (tidy rows, written after every step).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out's metrics.parquet instead of appending.")] = False,
) -> None:
    """Train the pair's student by on-policy distillation with rollouts from a mismatched copy."""
    import dataclasses

    import pandas as pd
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mismatch.opd import OPDConfig, train
    from mismatch.opd.recipe import config_columns
    from mismatch.opd.verdict import final_value, verdict
    from mismatch.report_opd import rollout_label
    from mismatch.results import provenance, write_results

    try:
        configs = [OPDConfig(pair=pair, rollout=spec, staleness=staleness, layers=layers, loss=loss, steps=steps,
                           batch_size=batch_size, lr=lr, tis_cap=tis_cap, temperature=temperature, top_p=top_p,
                           eval_every=eval_every, eval_prompts=eval_prompts, seed=seed)
                   for spec in (rollout or ["none"])]
    except ValueError as exc:
        raise MismatchError(str(exc)) from None
    config = configs[0]
    clean = dataclasses.replace(config, rollout="none", staleness=0)
    runs = [("clean", clean)] if baseline else []
    for c in configs:  # each configuration once, the clean one first when it is the baseline
        if (rollout_label(c.rollout, c.staleness), c) not in runs and not (baseline and c == clean):
            runs.append((rollout_label(c.rollout, c.staleness), c))
    metrics_path = out_dir / "metrics.parquet" if out_dir is not None else None
    if metrics_path is not None and overwrite:
        metrics_path.unlink(missing_ok=True)
    stamp = provenance()
    _quiet_transformers()
    results: dict[str, list[dict]] = {}
    for label, cfg in runs:
        run_id = f"{cfg.pair}|{cfg.rollout}|K={cfg.staleness}|{cfg.loss}|seed={cfg.seed}"

        def write(rows: list[dict], cfg=cfg, run_id=run_id) -> None:
            if metrics_path is not None:
                frame = pd.DataFrame(rows).assign(run_id=run_id, **config_columns(cfg), **stamp)
                write_results(frame, metrics_path)

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), console=err, transient=True) as bar:
            task = bar.add_task(f"opd {label} [{cfg.rollout}, K={cfg.staleness}]", total=cfg.steps, info="")

            def progress(step: int, total: int, m: dict, task=task) -> None:
                bar.update(task, completed=step, info=f"loss {m['loss']:.3g}")

            results[label] = train(cfg, on_rows=write, progress=progress)
    columns = ["rollout", "final held-out rKL (nats)", "final held-out accuracy"]
    if baseline:
        columns += [f"KL ratio (≤ {1 + kl_tol:.2f})", f"accuracy Δ (≥ {-100 * acc_tol:.0f} pts)", "verdict"]
    table = Table(*columns, title=escape(f"OPD on {config.pair}, {config.loss}, {config.steps} steps, seed {seed}"))
    for label, _ in runs:
        cells = [escape(label), f"{final_value(results[label], 'heldout_rkl'):.4g}",
                 f"{final_value(results[label], 'heldout_accuracy'):.1%}"]
        if baseline and label != "clean":
            v = verdict(results["clean"], results[label], kl_tol=kl_tol, acc_tol=acc_tol)
            cells += [f"{v['kl_ratio']:.3f}", f"{100 * v['acc_delta']:+.1f}",
                      "TOLERATED" if v["tolerated"] else "NOT tolerated"]
        elif baseline:
            cells += ["1", "0", "baseline"]
        table.add_row(*cells)
    out.print(table)
    if metrics_path is not None:
        err.print(f"wrote {metrics_path}", highlight=False)


pairs_app = typer.Typer(help="Student–teacher pairs: list them (no subcommand) or build the synthetic ones.",
                        invoke_without_command=True, add_completion=False)
app.add_typer(pairs_app, name="pairs")


@pairs_app.callback()
def pairs(ctx: typer.Context) -> None:
    """List every pair: kind, architecture, sizes, task, whether it loads here."""
    if ctx.invoked_subcommand is not None:
        return
    from mismatch.pairs.registry import PAIRS, availability, pair_sizes

    table = Table(title="student–teacher pairs")
    table.add_column("pair", no_wrap=True)
    for column in ("kind", "architecture", "teacher", "student", "params (T / S)", "task", "here"):
        table.add_column(column)
    notes = []
    for name, spec in PAIRS.items():
        missing = availability(spec)
        teacher_params, student_params = pair_sizes(spec)
        table.add_row(name, spec.kind, spec.architecture, escape(spec.teacher), escape(spec.student),
                      f"{teacher_params} / {student_params}", spec.task, "yes" if missing is None else "no")
        if missing is not None:
            notes.append(f"{name}: {missing}")
    out.print(table)
    for note in notes:
        out.print(escape(note), highlight=False, soft_wrap=True)


@pairs_app.command("show")
@_one_line_errors
def pairs_show(
    name: Annotated[str, typer.Argument(help="A pair name or a path to a pair .toml file.")],
) -> None:
    """Load one pair (checking that student and teacher share a vocabulary) and describe it."""
    import mismatch
    from mismatch.models import context_length
    from mismatch.pairs.build import parameter_count

    _quiet_transformers()
    with err.status(f"loading {name}…"):
        pair = mismatch.load_pair(name)
    table = Table("", "teacher", "student", title=escape(f"{pair.name}: {pair.description}"))
    for label, fn in (("model", lambda lm: lm.name),
                      ("architecture", lambda lm: lm.model.config.model_type),
                      ("parameters", lambda lm: f"{parameter_count(lm.model):,}"),
                      ("vocabulary", lambda lm: f"{lm.model.get_output_embeddings().weight.shape[0]:,}"),
                      ("context", lambda lm: str(context_length(lm.model)))):
        table.add_row(label, escape(fn(pair.teacher)), escape(fn(pair.student)))
    table.add_row("context turns", str(len(pair.teacher_context)), str(len(pair.student_context)))
    out.print(table)
    task = getattr(pair.task, "name", "none (KL only)")
    out.print(f"task: {task}; chat: {pair.chat}; max new tokens: {pair.max_new_tokens}", highlight=False)


@pairs_app.command("build")
@_one_line_errors
def pairs_build(
    name: Annotated[str | None, typer.Argument(help="A synthetic pair; default: all of them.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Write the build here instead of the cache (one pair only).")] = None,
) -> None:
    """Train synthetic pairs from scratch (deterministic; minutes on 2 cores) and report accuracies."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mismatch.pairs.registry import SYNTHETIC_RECIPES, build_pair, committed_dir

    names = [name] if name is not None else list(SYNTHETIC_RECIPES)
    unknown = [n for n in names if n not in SYNTHETIC_RECIPES]
    if unknown:
        raise MismatchError(f"only synthetic pairs are built: {', '.join(SYNTHETIC_RECIPES)}; got {unknown[0]!r}")
    if out_dir is not None and len(names) != 1:
        raise MismatchError("--out needs exactly one pair NAME")
    _quiet_transformers()
    for pair_name in names:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as bar:
            tasks: dict[str, int] = {}

            def progress(stage: str, done: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(f"{pair_name}: {stage}", total=total)
                bar.update(tasks[stage], completed=done)

            directory, manifest = build_pair(pair_name, out_dir, progress)
        committed = committed_dir(pair_name) / "manifest.json"
        same = None
        if committed.is_file() and directory.resolve() != committed.parent.resolve():
            import json

            same = json.loads(committed.read_text()).get("files") == manifest["files"]
        out.print(f"{pair_name}: held-out exact match teacher {manifest['teacher_accuracy']:.1%} (greedy) / "
                  f"student {manifest['student_accuracy']:.1%} (temperature-1 samples) "
                  f"({manifest['teacher_params']:,} / {manifest['student_params']:,} parameters), "
                  f"built in {manifest['build_seconds']:.0f} s -> {directory}"
                  + ("" if same is None else f"; identical to the committed weights: {'yes' if same else 'no'}"),
                  highlight=False)


@app.command()
@_one_line_errors
def report(
    results: Annotated[list[Path], typer.Argument(
        help="Result files (.parquet/.csv) written by `probe --out` or `opd --out` (DIR/metrics.parquet).")],
    out_dir: Annotated[Path, typer.Option(help="Folder for the Markdown tables and the plots.")] = Path("reports"),
    kl_tol: Annotated[float, typer.Option(help="OPD verdict: final held-out KL within (1 + KL_TOL) × clean.")] = 0.10,
    acc_tol: Annotated[float, typer.Option(help="OPD verdict: final accuracy at least clean − ACC_TOL.")] = 0.02,
) -> None:
    """Write Markdown tables and plots from result files: probe results (summary.md, per-layer and
    KL plots) and OPD runs (opd_curves.png, opd_verdicts.md)."""
    import pandas as pd

    from mismatch.report import write_report
    from mismatch.report_opd import is_opd, write_opd_report
    from mismatch.results import read_results

    frames = [read_results(p) for p in results]
    written = []
    probe_rows = [f for f in frames if not is_opd(f)]
    opd_rows = [f for f in frames if is_opd(f)]
    if probe_rows:
        written += write_report(pd.concat(probe_rows, ignore_index=True), out_dir)
    if opd_rows:
        written += write_opd_report(pd.concat(opd_rows, ignore_index=True), out_dir, kl_tol=kl_tol, acc_tol=acc_tol)
    for path in written:
        err.print(f"wrote {path}", highlight=False)


def main() -> None:  # pragma: no cover - console entry point helper
    sys.exit(app())
