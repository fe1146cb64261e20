"""`mismatch models` and `mismatch probe`: options → one library call → print (registered in `app.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mismatch.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_CLIP
from mismatch.files import json_text
from mismatch.cli.common import Clip, Device, Json, Layers, Out, Overwrite, Threads, early, err, out


def models() -> None:
    """List the built-in model specs (any local HF directory or cached hub id works too)."""
    from rich.table import Table

    from mismatch.model.catalog import list_models  # names only: no torch import (benchmarks/bench_cli.py)

    table = Table("spec", "description", title="built-in models")
    for name, desc in list_models().items():
        table.add_row(name, desc)
    out.print(table)


def probe(
    reference: Annotated[str, typer.Argument(help="Reference model spec (the policy p being trained).")],
    candidate: Annotated[str | None, typer.Argument(help="Candidate model spec (the rollout copy q); omit it "
                                                        "with --perturb (the reference perturbed in place).")] = None,
    perturb: Annotated[list[str] | None, typer.Option(help="Perturbation spec of the candidate (fp8-e4m3:channel, "
                                                           "int4:group128, bnb-nf4, …); repeatable.")] = None,
    layers: Layers = "linear",
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
    clip: Clip = DEFAULT_CLIP,
    chunk_tokens: Annotated[int, typer.Option(help="Tokens per chunk of full-vocabulary work.")] = DEFAULT_CHUNK_TOKENS,
    out_path: Out = None,
    overwrite: Overwrite = False,
    device: Device = "auto",
    threads: Threads = None,
    json_out: Json = False,
) -> None:
    """Probe how far a candidate's next-token distributions are from REFERENCE's."""
    early(models=(reference, candidate), specs=tuple(perturb or ()), files=(("prompts file not found: {path}", prompts),))
    from mismatch.cli import tables as console
    from mismatch.probes.runs import ProbeConfig, run_probes

    config = ProbeConfig(reference=reference, candidate=candidate, perturb=tuple(perturb or ()), layers=layers,
                         each_layer=each_layer, prompts=None if prompts is None else str(prompts),
                         texts=tuple(text or ()), max_prompts=max_prompts, chat=chat, max_new_tokens=max_new_tokens,
                         min_new_tokens=min_new_tokens, temperature=temperature, seed=seed, ref_dtype=ref_dtype,
                         cand_dtype=cand_dtype, per_layer=per_layer, clip=clip, chunk_tokens=chunk_tokens)
    with err.status("probing…") as status:
        results = run_probes(config, out=out_path, overwrite=overwrite, status=status.update, device=device)
    if json_out:
        typer.echo(json_text([{"perturb": r.perturb, "layers": r.layers, "reference": r.result.reference,
                               "candidate": r.result.candidate, "summary": r.result.summary, "notes": r.result.notes}
                              for r in results]))
    else:
        out.print(console.probe_table(config, results))
    console.wrote(err, out_path)
