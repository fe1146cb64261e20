"""The shipped studies' run and task ids change only with `ID_SCHEMA` (or the toolkit's version).

Run ids hash every configuration field by name: a field added to `OPDConfig` or `ProbeConfig`, or a
renamed one, changes every id, so `--resume` would rerun a whole study and old results would no
longer be found by id. This test keeps the ids of `sweeps/*.toml` in `study_ids.json`; when they
change on purpose, bump `mismatch.version.ID_SCHEMA` and rewrite the file:

    .venv/bin/python -m tests.sweep.test_ids --write
"""

import json
import sys
from pathlib import Path

from mismatch.opd.runs import run_columns
from mismatch.results import run_id
from mismatch.sweep import load_study, task_id
from mismatch.version import ID_SCHEMA, __version__

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("study_ids.json")
STUDIES = sorted((ROOT / "sweeps").glob("*.toml"))


def study_ids() -> dict[str, dict[str, list[str]]]:
    """Per study file: its task ids in plan order, and the run ids its OPD runs' rows carry."""
    out = {}
    for path in STUDIES:
        study = load_study(path)
        out[path.name] = {"tasks": [task_id(t) for t in (*study.plan.probes, *study.plan.opd)],
                          "opd_runs": [run_id("opd", run_columns(c)) for c in study.plan.opd]}
    return out


def test_the_shipped_studies_ids_change_only_with_the_id_schema():
    """A study file may gain tasks (their ids are new; the kept ones stay). A kept id that is gone means a
    hashed configuration changed (or a block was removed on purpose): bump `ID_SCHEMA` and rewrite, or rewrite."""
    assert len(STUDIES) >= 3  # the premise: the studies are there
    kept = json.loads(FIXTURE.read_text())
    ids = study_ids()
    assert all(len(v["tasks"]) for v in ids.values())
    if kept["id_schema"] == ID_SCHEMA and kept["mismatch_version"] == __version__:
        gone = {f"{name} {key}": sorted(set(old) - set(ids.get(name, {}).get(key, [])))
                for name, lists in kept["ids"].items() for key, old in lists.items()}
        gone = {where: lost for where, lost in gone.items() if lost}
        assert not gone, ("kept ids are gone: if a hashed configuration changed, bump mismatch.version.ID_SCHEMA; "
                          f"then run `python -m tests.sweep.test_ids --write` ({gone})")
    else:  # the schema or version moved: every id must have moved with it
        old = {i for v in kept["ids"].values() for ids_ in v.values() for i in ids_}
        assert not old & {i for v in ids.values() for ids_ in v.values() for i in ids_}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    FIXTURE.write_text(json.dumps({"id_schema": ID_SCHEMA, "mismatch_version": __version__, "ids": study_ids()},
                                  indent=1) + "\n")
    print(f"wrote {FIXTURE}")


def test_ids_do_not_depend_on_where_the_checkout_lies(tmp_path):
    """The same study file and prompts copied elsewhere give the same task ids and probe run ids (the prompt
    file enters by name and content, not by its absolute path)."""
    import shutil

    from mismatch.probes.runs import _run_columns
    from mismatch.results import run_id as rid

    copy = tmp_path / "elsewhere" / "sweeps"
    shutil.copytree(ROOT / "sweeps", copy)
    (copy.parent / "mismatch" / "data").mkdir(parents=True)  # quick.toml's prompts: ../mismatch/data/prompts.txt
    shutil.copy(ROOT / "mismatch" / "data" / "prompts.txt", copy.parent / "mismatch" / "data")
    here, there = load_study(ROOT / "sweeps" / "quick.toml"), load_study(copy / "quick.toml")
    assert [task_id(t) for t in here.plan.probes] == [task_id(t) for t in there.plan.probes]
    for a, b in zip(here.plan.probes, there.plan.probes):
        assert a.prompts != b.prompts  # the premise: the paths differ
        texts = ["x"]
        assert rid("probe", _run_columns(a, texts)) == rid("probe", _run_columns(b, texts))
