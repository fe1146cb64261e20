"""Per-step metrics a training run already logged, as one table: `read_log(path)`.

Formats, told apart by what the path is:
  * TRL / transformers `trainer_state.json` (its `log_history`), or a directory holding one (an output
    directory: its own, else the latest `checkpoint-N/`'s);
  * TensorBoard event files (`events.out.tfevents.*`, or a directory of them), read by `tbparse` on
    TensorBoard's own reader (a transformers / TRL run's `train/` prefix removed, its `eval/` keys left out);
  * JSON lines of metric dicts: verl's file logger (`{"step": N, "data": {…}}`), or flat dicts with a
    `step` (prime-rl, a user's own loop);
  * a results dataset of `mismatch opd` / `mismatch sweep` (a directory of parquet parts): one OPD run's
    step rows (`run=` picks one when it holds several).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from mismatch.errors import InputError
from mismatch.files import trailing_number

STEP = "step"
# transformers' TensorBoardCallback logs `epoch` with every training log as `train/epoch` (its `rewrite_logs`
# prefixes every key but `eval_…` with `train/`): its mark, so the names are read without the prefix
TRANSFORMERS_TB_MARK = "train/epoch"
PER_ITEM = ("seq", "pos", "token", "layer", "index")  # a results row's columns that index below a step


def read_log(path: str | Path, *, run: str | None = None) -> tuple[pd.DataFrame, str]:
    """The run's logged metrics and the format they were read as.

    Returns:
        `(table, format)`: one row per logged step (ascending, column `step`), one float column per
        metric name (NaN where a step did not log it; rows of a step logged twice are merged, the later
        value winning); `format` one of `trainer_state`, `tensorboard`, `jsonl`, `results`.

    Raises:
        InputError: no such file, an unknown or unreadable format, no step-indexed metric, or a results
            dataset with several OPD runs and no `run`.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"no log at {path}")
    kind, source = _detect(path)
    try:
        records = _READERS[kind](source, run)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read {source} as {kind}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    return _table(records, source), kind


def _detect(path: Path) -> tuple[str, Path]:
    if path.is_dir():
        if (path / "trainer_state.json").is_file():
            return "trainer_state", path / "trainer_state.json"
        checkpoints = sorted(path.glob("checkpoint-*/trainer_state.json"), key=lambda p: trailing_number(p.parent.name))
        if checkpoints:
            return "trainer_state", checkpoints[-1]
        if any(path.rglob("events.out.tfevents.*")):
            return "tensorboard", path
        if any(path.rglob("*.parquet")):
            return "results", path
        raise InputError(f"{path}: no trainer_state.json, TensorBoard event file or results dataset in it")
    if path.name.startswith("events.out.tfevents."):
        return "tensorboard", path
    if path.suffix == ".json":
        return "trainer_state", path
    if path.suffix in (".jsonl", ".ndjson", ".log", ".txt"):
        return "jsonl", path
    if path.suffix == ".parquet":
        return "results", path
    raise InputError(f"{path}: not a known log format (trainer_state.json, TensorBoard events, .jsonl, results)")


def _trainer_state(path: Path, run) -> list[dict]:
    state = json.loads(path.read_text())
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise InputError(f"{path}: no `log_history` list (not a trainer_state.json)")
    return [row for row in state["log_history"] if isinstance(row, dict)]


def _tensorboard(path: Path, run) -> list[dict]:
    from tbparse import SummaryReader

    scalars = SummaryReader(str(path)).scalars
    if scalars.empty:
        raise InputError(f"{path}: no scalar in its TensorBoard events")
    tags = set(scalars["tag"])
    if TRANSFORMERS_TB_MARK in tags:  # transformers' TensorBoardCallback: `train/` before every training key
        scalars = scalars[scalars["tag"].str.startswith("train/")].assign(tag=lambda f: f["tag"].str[len("train/"):])
    wide = scalars.pivot_table(index="step", columns="tag", values="value", aggfunc="last").reset_index()
    return wide.to_dict("records")


def _jsonl(path: Path, run) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        if isinstance(row.get("data"), dict):  # verl's file logger
            row = {STEP: row.get(STEP), **row["data"]}
        records.append(row)
    return records


def _results(path: Path, run) -> list[dict]:
    from mismatch.results import read_results

    rows = read_results(path)
    opd = rows[rows["kind"] == "opd"] if "kind" in rows else rows.iloc[0:0]
    if opd.empty:
        raise InputError(f"{path}: no OPD run in this results dataset")
    runs = sorted(opd["run_id"].unique())
    if run is None and len(runs) > 1:
        raise InputError(f"{path} holds {len(runs)} OPD runs; choose one with --run (e.g. {runs[0]})")
    chosen = run or runs[0]
    if chosen not in runs:
        raise InputError(f"{path}: no OPD run {chosen!r}")
    mine = opd[opd["run_id"] == chosen]
    per_step = mine[mine[[c for c in PER_ITEM if c in mine]].isna().all(axis=1)]  # not per token / layer
    wide = per_step.pivot_table(index=STEP, columns="metric", values="value", aggfunc="last").reset_index()
    return wide.to_dict("records")


_READERS = {"trainer_state": _trainer_state, "tensorboard": _tensorboard, "jsonl": _jsonl, "results": _results}


def _table(records: list[dict], source: Path) -> pd.DataFrame:
    """Numeric metrics by step: non-numeric values and rows without a step drop out."""
    merged: dict[int, dict[str, float]] = {}
    for row in records:
        step = row.get(STEP)
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not math.isfinite(step):
            continue
        values = merged.setdefault(int(step), {})
        for name, value in row.items():
            if name != STEP and isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(float(value)):
                    values[name] = float(value)
    if not merged:
        raise InputError(f"{source}: no metric logged with a step")
    table = pd.DataFrame.from_dict(merged, orient="index").sort_index()
    table.index.name = STEP
    return table.reset_index()
