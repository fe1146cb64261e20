"""The results dataset: every kind of run as tidy long rows in one schema, stored as parquet parts.

Schema (one row per run × level × item × metric; lm-eval's result schema does the same):

| column | meaning |
|---|---|
| `kind` | the run kind: `probe` or `opd` |
| `run_id` | content hash of the run's full configuration (`run_id`): same config, same id |
| `level` | `summary`, `layer`, `token` (probe) or `step` (opd) |
| `step` | OPD optimizer step (null for probes) |
| `seq`, `pos`, `token` / `layer`, `index` | the item of token / layer rows (null elsewhere) |
| `metric`, `value` | a metric name (docs/design.md, `mismatch.opd.train`) and its value as float |
| config columns | the run's configuration, one column per field (a probe's reference, candidate, dtypes, perturb, layers, …; an OPD run's `OPDConfig` fields) |
| provenance | `mismatch_version`, `torch_version`, `transformers_version`, `git_sha`, `torch_threads`, `timestamp` (UTC) |

Storage is a dataset directory of parquet parts, read back with `pyarrow.dataset` / pandas. A part
holds one finished run (probes) or one flush of a run's rows (OPD); it is written to a temporary
name and renamed, so a reader never sees half a part, and appending never rewrites what is on
disk. Parts are named `<time>-<kind>-<run_id>-<writer>-<flush>.parquet`: they sort in the order
they were written. Writing a run again (same id) adds new parts and removes the old ones only once
the new run has ended (`ResultsWriter.finish`); until then readers keep the newest row of each
(run, item, metric). A single `.parquet` or `.csv` file stays accepted as a destination (the whole
file is rewritten through a temporary file on every append) and older result files, written
before `kind` existed, still load.

Writers in several processes may share a destination: a writer holds a lock on each run it is
writing (`DIR/.locks/<kind>-<run_id>.lock`, from its first part to `finish`), so a second writer of
the same run waits for the first to finish before it writes (then replaces its parts, as a rewrite
does) and never removes parts of a run still being written; a single file is locked for each
read-and-rewrite. The locks are `filelock`'s (an OS lock: a writer that dies releases it).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from filelock import FileLock

from mismatch.errors import InputError
from mismatch.files import atomic_write, check_writable
from mismatch.hashing import content_hash
from mismatch.version import ID_SCHEMA, __version__

KINDS = ("probe", "opd")
ITEM_COLUMNS = ("step", "seq", "pos", "token", "layer", "index")
FRONT = ("kind", "run_id", "level", "metric", "value", *ITEM_COLUMNS)
PROVENANCE = ("mismatch_version", "torch_version", "transformers_version", "git_sha", "torch_threads", "timestamp")
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
    """Versions, git sha, torch's intra-op thread count (fp32 sums depend on it in the last bits)
    and UTC timestamp (the `PROVENANCE` columns) to stamp on every result row. Whoever writes rows has
    torch loaded; a reader of results never does (imported here, not at the top)."""
    import torch
    import transformers

    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return dict(zip(PROVENANCE, (__version__, torch.__version__, transformers.__version__, _git_sha(),
                                 torch.get_num_threads(), now)))


def run_id(kind: str, config: dict[str, object]) -> str:
    """Content hash (16 hex digits of SHA-256) of a run's kind, full configuration, the toolkit's
    version (`mismatch_version`) and the id schema (`mismatch.version.ID_SCHEMA`). The configuration includes the digests of the data the
    run reads (`pair_sha256`, `reference_sha256`, `prompts_sha256`). Values are canonical first
    (`1`, `1.0` and `numpy.int64(1)` hash alike; NaN as None), so a configuration read back from a
    results table gives its run's id again (with the same toolkit version)."""
    if kind not in KINDS:
        raise InputError(f"unknown run kind {kind!r}; valid: {', '.join(KINDS)}")
    return content_hash({"kind": kind, "mismatch_version": __version__, "id_schema": ID_SCHEMA, **config})


