"""A report folder records what it was written from: another dataset's report is never overwritten,
nor left mixed with it."""

import json

import pytest
from typer.testing import CliRunner

from mismatch.cli.app import app
from mismatch.probes.runs import ProbeConfig, run_probes
from mismatch.report.manifest import MANIFEST

runner = CliRunner()


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    """Two probe datasets of different runs: (a, b)."""
    root = tmp_path_factory.mktemp("ds")
    run_probes(ProbeConfig(reference="tiny-llama", perturb=("int4:group32",), texts=("hello there",)), out=root / "a")
    run_probes(ProbeConfig(reference="tiny-qwen3", perturb=("noise:0.1",), texts=("abc def",)), out=root / "b")
    return root / "a", root / "b"


def _report(src, out, *extra):
    return runner.invoke(app, ["report", str(src), "--out", str(out), *extra])


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_another_datasets_report_is_refused_and_force_replaces_it(two_datasets, tmp_path):
    a, b = two_datasets
    out = tmp_path / "rep"
    assert _report(a, out).exit_code == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["sources"] == [a.as_posix()] and "summary.md" in manifest["files"] and manifest["run_ids"]
    before = _snapshot(out)
    res = _report(b, out)
    assert res.exit_code == 2 and res.output.count("\n") == 1 and res.output.startswith("error:")
    assert f"holds the report of {a.as_posix()}" in res.output and "--force" in res.output
    assert _snapshot(out) == before  # nothing touched
    (out / "stale.png").write_bytes(b"x")  # a file the recorded report wrote, which the next one will not
    manifest["files"].append("stale.png")
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert _report(b, out, "--force").exit_code == 0
    assert json.loads((out / MANIFEST).read_text())["sources"] == [b.as_posix()]
    assert not (out / "stale.png").exists()  # no mixed folder
    assert _report(b, out).exit_code == 0  # the same results again: allowed


def test_a_folder_of_unknown_files_or_a_file_is_a_one_line_error(two_datasets, tmp_path):
    a, _ = two_datasets
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("my notes")
    res = _report(a, tmp_path / "mine")
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "no `mismatch report` recorded" in res.output
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.md"]
    (tmp_path / "plain").write_text("x")
    res = _report(a, tmp_path / "plain")
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "is a file, not a folder" in res.output
