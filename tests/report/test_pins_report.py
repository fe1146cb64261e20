"""Pins on the published tolerance files (`write_tolerance_report`): `tolerance_levels.csv`'s copy KL is the
mean over evaluations after step 0, and `noise_floor.csv` counts only clean runs that reached their last
step — read back from the written files and recomputed here from the raw rows."""

import dataclasses
import statistics

import pandas as pd
import pytest

from mismatch.report.tolerance import write_tolerance_report
from tests.opd.test_pins_opd import BASE, COPY_KL, U64, _finished, _rows


def test_the_published_copy_kl_and_noise_floor_are_those_of_the_rows(tmp_path):
    """Two seeds of `noise:0.1` whose copy was probed at steps 0, 2, 4 beside finished clean twins, and a
    third clean seed killed at step 2 of 4."""
    frames = []
    for seed, by_step in COPY_KL.items():
        frames.append(_rows(dataclasses.replace(BASE, seed=seed), _finished(0.40 + 0.02 * seed, 1.0 + 0.1 * seed)))
        frames.append(_rows(dataclasses.replace(BASE, seed=seed, rollout="noise:0.1"),
                            _finished(0.40, 1.0 + 0.1 * seed, by_step)))
    stopped = {m: {s: v for s, v in by_step.items() if s <= 2} for m, by_step in _finished(0.10, 3.0).items()}
    frames.append(_rows(dataclasses.replace(BASE, seed=2), stopped))
    written = write_tolerance_report(pd.concat(frames, ignore_index=True), tmp_path)
    assert {p.name for p in written} >= {"tolerance_levels.csv", "noise_floor.csv"}
    (level,) = pd.read_csv(tmp_path / "tolerance_levels.csv").to_dict("records")
    after_0 = [statistics.fmean(v for s, v in by_step.items() if s > 0) for by_step in COPY_KL.values()]
    assert level["copy_kl_fwd_mean"] == pytest.approx(statistics.fmean(after_0), rel=16 * U64)  # CSV: repr digits
    (floor,) = pd.read_csv(tmp_path / "noise_floor.csv").to_dict("records")
    acc, kl = [40.0, 42.0], [1.0, 1.1]  # the finished clean seeds 0 and 1; seed 2 stopped at step 2
    assert floor["clean_seeds"] == 2
    assert floor["clean_accuracy"] == pytest.approx(statistics.fmean(acc), rel=16 * U64)
    assert floor["clean_heldout_rkl"] == pytest.approx(statistics.fmean(kl), rel=16 * U64)
    mean, sd = statistics.fmean(acc), statistics.stdev(acc)  # float64 variance: (n + 3)·u·mean²/var, + the CSV's
    assert floor["clean_accuracy_sd"] == pytest.approx(sd, rel=(len(acc) + 3) * U64 * mean ** 2 / sd ** 2 + 16 * U64)
