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
out = Console()


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


@app.command()
@_one_line_errors
def probe(
    reference: Annotated[str, typer.Argument(help="Reference model spec (the policy p being trained).")],
    candidate: Annotated[str, typer.Argument(help="Candidate model spec (the rollout copy q).")],
    prompts: Annotated[Path | None, typer.Option(help="Text file, one prompt per line.")] = None,
    text: Annotated[list[str] | None, typer.Option(help="A prompt given inline; repeatable.")] = None,
    chat: Annotated[bool, typer.Option(help="Wrap each prompt in the tokenizer's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(
        help="Generate a response of at most this many tokens with the reference and score only the "
             "response; 0 scores the prompt text itself.")] = 0,
    min_new_tokens: Annotated[int, typer.Option(help="Forbid EOS before this many response tokens.")] = 0,
    temperature: Annotated[float, typer.Option(help="Response sampling temperature; 0 is greedy.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of response sampling and of tiny random-init models.")] = 0,
    ref_dtype: Annotated[str, typer.Option(help="Reference dtype: fp32, bf16 or fp16.")] = "fp32",
    cand_dtype: Annotated[str, typer.Option(help="Candidate dtype: fp32, bf16 or fp16.")] = "fp32",
    per_layer: Annotated[bool, typer.Option(help="Also compare every layer's hidden states.")] = True,
    clip: Annotated[float, typer.Option(help="Importance ratios outside [1/clip, clip] are counted.")] = 2.0,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk of full-vocabulary work.")] = 1024,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write tidy rows to this .parquet or .csv.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out instead of appending to it.")] = False,
) -> None:
    """Probe how far CANDIDATE's next-token distributions are from REFERENCE's."""
    import mismatch
    from mismatch.errors import InputError
    from mismatch.models import parse_dtype
    from mismatch.results import to_rows, write_results
    from mismatch.rollout import generate, read_prompts, teacher_forced

    if (prompts is None) == (not text):
        raise InputError("give exactly one of --prompts FILE or --text TEXT")
    if out_file is not None and out_file.suffix not in (".parquet", ".csv"):
        raise InputError(f"--out must end in .parquet or .csv, got {out_file.name}")
    ref_dt, cand_dt = parse_dtype(ref_dtype), parse_dtype(cand_dtype)
    texts = read_prompts(prompts) if prompts is not None else list(text)
    _quiet_transformers()
    with err.status("loading models…"):
        ref_lm = mismatch.load(reference, dtype=ref_dt, seed=seed)
        same = (reference, ref_dt) == (candidate, cand_dt)
        cand_lm = ref_lm if same else mismatch.load(candidate, dtype=cand_dt, seed=seed)
    if max_new_tokens > 0:
        with err.status(f"generating {len(texts)} responses with {reference}…"):
            batch = generate(ref_lm, texts, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                             chat=chat, temperature=temperature, seed=seed)
    else:
        batch = teacher_forced(ref_lm, texts, chat=chat)
    with err.status(f"probing {batch.response_tokens} tokens…"):
        result = mismatch.probe(ref_lm, cand_lm, batch.input_ids, batch.attention_mask,
                                batch.response_mask, per_layer=per_layer, clip=clip, chunk_tokens=chunk_tokens)

    table = Table("metric", "value", title=escape(f"{candidate} [{cand_dtype}] vs {reference} [{ref_dtype}]"))
    for key, value in result.summary.items():
        table.add_row(key, f"{value:.6g}")
    out.print(table)
    if out_file is not None:
        config = {"ref_dtype": ref_dtype, "cand_dtype": cand_dtype, "perturb": "none", "layers": "none",
                  "clip": clip, "seed": seed, "chat": chat, "max_new_tokens": max_new_tokens,
                  "min_new_tokens": min_new_tokens, "temperature": temperature,
                  "prompts": str(prompts) if prompts is not None else "inline", "n_prompts": len(texts)}
        path = write_results(to_rows(result, config), out_file, overwrite=overwrite)
        err.print(f"wrote {path}", highlight=False)


@app.command()
@_one_line_errors
def report(
    results: Annotated[list[Path], typer.Argument(help="Result files (.parquet/.csv) written by `probe --out`.")],
    out_dir: Annotated[Path, typer.Option(help="Folder for summary.md and the plots.")] = Path("reports"),
) -> None:
    """Write a Markdown summary and per-layer / KL plots from result files."""
    import pandas as pd

    from mismatch.report import write_report
    from mismatch.results import read_results

    rows = pd.concat([read_results(p) for p in results], ignore_index=True)
    for path in write_report(rows, out_dir):
        err.print(f"wrote {path}", highlight=False)


def main() -> None:  # pragma: no cover - console entry point helper
    sys.exit(app())
