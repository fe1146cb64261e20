"""The results table: probe results as tidy long rows, written to parquet or CSV.

One row per (run, level, item, metric): `level` is `token` (item = seq, pos, token), `layer`
(item = layer, index) or `summary`; `metric` names a DESIGN.md column or summary key and `value`
holds it as float (booleans as 0/1). Beside them stand the run's configuration and provenance:
run_id, reference, candidate, their dtypes, perturbation spec and layer scope, clip, seed,
package versions, git sha and a UTC timestamp (lm-eval's result schema does the same).

Writing never loses what a file already holds: new runs are appended (or, with `overwrite`, the
file is replaced) through a temporary file renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import uuid
from pathlib import Path

import pandas as pd

from mismatch.errors import InputError
from mismatch.probes import LAYER_COLUMNS, TOKEN_COLUMNS, ProbeResult

ITEM_COLUMNS = ("seq", "pos", "token", "layer", "index")
_SUFFIXES = (".parquet", ".csv")


def provenance() -> dict[str, str]:
    """Versions, git sha and timestamp to stamp on every result row."""
    import torch
    import transformers

    from mismatch import __version__

    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return {"mismatch_version": __version__, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "git_sha": sha,
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def to_rows(result: ProbeResult, config: dict[str, object]) -> pd.DataFrame:
    """Flatten one probe result into tidy long rows carrying `config` and provenance columns."""
    value_tokens = [c for c in TOKEN_COLUMNS if c not in ("seq", "pos", "token")]
    tok = result.per_token.melt(id_vars=["seq", "pos", "token"], value_vars=value_tokens,
                                var_name="metric", value_name="value")
    tok["level"] = "token"
    lay = result.per_layer.melt(id_vars=["layer", "index"],
                                value_vars=[c for c in LAYER_COLUMNS if c not in ("layer", "index")],
                                var_name="metric", value_name="value")
    lay["level"] = "layer"
    summ = pd.DataFrame({"metric": list(result.summary), "value": list(result.summary.values()),
                         "level": "summary"})
    rows = pd.concat([summ, lay, tok], ignore_index=True)
    rows["value"] = rows["value"].astype("float64")
    for col in ("seq", "pos", "token", "index"):
        rows[col] = rows[col].astype("Int64")
    rows["layer"] = rows["layer"].astype("string")
    meta = {"run_id": uuid.uuid4().hex[:12], "reference": result.reference,
            "candidate": result.candidate, **config, **provenance()}
    for key, value in meta.items():
        rows[key] = value
    front = ["run_id", "level", "metric", "value", *ITEM_COLUMNS]
    return rows[front + [c for c in rows.columns if c not in front]]


def _check_suffix(path: Path) -> None:
    if path.suffix not in _SUFFIXES:
        raise InputError(f"result file must end in .parquet or .csv, got {path.name}")


def read_results(path: str | Path) -> pd.DataFrame:
    """Read a results file written by `write_results`."""
    path = Path(path)
    _check_suffix(path)
    if not path.is_file():
        raise InputError(f"results file not found: {path}")
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def write_results(rows: pd.DataFrame, path: str | Path, *, overwrite: bool = False) -> Path:
    """Append `rows` to the results file at `path` (or replace it with `overwrite`), atomically.

    Returns:
        The path written.
    """
    path = Path(path)
    _check_suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        rows = pd.concat([read_results(path), rows], ignore_index=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.suffix == ".parquet":
            rows.to_parquet(tmp, index=False)
        else:
            rows.to_csv(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def summaries(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run with its summary metrics as columns, plus the run's config columns."""
    summ = rows[rows["level"] == "summary"]
    config_cols = [c for c in rows.columns if c not in ("level", "metric", "value", *ITEM_COLUMNS)]
    wide = summ.pivot_table(index="run_id", columns="metric", values="value", aggfunc="first")
    configs = summ[config_cols].drop_duplicates("run_id").set_index("run_id")
    return configs.join(wide).reset_index()


def per_layer(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-layer metrics, one row per (run, layer), metrics as columns."""
    lay = rows[rows["level"] == "layer"]
    return (lay.pivot_table(index=["run_id", "index", "layer"], columns="metric", values="value",
                            aggfunc="first").reset_index().sort_values(["run_id", "index"]))
