"""The admission validation report, written from a hand-made study's results alone."""

import re

import pandas as pd

from mismatch.report import write_reports
from tests.admission.test_thresholds import study  # noqa: F401  (the fixture)


def test_the_report_writes_the_limits_the_levels_and_the_held_out_predictions(study, tmp_path):  # noqa: F811
    written = write_reports(study, tmp_path, sources=["hand-made"])
    assert tmp_path / "admission.md" in written
    text = (tmp_path / "admission.md").read_text()
    # the bracket's lower end is 0.15 × 1.05 = 0.1575 (a mean over seeds: either side of it in the last bit)
    assert "Fitted on hand-made" in text
    assert re.search(r"\| mismatch_kl \(default gate\) \| 0\.364 \| \[0\.15[78], 0\.84\] \| ×5\.3 \|", text)
    validation = pd.read_csv(tmp_path / "admission_validation.csv")
    primary = validation[validation["statistic"] == "mismatch_kl"]
    right = int((primary["admit_tolerated"] + primary["reject_not"]).sum())
    assert f"With mismatch_kl: {right} of {int(primary['levels'].sum())} held-out levels predicted right" in text
    points = pd.read_csv(tmp_path / "admission_points.csv")
    # nine levels: five tolerated, three lose ≥ 2 points, one undecided (listed, not fitted)
    assert len(points) == 9 and points["decided"].sum() == 8 and points["tolerated"].sum() == 5
    assert int(primary["levels"].sum()) == 8 and "| not fitted (undecided) |" in text
