"""Reports from results datasets: one module per kind of figure set, reading results only.

`write_reports(rows, out_dir)` splits a tidy results frame (`mismatch.results`) by run kind and
hands each kind's rows to its writer:
  * `probe` runs → `report.probe.write_probe_report` (summary.md, per_layer.png, kl_cdf.png,
    layer_map.png);
  * `opd` runs → `report.opd.write_opd_report` (opd_curves.png, opd_verdicts.md) and
    `report.tolerance.write_tolerance_report` (tolerance tables across seeds and their figures, with the
    probe runs on pair students beside them) and `report.length.write_length_report` (the tolerated
    mismatch against response length, when the rows hold a length ladder) and `report.admission.write_admission_report` (the
    admission thresholds such a study fits and their leave-one-pair-out validation) and
    `report.frontier.write_frontier_report` (each configuration's analytic cost beside its verdict) and
    `report.engines.write_engines_report` (llama.cpp beside its simulated twins, when present).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mismatch.files import check_writable
from mismatch.report.admission import write_admission_report
from mismatch.report.engines import write_engines_report
from mismatch.report.frontier import write_frontier_report
from mismatch.report.length import write_length_report
from mismatch.report.manifest import claim, normalised, record
from mismatch.report.opd import write_opd_report
from mismatch.report.probe import write_probe_report
from mismatch.report.tolerance import write_tolerance_report
from mismatch.results import canonical_order, of_kind, read_many
from mismatch.analysis.tolerance import analyse
from mismatch.verdict import DEFAULT_TOLERANCE, Tolerance


def write_reports(rows: pd.DataFrame, out_dir: str | Path, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
                  sources: list[str] | None = None) -> list[Path]:
    """Write every report the rows support into `out_dir`; return the files written, in order.
    `sources` names where the rows came from (in the admission thresholds' provenance)."""
    written: list[Path] = []
    rows = canonical_order(rows)  # the same tables whatever order the runs finished in
    present = set(rows["kind"].unique())
    if "probe" in present:
        written += write_probe_report(of_kind(rows, "probe"), out_dir)
    if "opd" in present:
        analysis = analyse(rows, tolerance)  # once, for every writer below
        written += write_opd_report(of_kind(rows, "opd"), out_dir, analysis=analysis)
        written += write_tolerance_report(rows, out_dir, analysis=analysis)
        written += write_length_report(analysis.levels, out_dir)
        written += write_admission_report(rows, out_dir, sources=sources or ["results"], analysis=analysis)
        written += write_frontier_report(rows, out_dir, analysis=analysis)
        written += write_engines_report(rows, out_dir, levels=analysis.levels)
    return written


def report(paths: list[str | Path], out_dir: str | Path, *, tolerance: Tolerance = DEFAULT_TOLERANCE,
           force: bool = False) -> list[Path]:
    """`mismatch report`: read results (directories or files, old ones too) and write the reports into
    `out_dir`, which records what they were written from (`report.manifest`): a folder holding
    another dataset's report is refused unless `force`. Returns the files written, `report.json` last."""
    out_dir, sources = Path(out_dir), normalised(paths)
    check_writable(out_dir, "--out", folder=True)  # before any reading
    rows = read_many(paths)
    run_ids = set(rows["run_id"].dropna().astype(str))
    old = claim(out_dir, sources, run_ids, force=force)
    written = write_reports(rows, out_dir, tolerance=tolerance, sources=sources)
    return [*written, record(out_dir, sources, run_ids, written, old)]


__all__ = ["report", "write_admission_report", "write_engines_report", "write_frontier_report", "write_length_report", "write_opd_report", "write_probe_report", "write_reports", "write_tolerance_report"]
