"""Per-step metrics a training run already logged, as one table: `read_log(path)`; and the run's framework
configuration, where the user gives it: `read_config(path)`.

Formats, told apart by what the path is:
  * TRL / transformers `trainer_state.json` (its `log_history`), or a directory holding one (an output
    directory: its own, else the latest `checkpoint-N/`'s);
  * TensorBoard event files (`events.out.tfevents.*`, or a directory of them), read by `tbparse` on
    TensorBoard's own reader (a transformers / TRL run's `train/` prefix removed, its `eval/` keys left out);
    the hparams they hold are the run's config (NeMo RL logs its whole config there);
  * JSON lines of metric dicts: verl's file logger (`{"step": N, "data": {…}}`), or flat dicts with a
    `step` (prime-rl, a user's own loop);
  * a results dataset of `mismatch opd` / `mismatch sweep` (a directory of parquet parts): one OPD run's
    step rows (`run=` picks one when it holds several).

A logged value that is not finite stays in the table: it is the loudest thing a log can say. Each writer
keeps it its own way: Python's `json` (transformers, prime-rl's file monitor, a user's loop) writes `NaN` /
`Infinity`, read back as such; verl's file logger serializes with orjson, which writes every non-finite float
as `null` (verl/utils/tracking.py:543-545), so a `null` there is read as NaN (its sign is lost); TensorBoard
and parquet store the float. A live log's half-written last line (no newline yet) is skipped with a note.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from mismatch.errors import InputError
from mismatch.files import trailing_number
from mismatch.monitor.names import flat_config

STEP = "step"
# transformers' TensorBoardCallback logs `epoch` with every training log as `train/epoch` (its `rewrite_logs`
# prefixes every key but `eval_…` with `train/`): its mark, so the names are read without the prefix
TRANSFORMERS_TB_MARK = "train/epoch"
PER_ITEM = ("seq", "pos", "token", "layer", "index")  # a results row's columns that index below a step
CONFIG_SUFFIXES = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON", ".toml": "TOML"}


@dataclass
class Log:
    """A run's logged metrics. `values`: one row per logged step (index `step`, ascending), one float column
    per name, as logged (non-finite values kept; NaN also where the step did not log the name; rows of a
    step logged twice are merged, the later value winning); `logged`: bool, the same shape, whether the step
    logged the name (whatever its value); `format`: `trainer_state`, `tensorboard`, `jsonl` or `results`;
    `config`: the run's own configuration where the log carries it (flat dotted keys); `notes`: what was
    read around (a half-written last line)."""

    values: pd.DataFrame
    logged: pd.DataFrame
    format: str
    config: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_log(path: str | Path, *, run: str | None = None) -> Log:
    """The run's logged metrics (`Log`).

    Raises:
        InputError: no such file, an unknown or unreadable format, no step-indexed metric, a malformed line
            of a JSON-lines log other than a half-written last one, or a results dataset with several OPD
            runs and no `run`.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"no log at {path}")
    kind, source = _detect(path)
    try:
        records, config, notes = _READERS[kind](source, run)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"cannot read {source} as {kind}: {first}") from None
    values, logged = _table(records, source)
    return Log(values, logged, kind, config, notes)


def read_config(source: str | Path | Mapping[str, object]) -> dict[str, object]:
    """A framework's run configuration as flat dotted keys (`mismatch.monitor.names.flat_config`): a mapping,
    or a YAML (verl's hydra `config.yaml`, NeMo RL's), JSON (slime's args) or TOML (prime-rl's) file. A W&B
    run's `config.yaml` (`wandb_version` beside `{key: {value: …}}` entries, as slime logs its args) is read
    as its values.

    Raises:
        InputError: no such file, another suffix, or a file that does not parse to a mapping.
    """
    if isinstance(source, Mapping):
        config = dict(source)
    else:
        path = Path(source)
        kind = CONFIG_SUFFIXES.get(path.suffix.lower())
        if not path.is_file():
            raise InputError(f"no framework config at {path}")
        if kind is None:
            raise InputError(f"{path}: a framework config is YAML, JSON or TOML ({', '.join(CONFIG_SUFFIXES)})")
        try:
            config = _parse_config(path.read_text(encoding="utf-8"), kind)
        except (OSError, ValueError) as exc:  # yaml.YAMLError, json / tomllib decode errors are ValueErrors here
            raise InputError(f"cannot read {path} as {kind}: {str(exc).splitlines()[0]}") from None
        if not isinstance(config, dict):
            raise InputError(f"{path}: a framework config is a mapping of settings, got {type(config).__name__}")
    if "wandb_version" in config:  # a W&B run's config.yaml: {key: {"desc": …, "value": …}}
        config = {k: v["value"] for k, v in config.items() if isinstance(v, dict) and "value" in v}
    return flat_config(config)