RENAMED_METRICS = {"ppl_ratio": "ppl_cand_over_ref"}  # probe summaries of mismatch ≤ 0.2.0: same definition


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Item columns present and typed (integers as nullable Int64, `layer` as string), in the
    schema's column order; summary metrics written under an earlier name renamed."""
    frame = frame.copy()
    if "metric" in frame and "level" in frame:
        old = (frame["level"] == "summary") & frame["metric"].isin(list(RENAMED_METRICS))
        frame.loc[old, "metric"] = frame.loc[old, "metric"].map(RENAMED_METRICS)
    for col in ITEM_COLUMNS:
        if col not in frame:
            frame[col] = None
    for col in _INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    frame["layer"] = frame["layer"].astype("string")
    frame["value"] = frame["value"].astype("float64")
    return frame[list(FRONT) + [c for c in frame.columns if c not in FRONT]]


def tidy(rows: pd.DataFrame, *, kind: str, config: dict[str, object], stamp: dict[str, str] | None = None
         ) -> pd.DataFrame:
    """`rows` (level/metric/value plus item columns) with the schema's kind, run id, item,
    config and provenance columns, in the schema's column order."""
    meta = {"kind": kind, "run_id": run_id(kind, config), **config, **(stamp or provenance())}
    return _normalise(rows.assign(**{k: [v] * len(rows) for k, v in meta.items()}))


def write_frame(frame: pd.DataFrame, path: Path) -> None:
    """Write `frame` to `path` (`.csv`, else parquet), complete or not at all: to a temporary name
    beside it, then renamed; the temporary file never stays behind."""
    atomic_write(path, (lambda tmp: frame.to_csv(tmp, index=False)) if path.suffix == ".csv"
                 else (lambda tmp: frame.to_parquet(tmp, index=False)))


