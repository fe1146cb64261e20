"""OPD runs as a library verb: plan a set of runs, train them, write their rows to a results dataset.

`plan` turns one base configuration and a list of rollout specs into the runs to do — the clean
baseline first (when asked), each configuration once. `run_all` trains them one after the other,
streams each run's tidy rows (`mismatch.results` schema, kind `opd`) into a results destination in
flushes (one part per evaluation step, and whatever is left when a run ends or fails), and returns
all rows. The CLI's `mismatch opd` is `plan` + `run_all` + `verdict_table`; a sweep calls the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from mismatch.errors import InputError, MismatchError
from mismatch.files import check_writable
from mismatch.rollout.cost import COST_FACTOR_COLUMNS, cost_factors
from mismatch.rollout.spec import require_engines
from mismatch.opd.config import OMITTED_AT_DEFAULT, OPDConfig, where_columns
from mismatch.opd.trainer import train
from mismatch.pairs.load import pair_digest, student_architecture
from mismatch.results import ResultsWriter, provenance, read_results, run_id, tidy, write_frame

RunProgress = Callable[[int, str, int, int, dict[str, float]], None]  # (run index, label, step, steps, metrics)
EVAL_CACHE = "_cache/initial_eval"  # inside a results directory: step 0's evaluations (`mismatch.opd.evaluate.initial_evaluation`)


def run_columns(config: OPDConfig) -> dict[str, object]:
    """The configuration columns of a run's rows: every `OPDConfig` field and `pair_sha256`, the
    digest of the pair's data (`mismatch.pairs.pair_digest`); with the toolkit's version they make
    the run's id (`mismatch.results.run_id`). The fields of `OMITTED_AT_DEFAULT` only away from their
    default (a device by its type: the same numbers on any `cuda:N`)."""
    columns = {k: v for k, v in dataclasses.asdict(config).items() if k not in OMITTED_AT_DEFAULT}
    return {**columns, **where_columns(config), "pair_sha256": pair_digest(config.pair)}


def run_cost_factors(config: OPDConfig) -> dict[str, float]:
    """The rollout cost factors of a run (`mismatch.rollout.cost.COST_FACTOR_COLUMNS`) on its pair
    student's architecture, written on its rows so that reports cost it without a model; NaN where it is
    not costed (an engine's export, whose stored types depend on the shapes) or the architecture is not
    local."""
    rollout = config.rollout_spec
    if rollout.engine is not None:
        return dict.fromkeys(COST_FACTOR_COLUMNS, math.nan)
    try:
        model = student_architecture(config.pair)
    except MismatchError:
        return dict.fromkeys(COST_FACTOR_COLUMNS, math.nan)
    return cost_factors(model, rollout.perturbation_spec, config.layers)


def add_cost_factors(path: str | Path) -> int:
    """Write the cost factors (`run_cost_factors`) onto the OPD runs of a results dataset that lack them
    (runs written before mismatch stored them), so that `mismatch report` costs them as it costs new
    runs: each parquet part of a dataset directory, or a results file, is rewritten through a temporary
    file (all or nothing per file). Returns the number of OPD runs given factors.

    Raises:
        InputError: `path` is not a results dataset or file.
    """
    path = Path(path)
    targets = sorted(p for p in path.glob("*-opd-*.parquet") if not p.name.startswith(".")) if path.is_dir() else [path]
    if path.is_dir() and not targets:
        raise InputError(f"no OPD parts in {path}")
    done: set[str] = set()
    factors: dict[tuple, dict[str, float]] = {}  # a run's flushes share its factors: computed once per rollout
    for target in targets:
        frame = read_results(target)
        opd = frame["kind"] == "opd"
        if not opd.any() or set(COST_FACTOR_COLUMNS) <= set(frame.columns):  # written with them (NaN: not costed)
            continue
        for rid, run in frame[opd].groupby("run_id", sort=False):
            first = run.iloc[0]
            key = (str(first["pair"]), str(first["rollout"]), int(first["staleness"]), str(first["layers"]))
            if key not in factors:
                pair, rollout, staleness, layers = key
                factors[key] = run_cost_factors(OPDConfig(pair=pair, rollout=rollout, staleness=staleness,
                                                          layers=layers))
            for name, value in factors[key].items():
                frame.loc[frame["run_id"] == rid, name] = value
            done.add(str(rid))
        write_frame(frame, target)
    return len(done)


def plan(base: OPDConfig, rollouts: Sequence[str] = (), *, baseline: bool = False) -> list[OPDConfig]:
    """The runs to do: `base` with each rollout spec (`base` itself if none), each once, with the
    clean run (`base.clean()`) first when `baseline` is set.

    Raises:
        InputError: a rollout spec that does not parse.
    """
    configs = [dataclasses.replace(base, rollout=r) for r in rollouts] or [base]
    runs = [base.clean()] if baseline else []
    for config in configs:
        if config not in runs and not (baseline and config.is_clean):
            runs.append(config)
    return runs


def save_dir(root: str | Path, configs: Sequence[OPDConfig], config: OPDConfig) -> Path:
    """Where `run_all(save_to=root)` writes `config`'s final student: `root` itself for a single run,
    else `root/<label>` (characters other than letters, digits, `.`, `_`, `-` become `_`)."""
    if len(configs) == 1:
        return Path(root)
    return Path(root) / re.sub(r"[^A-Za-z0-9._-]+", "_", config.label)


def run_all(configs: Sequence[OPDConfig], *, out: str | Path | None = None, overwrite: bool = False,
            save_to: str | Path | None = None, progress: RunProgress | None = None) -> pd.DataFrame:
    """Train every configuration (in order) and return their tidy rows (kind `opd`).

    Args:
        configs: from `plan`.
        out: a results directory (parquet parts) or a `.parquet` / `.csv` file; None: keep in memory.
        overwrite: start `out` afresh instead of appending to it.
        save_to: write each final student as a Hugging Face directory (`save_dir`).
        progress: `progress(run_index, label, step, steps, metrics)` after every step.

    Returns:
        All runs' rows; each run's rows are on disk (when `out` is given) as soon as they are
        flushed, so a run that fails keeps every step it finished.
    """
    require_engines([c.rollout for c in configs])  # before the clean baseline trains, not after it
    writer = ResultsWriter(out, overwrite=overwrite) if out is not None else None  # checks `out` is writable
    if save_to is not None:
        check_writable(save_to, "--save", folder=True)
    stamp = provenance()
    with writer if writer is not None else contextlib.nullcontext():  # overwrite takes effect at its end
        frames = [_run_one(configs, index, writer, stamp, save_to, progress) for index in range(len(configs))]
    return pd.concat(frames, ignore_index=True)


def _run_one(configs: Sequence[OPDConfig], index: int, writer: ResultsWriter | None, stamp: dict,
             save_to: str | Path | None, progress: RunProgress | None) -> pd.DataFrame:
    """Train `configs[index]`, flushing its rows to `writer` at every evaluation and when it ends or
    fails; its tidy rows."""
    config = configs[index]
    columns = run_columns(config)
    stamp = {**stamp, **run_cost_factors(config)}  # beside the provenance: not part of the run's id
    pending: list[dict] = []

    def flush() -> None:
        if writer is not None and pending:
            writer.write(tidy(pd.DataFrame(pending).assign(level="step"), kind="opd", config=columns, stamp=stamp))
        pending.clear()

    def on_rows(rows: list[dict]) -> None:
        pending.extend(rows)
        if any(r["metric"] == "heldout_rkl" for r in rows):  # an evaluation step: a natural flush point
            flush()

    def on_step(step: int, steps: int, metrics: dict) -> None:
        if progress is not None:
            progress(index, config.label, step, steps, metrics)

    try:
        rows = train(config, on_rows=on_rows, progress=on_step,
                     save_to=None if save_to is None else save_dir(save_to, configs, config),
                     eval_cache=None if writer is None or writer.is_file else writer.path / EVAL_CACHE)
    finally:
        flush()
    if writer is not None:  # the run is complete: an earlier copy of it can go
        writer.finish("opd", run_id("opd", columns))
    return tidy(pd.DataFrame(rows).assign(level="step"), kind="opd", config=columns, stamp=stamp)