def _parse_config(text: str, kind: str) -> object:
    if kind == "JSON":
        return json.loads(text)
    if kind == "TOML":
        import tomllib

        return tomllib.loads(text)
    import yaml  # PyYAML: a dependency of transformers

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


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


def _trainer_state(path: Path, run) -> tuple[list[dict], dict, list[str]]:
    state = json.loads(path.read_text())  # transformers writes json.dumps: NaN / Infinity read back as floats
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise InputError(f"{path}: no `log_history` list (not a trainer_state.json)")
    return [row for row in state["log_history"] if isinstance(row, dict)], {}, []


def _tensorboard(path: Path, run) -> tuple[list[dict], dict, list[str]]:
    from tbparse import SummaryReader

    reader = SummaryReader(str(path))
    scalars = reader.scalars
    if scalars.empty:
        raise InputError(f"{path}: no scalar in its TensorBoard events")
    if TRANSFORMERS_TB_MARK in set(scalars["tag"]):  # transformers' TensorBoardCallback: `train/` before each key
        scalars = scalars[scalars["tag"].str.startswith("train/")].assign(tag=lambda f: f["tag"].str[len("train/"):])
    records = [{STEP: step, tag: value} for step, tag, value in scalars[[STEP, "tag", "value"]].itertuples(index=False)]
    hparams = reader.hparams
    config = dict(zip(hparams["tag"], hparams["value"])) if not hparams.empty else {}
    return records, config, []


def _jsonl(path: Path, run) -> tuple[list[dict], dict, list[str]]:
    text = path.read_text()
    lines = text.splitlines()
    records, notes = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith(("\n", "\r")):  # still being written: a live log
                notes.append(f"{path}: line {number} skipped, half-written (no newline yet; the run is still writing)")
                break
            raise InputError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        if isinstance(row.get("data"), dict):  # verl's file logger; orjson wrote each non-finite float as null
            row = {STEP: row.get(STEP), **{k: math.nan if v is None else v for k, v in row["data"].items()}}
        records.append(row)
    return records, {}, notes


def _results(path: Path, run) -> tuple[list[dict], dict, list[str]]:
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
    return [{STEP: step, name: value} for step, name, value in
            per_step[[STEP, "metric", "value"]].itertuples(index=False)], {}, []


_READERS = {"trainer_state": _trainer_state, "tensorboard": _tensorboard, "jsonl": _jsonl, "results": _results}


def _table(records: list[dict], source: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Numeric metrics by step (values, and whether each was logged): non-numeric values and rows without a
    finite step drop out; non-finite values stay."""
    merged: dict[int, dict[str, float]] = {}
    for row in records:
        step = row.get(STEP)
        if not _number(step) or not math.isfinite(step):
            continue
        values = merged.setdefault(int(step), {})
        for name, value in row.items():
            if name != STEP and _number(value):
                values[name] = float(value)
    if not merged:
        raise InputError(f"{source}: no metric logged with a step")
    values = pd.DataFrame.from_dict(merged, orient="index", dtype=float).sort_index()
    values.index.name = STEP
    logged = pd.DataFrame({name: [name in merged[s] for s in values.index] for name in values.columns},
                          index=values.index, dtype=bool)
    return values, logged


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