class ResultsWriter:
    """Appends runs to a results destination: a dataset directory (parquet parts) or one file.

    A run written again (same id) never destroys the earlier copy before the new one is complete:
    its new parts are added beside the old ones, `finish` removes the old ones once the run has
    ended, and readers keep the newest row of each (run, item, metric) meanwhile — the same numbers
    for a deterministic run, so an interrupted rewrite still reads as one run. With `overwrite`, the
    destination's earlier content goes only at `close`, once every run of this writer has ended:
    a writing that fails or is interrupted loses nothing. Use it as a context manager (closed only
    when the block ends without an exception).

    Args:
        path: a directory (created if needed), or a path ending in `.parquet` / `.csv`.
        overwrite: start from an empty destination: what it held before this writer goes at `close`.
    """

    def __init__(self, path: str | Path, *, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.is_file = self.path.suffix in FILE_SUFFIXES  # anything else is a directory (`smollm2-1.7b` too)
        if self.is_file and self.path.is_dir():
            raise InputError(f"{self.path} is a directory, not a results file")
        if not self.is_file and self.path.is_file():
            raise InputError(f"{self.path} is a file, not a results directory")
        check_writable(self.path, "results", folder=not self.is_file)  # before any run, not after it
        self._overwrite = overwrite
        self._earlier: list[Path] = []  # with overwrite: the directory's parts before this writer
        self._mine: list[pd.DataFrame] = []  # with overwrite, a file: the rows this writer wrote
        self._session = f"w{os.getpid():x}{time.time_ns() % 16**8:08x}"  # tells this writer's parts apart
        self._flushes: dict[str, int] = {}
        self._locks: dict[str, FileLock] = {}  # run id → its lock, held from its first part to `finish`
        self._prepared = False

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.close()
        finally:
            self._release()

    def _release(self) -> None:
        for lock in self._locks.values():
            lock.release(force=True)
        self._locks.clear()

    def _run_lock(self, kind: str, rid: str) -> None:
        """Hold the lock of run `rid` (waiting while another writer holds it) before its first part."""
        if rid not in self._locks:
            folder = self.path / ".locks"
            folder.mkdir(exist_ok=True)
            lock = FileLock(folder / f"{kind}-{rid}.lock", is_singleton=True)
            lock.acquire()
            self._locks[rid] = lock

    def _file_lock(self) -> FileLock:
        return FileLock(self.path.with_name(f".{self.path.name}.lock"), is_singleton=True)

    def _prepare(self) -> None:
        if self._prepared:
            return
        if self.is_file:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            if self._overwrite:
                self._earlier = sorted(self.path.glob("*.parquet"))
        self._prepared = True

    def write(self, rows: pd.DataFrame) -> Path:
        """Append the tidy rows of one run (or one flush of a run) and return the file written."""
        self._prepare()
        if self.is_file:
            with self._file_lock():  # another process's append between the read and the rename would be lost
                frame = pd.concat([read_results(self.path), rows], ignore_index=True) if self.path.exists() else rows
                write_frame(frame, self.path)
            if self._overwrite:
                self._mine.append(rows)
            return self.path
        (kind,), (rid,) = rows["kind"].unique(), rows["run_id"].unique()
        self._run_lock(kind, rid)
        flush = self._flushes[rid] = self._flushes.get(rid, -1) + 1
        ns = time.time_ns()  # one clock read: parts sort in the order they were written
        stamp = _dt.datetime.fromtimestamp(ns // 10**9, _dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + f"{ns % 10**9:09d}"
        part = self.path / f"{stamp}-{kind}-{rid}-{self._session}-{flush:05d}.parquet"
        write_frame(rows, part)
        return part

    def finish(self, kind: str, rid: str) -> None:
        """The run has ended: remove its parts written by earlier writers (a directory only; a
        single file keeps every row and its readers keep the newest)."""
        if self.is_file or rid not in self._flushes:
            return
        for part in self.path.glob(f"*-{kind}-{rid}-*.parquet"):
            if part.name.split("-")[3] != self._session:
                part.unlink(missing_ok=True)
        self._locks.pop(rid).release(force=True)

    def close(self) -> None:
        """Every run of this writer has ended. With `overwrite`, and once it wrote something, what the
        destination held before goes now: the earlier parts, or the file's earlier rows."""
        if not self._overwrite or not self._prepared:
            return
        if self.is_file and self._mine:
            with self._file_lock():
                write_frame(pd.concat(self._mine, ignore_index=True), self.path)
        for part in self._earlier:
            part.unlink(missing_ok=True)
        self._overwrite, self._earlier, self._mine = False, [], []


ROW_KEY = ("kind", "run_id", "level", *ITEM_COLUMNS, "metric")  # what one row measures


def newest_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with one row per `ROW_KEY`: the last one written (a rewritten run's newer rows win)."""
    if not frame.duplicated(subset=list(ROW_KEY), keep="last").any():
        return frame
    return frame.drop_duplicates(subset=list(ROW_KEY), keep="last").reset_index(drop=True)


def _legacy(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a file written before the `kind` column: probe files have `level`, OPD files
    (`metrics.parquet`) have `step` and no `level`."""
    kind = "probe" if "level" in frame.columns else "opd"
    frame = frame.assign(kind=kind)
    if kind == "opd":
        frame["level"] = "step"
    return _normalise(frame)


_STRING_COLUMNS = ("kind", "run_id", "level", "layer", "metric", "git_sha", "prompts_sha256", "perturb", "layers",
                   "rollout", "timestamp")  # never parsed as numbers from CSV (hex ids, block indices)


def _schema(path: Path) -> pa.Schema:
    """A parquet part's schema; a corrupt or truncated file is a one-line error naming it."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path} is not a readable parquet file ({str(exc).splitlines()[0]}); "
                         "move it out of the results directory") from None


def _to_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as pandas, integers as nullable Int64 (an unset setting reads `<NA>`), the same
    whether the rows came from one parquet file or from a directory's parts (a CSV file keeps pandas'
    own dtypes)."""
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def _read_file(path: Path) -> pd.DataFrame:
    try:
        if path.suffix == ".parquet":
            return _to_frame(pq.read_table(path))
        return pd.read_csv(path, dtype={c: "string" for c in _STRING_COLUMNS}, keep_default_na=True)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{path} is not a readable results file ({str(exc).splitlines()[0]})") from None


def _writer_of(part: Path) -> str | None:
    """The writer session of a part (`<time>-<kind>-<run_id>-w<session>-<flush>.parquet`)."""
    fields = part.name.split("-")
    return fields[3] if len(fields) == 5 and fields[3].startswith("w") else None


def _read_parts(directory: Path) -> pd.DataFrame:
    """Every parquet file of a dataset directory: older files (no `kind`) first, each normalised,
    then the parts in name (= write) order through one `pyarrow.dataset` scan. When a run has parts
    from several writers (a rewrite not finished yet), the newest row of each item wins."""
    files = sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        raise InputError(f"results directory {directory} holds no parquet parts")
    schemas = {p: _schema(p) for p in files}
    parts = [p for p in files if "kind" in schemas[p].names]
    frames = [_legacy(_read_file(p)) for p in files if p not in parts]
    if parts:
        try:
            schema = pa.unify_schemas([schemas[p] for p in parts], promote_options="permissive")
            table = ds.dataset([str(p) for p in parts], schema=schema, format="parquet").to_table()
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise InputError(f"results in {directory} disagree on a column's type: {str(exc).splitlines()[0]}") from None
        frames.append(_to_frame(table))
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    writers: dict[tuple[str, ...], set[str | None]] = {}
    for p in parts:
        writers.setdefault(tuple(p.name.split("-")[1:3]), set()).add(_writer_of(p))
    return newest_rows(frame) if any(len(w) > 1 for w in writers.values()) else frame


def read_results(path: str | Path) -> pd.DataFrame:
    """Read a results dataset directory, a `.parquet` / `.csv` results file, or an older result
    file (no `kind` column), as one tidy frame in the schema's column order.

    Raises:
        InputError: the path does not exist, is a file of another type, or its parts disagree.
    """
    path = Path(path)
    if path.is_dir():
        return _read_parts(path)
    if not path.exists():
        raise InputError(f"results not found: {path}")
    if path.suffix not in FILE_SUFFIXES:
        raise InputError(f"a results file must end in .parquet or .csv, got {path.name}")
    frame = _read_file(path)
    missing = [c for c in ("metric", "value") if c not in frame.columns]
    if missing:
        looks = (" (it looks like the per-token table `score-rollouts --out` writes)"
                 if {"seq", "pos", "logp_ref", "logp_cand"} <= set(frame.columns) else "")
        raise InputError(f"{path} is not a results table: no {' or '.join(missing)} column{looks}; results are "
                         "what probe, opd and sweep write with --out")
    return newest_rows(_normalise(frame)) if "kind" in frame.columns else _legacy(frame)


def read_many(paths: Iterable[str | Path]) -> pd.DataFrame:
    """`read_results` of each path, concatenated (columns missing from one source are null)."""
    return pd.concat([read_results(p) for p in paths], ignore_index=True)


def of_kind(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The rows of one run kind, without the configuration columns that are null throughout them
    (those of other kinds); the schema's own columns (`FRONT`) always stay."""
    part = rows[rows["kind"] == kind]
    empty = [c for c in part.columns if c not in FRONT and part[c].isna().all()]
    return part.drop(columns=empty).reset_index(drop=True)


def canonical_order(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with whole runs in an order of their configurations alone, each run's rows as written: runs
    sorted by their config columns (schema order, values as text; provenance and the run id last), so
    a report reads the same whatever order the runs finished in (Ray workers, resumed sweeps)."""
    if rows.empty:
        return rows
    keys = [c for c in config_columns(rows) if c not in PROVENANCE and c != "run_id"] + ["run_id"]
    firsts = rows.drop_duplicates("run_id")[keys].astype(str)
    order = {rid: i for i, rid in enumerate(firsts.sort_values(keys, kind="stable")["run_id"])}
    rank = rows["run_id"].map(order)
    return rows.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank").reset_index(drop=True)


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
