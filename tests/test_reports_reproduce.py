"""`reports/` is what `mismatch report` writes from the committed results (`experiments/study_data/*.parquet`,
`make reports`): rebuilt here from those rows, every table (Markdown, CSV) is the committed one."""

import json
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


@pytest.mark.slow
@pytest.mark.skipif(not COMMITTED, reason="no committed results")
def test_the_shipped_admission_limits_are_fitted_on_the_committed_results(monkeypatch):
    """`mismatch check`'s default limits (`make thresholds`) are the fit on the rows reports/ comes from."""
    from mismatch.admission import fit_thresholds, load_thresholds

    monkeypatch.chdir(ROOT)
    fitted, shipped = fit_thresholds([p.relative_to(ROOT) for p in COMMITTED]), load_thresholds()
    assert shipped.provenance["results"] == [str(p.relative_to(ROOT)) for p in COMMITTED]
    for name in ("limits", "brackets", "window_limits", "window_brackets", "drift", "length_law", "response_tokens",
                 "window_response_tokens", "loss_limits", "loss_window_limits",
                 "loss_length_laws", "loss_open_ladders"):  # floats survive JSON
        got, want = (json.dumps(getattr(t, name), sort_keys=True) for t in (shipped, fitted))
        assert got == want, f"the shipped {name} are not the committed results' fit: run `make thresholds`"


@pytest.mark.skipif(not COMMITTED, reason="no committed results")
def test_the_held_out_cases_verdicts_are_the_committed_results(monkeypatch):
    """`experiments/validation/validation.json` (docs/admission.md quotes it) is what its compare.py gives from the
    committed rows under the design of the day: rerun `compare.py` when the design or the rows change."""
    import importlib.util

    path = ROOT / "experiments" / "validation" / "compare.py"
    spec = importlib.util.spec_from_file_location("validation_compare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = json.loads((path.parent / "validation.json").read_text(encoding="utf-8"))
    assert json.loads(json.dumps(module.compare())) == committed, (
        "experiments/validation/validation.json is stale: run experiments/validation/compare.py")
