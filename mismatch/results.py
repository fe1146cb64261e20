"""The results dataset: every kind of run as tidy long rows in one schema, stored as parquet parts.

Schema (one row per run × level × item × metric; lm-eval's result schema does the same):

| column | meaning |
|---|---|
| `kind` | the run kind: `probe` or `opd` |
| `run_id` | content hash of the run's full configuration (`run_id`): same config, same id |
| `level` | `summary`, `layer`, `token` (probe) or `step` (opd) |
| `step` | OPD optimizer step (null for probes) |
| `seq`, `pos`, `token` / `layer`, `index` | the item of token / layer rows (null elsewhere) |
| `metric`, `value` | a metric name (DESIGN.md, `mismatch.opd.train`) and its value as float |
| config columns | the run's configuration, one column per field (a probe's reference, candidate, dtypes, perturb, layers, …; an OPD run's `OPDConfig` fields) |
| provenance | `mismatch_version`, `torch_version`, `transformers_version`, `git_sha`, `timestamp` (UTC) |

Storage is a dataset directory of parquet parts, read back with `pyarrow.dataset` / pandas. A part
holds one finished run (probes) or one flush of a run's rows (OPD); it is written to a temporary
name and renamed, so a reader never sees half a part, and appending never rewrites what is on
disk. Parts are named `<time>-<kind>-<run_id>-<flush>.parquet`: they sort in the order they were
written. Writing a run again (same id) first removes that run's earlier parts. A single `.parquet`
or `.csv` file stays accepted as a destination (the whole file is rewritten through a temporary
file on every append) and older result files, written before `kind` existed, still load.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch
import transformers

from mismatch.errors import InputError
from mismatch.version import __version__

KINDS = ("probe", "opd")
ITEM_COLUMNS = ("step", "seq", "pos", "token", "layer", "index")
FRONT = ("kind", "run_id", "level", "metric", "value", *ITEM_COLUMNS)
PROVENANCE = ("mismatch_version", "torch_version", "transformers_version", "git_sha", "timestamp")
FILE_SUFFIXES = (".parquet", ".csv")
_INT_COLUMNS = ("step", "seq", "pos", "token", "index")


@functools.cache
def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance() -> dict[str, str]:
    """Versions, git sha and UTC timestamp to stamp on every result row."""
    return {"mismatch_version": __version__, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "git_sha": _git_sha(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def run_id(kind: str, config: dict[str, object]) -> str:
    """Content hash (16 hex digits of SHA-256) of a run's kind and full configuration."""
    if kind not in KINDS:
        raise InputError(f"unknown run kind {kind!r}; valid: {', '.join(KINDS)}")
    text = json.dumps({"kind": kind, **config}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tidy(rows: pd.DataFrame, *, kind: str, config: dict[str, object], stamp: dict[str, str] | None = None
         ) -> pd.DataFrame:
    """`rows` (level/metric/value plus item columns) with the schema's kind, run id, item,
    config and provenance columns, in the schema's column order."""
    rows = rows.copy()
    for col in ITEM_COLUMNS:
        if col not in rows:
            rows[col] = None
    for col in _INT_COLUMNS:
        rows[col] = rows[col].astype("Int64")
    rows["layer"] = rows["layer"].astype("string")
    rows["value"] = rows["value"].astype("float64")
    meta = {"kind": kind, "run_id": run_id(kind, config), **config, **(stamp or provenance())}
    for key, value in meta.items():
        rows[key] = value
    return rows[list(FRONT) + [c for c in rows.columns if c not in FRONT]]


def _atomic_write(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.suffix == ".csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class ResultsWriter:
    """Appends runs to a results destination: a dataset directory (parquet parts) or one file.

    Args:
        path: a directory (created if needed), or a path ending in `.parquet` / `.csv`.
        overwrite: start from an empty destination (the directory's parts, or the file, go).
    """

    def __init__(self, path: str | Path, *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.is_file = self.path.suffix in FILE_SUFFIXES
        if self.path.suffix and not self.is_file:
            raise InputError(f"results go to a directory or a .parquet/.csv file, got {self.path.name}")
        if self.is_file and self.path.is_dir():
            raise InputError(f"{self.path} is a directory, not a results file")
        if not self.is_file and self.path.is_file():
            raise InputError(f"{self.path} is a file, not a results directory")
        self._overwrite = overwrite
        self._flushes: dict[str, int] = {}

    def _prepare(self) -> None:
        if self.is_file:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._overwrite:
                self.path.unlink(missing_ok=True)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            if self._overwrite:
                for part in self.path.glob("*.parquet"):
                    part.unlink()
        self._overwrite = False

    def write(self, rows: pd.DataFrame) -> Path:
        """Append the tidy rows of one run (or one flush of a run) and return the file written."""
        self._prepare()
        if self.is_file:
            frame = pd.concat([read_results(self.path), rows], ignore_index=True) if self.path.exists() else rows
            _atomic_write(frame, self.path)
            return self.path
        (kind,), (rid,) = rows["kind"].unique(), rows["run_id"].unique()
        if rid not in self._flushes:  # a run written again replaces its earlier parts
            for part in self.path.glob(f"*-{kind}-{rid}-*.parquet"):
                part.unlink()
        flush = self._flushes[rid] = self._flushes.get(rid, -1) + 1
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + f"{time.time_ns() % 10**9:09d}"
        part = self.path / f"{stamp}-{kind}-{rid}-{flush:05d}.parquet"
        _atomic_write(rows, part)
        return part


def _legacy(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a file written before the `kind` column: probe files have `level`, OPD files
    (`metrics.parquet`) have `step` and no `level`."""
    kind = "probe" if "level" in frame.columns else "opd"
    frame = frame.assign(kind=kind)
    if kind == "opd":
        frame["level"] = "step"
    for col in ITEM_COLUMNS:
        if col not in frame:
            frame[col] = None
    for col in _INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    return frame[list(FRONT) + [c for c in frame.columns if c not in FRONT]]


def _read_parts(directory: Path) -> pd.DataFrame:
    """Every parquet file of a dataset directory, in name (= write) order; parts in the current
    schema through one `pyarrow.dataset` scan, older files (no `kind`) normalised one by one."""
    files = sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        raise InputError(f"results directory {directory} holds no parquet parts")
    schemas = {p: pq.read_schema(p) for p in files}
    parts = [p for p in files if "kind" in schemas[p].names]
    frames = [_legacy(pd.read_parquet(p)) for p in files if p not in parts]
    if parts:
        schema = pa.unify_schemas([schemas[p] for p in parts], promote_options="permissive")
        table = ds.dataset([str(p) for p in parts], schema=schema, format="parquet").to_table()
        frames.insert(0, table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def read_results(path: str | Path) -> pd.DataFrame:
    """Read a results dataset directory, a `.parquet` / `.csv` results file, or an older result
    file (no `kind` column), as one tidy frame in the schema's column order.

    Raises:
        InputError: the path does not exist or is neither a directory nor a .parquet/.csv file.
    """
    path = Path(path)
    if path.is_dir():
        frame = _read_parts(path)
    elif path.suffix not in FILE_SUFFIXES:
        raise InputError(f"result file must end in .parquet or .csv, got {path.name}")
    elif not path.is_file():
        raise InputError(f"results file not found: {path}")
    else:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    return _legacy(frame) if "kind" not in frame.columns else frame


def read_many(paths: Iterable[str | Path]) -> pd.DataFrame:
    """`read_results` of each path, concatenated (columns missing from one source are null)."""
    return pd.concat([read_results(p) for p in paths], ignore_index=True)


def of_kind(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The rows of one run kind, without the columns that are null throughout them."""
    part = rows[rows["kind"] == kind]
    return part.dropna(axis="columns", how="all").reset_index(drop=True)


def config_columns(rows: pd.DataFrame) -> list[str]:
    """The run-level columns (config and provenance) of a tidy frame."""
    return [c for c in rows.columns if c not in ("level", "metric", "value", *ITEM_COLUMNS)]


def summaries(rows: pd.DataFrame) -> pd.DataFrame:
    """Probe runs: one row per run with its summary metrics as columns, plus its config columns."""
    summ = rows[rows["level"] == "summary"]
    wide = summ.pivot_table(index="run_id", columns="metric", values="value", aggfunc="first")
    configs = summ[config_columns(rows)].drop_duplicates("run_id").set_index("run_id")
    return configs.join(wide).reset_index()


def per_layer(rows: pd.DataFrame) -> pd.DataFrame:
    """Probe runs: per-layer metrics, one row per (run, layer), metrics as columns."""
    lay = rows[rows["level"] == "layer"]
    return (lay.pivot_table(index=["run_id", "index", "layer"], columns="metric", values="value",
                            aggfunc="first").reset_index().sort_values(["run_id", "index"]))
