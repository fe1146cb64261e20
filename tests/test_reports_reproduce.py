"""`reports/` is what `mismatch report` writes from the committed results (`experiments/study_data/*.parquet`,
`make reports`): rebuilt here from those rows, every table (Markdown, CSV) is the committed one."""

import shutil
from pathlib import Path

import pytest

from mismatch.report import report

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "experiments" / "study_data").glob("*.parquet"))


@pytest.mark.slow
@pytest.mark.skipif(not COMMITTED, reason="no committed results")
def test_the_committed_reports_are_rebuilt_from_the_committed_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sources as `make reports` names them: results/paper
    data = Path("results") / "paper"
    data.mkdir(parents=True)
    for path in COMMITTED:
        shutil.copy(path, data / path.name)
    written = report([data], Path("reports"))
    tables = [p for p in written if p.suffix in (".md", ".csv")]
    assert len(tables) >= 8
    for path in tables:
        committed = ROOT / "reports" / path.name
        assert committed.is_file(), f"reports/ lacks {path.name}, which the committed results give"
        assert path.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
            f"reports/{path.name} is not what the committed results give: run `make reports`")
