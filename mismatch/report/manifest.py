"""Which results a report folder was written from (`report.json`), so that one study's report is never
overwritten by another's, nor left mixed with it.

`report.json` records the sources (the results paths as given), the run ids and the files written. A
new report may go into a folder that holds none, or the report of the same sources (a study rerun
or grown), or of runs it contains (the same study with more rows): it then replaces that report,
removing the files the new one no longer writes. Anything else — another dataset's report, or files
of unknown origin — is a one-line error unless `force`, which replaces the recorded report.
"""

from __future__ import annotations

import json
from pathlib import Path

from mismatch.errors import InputError
from mismatch.files import atomic_write_text, read_json

MANIFEST = "report.json"


def normalised(sources: list[str | Path]) -> list[str]:
    """Results paths as recorded: POSIX spelling, no trailing slash, in the order given."""
    return [Path(s).as_posix().rstrip("/") for s in sources]


def claim(out_dir: Path, sources: list[str], run_ids: set[str], *, force: bool = False) -> dict:
    """Check that the report of `sources` (holding `run_ids`) may be written into `out_dir`, before
    anything is computed; returns the folder's current manifest (`{}` when none).

    `out_dir` is a folder or absent (`mismatch.files.check_writable`, which `report` runs first).

    Raises:
        InputError: it holds another dataset's report, or files no report recorded, and not `force`.
    """
    if not out_dir.is_dir():
        return {}
    path = out_dir / MANIFEST
    if not path.is_file():
        strays = sorted(p.name for p in out_dir.iterdir() if p.is_file() and not p.name.startswith("."))
        if strays and not force:
            raise InputError(f"{out_dir} holds files no `mismatch report` recorded ({strays[0]}, …; no {MANIFEST}): "
                             "use another --out, or --force to write into it")
        return {}
    old = read_json(path, "report manifest")
    old = old if isinstance(old, dict) else {}
    same = old.get("sources") == sources or (old.get("run_ids") and set(old["run_ids"]) <= run_ids)
    if not same and not force:
        were = ", ".join(old.get("sources") or ["unknown results"])
        raise InputError(f"{out_dir} holds the report of {were}, not of {', '.join(sources)}: use another "
                         "--out (e.g. reports/<name>), or --force to replace that report")
    return old


def record(out_dir: Path, sources: list[str], run_ids: set[str], written: list[Path], old: dict) -> Path:
    """After writing: remove the files of the folder's earlier report that this one did not write, and
    record this report's sources, run ids and files in `report.json` (written atomically)."""
    names = sorted({p.name for p in written})
    for stale in set(old.get("files", [])) - set(names) - {MANIFEST}:
        if "/" not in stale and (out_dir / stale).is_file():
            (out_dir / stale).unlink()
    return atomic_write_text(out_dir / MANIFEST, json.dumps({"sources": sources, "run_ids": sorted(run_ids),
                                                              "files": names}, indent=1) + "\n")
