"""Study files: the grid expanded exactly (baselines included, each run once) and every bad input a
one-line error naming the file and the key, before anything runs."""

import dataclasses
import itertools

import pytest

from mismatch.errors import InputError
from mismatch.opd.config import comparison_key
from mismatch.sweep import load_study, plan_study

STUDY = """
name = "tiny"

[static]
models = ["tiny-llama", "tiny-gpt2"]
prompts = "p.txt"
max_prompts = 2
perturb = ["fp8-e4m3:channel", "int4"]
layers = ["linear", "mlp"]
each_layer = true
seeds = [0, 1]

[dynamic]
pairs = ["sort-gpt2", "reverse-qwen3"]
rollouts = ["none", "fp8-e4m3", "stale:2"]
losses = ["full-rkl", "pg-rkl"]
lrs = [1e-3]
tis_caps = [0, 2]
seeds = [0, 1, 2]

[dynamic.settings]
steps = 40
batch_size = 64
"""


@pytest.fixture
def study(tmp_path, monkeypatch):
    import mismatch.model.loader

    def no_loading(*args, **kwargs):
        raise AssertionError("planning must not load a model")

    monkeypatch.setattr(mismatch.model.loader, "load", no_loading)
    (tmp_path / "p.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "tiny.toml").write_text(STUDY)
    return load_study(tmp_path / "tiny.toml")


def test_the_grid_is_every_combination_with_its_clean_baseline(study):
    opd = study.plan.opd
    grid = set(itertools.product(["sort-gpt2", "reverse-qwen3"], ["full-rkl", "pg-rkl"], [None, 2.0], [0, 1, 2],
                                 ["none", "fp8-e4m3", "stale:2"]))
    assert {(c.pair, c.loss, c.tis_cap, c.seed, c.rollout) for c in opd} == grid
    assert len(opd) == len(grid) == 72  # "none" is each group's baseline: no run twice
    assert all((c.steps, c.batch_size, c.lr) == (40, 64, 1e-3) for c in opd)
    for i, config in enumerate(opd):  # every run's clean twin is planned before it
        twins = [j for j, other in enumerate(opd) if other.is_clean
                 and comparison_key(dataclasses.asdict(other)) == comparison_key(dataclasses.asdict(config))]
        assert len(twins) == 1 and twins[0] <= i


def test_static_groups_share_a_reference_per_model_seed_and_scope(study, tmp_path):
    probes = study.plan.probes
    assert study.name == "tiny" and len(probes) == 2 * 2 * 3  # models × seeds × (2 scopes + isolation map)
    assert {(p.reference, p.seed, p.layers, p.each_layer) for p in probes} == set(itertools.product(
        ["tiny-llama", "tiny-gpt2"], [0, 1], ["linear", "mlp"], [False])) | set(itertools.product(
        ["tiny-llama", "tiny-gpt2"], [0, 1], ["linear"], [True]))
    assert all(p.perturb == ("fp8-e4m3:channel", "int4:group128") for p in probes)  # canonical specs
    assert all(p.prompts == str(tmp_path / "p.txt") and p.max_prompts == 2 for p in probes)


@pytest.mark.parametrize("edit,message", [
    (("[dynamic]", "[dynamic]\nlearning_rates = [1]"), "[dynamic] unknown key 'learning_rates'"),
    (("[static]", "[static]\nmodel = 'x'"), "[static] unknown key 'model'"),
    (("steps = 40", "steps = 40\nsteeps = 3"), "[dynamic].settings unknown key 'steeps'"),
    (("steps = 40", "steps = 40\nseed = 3"), "[dynamic].settings unknown key 'seed'"),
    (('"int4"]', '"int9"]'), "[static]: unknown perturbation kind 'int9'"),
    (('"stale:2"]', '"stale:x"]'), "[dynamic]: stale needs an integer"),
    (('"reverse-qwen3"]', '"reverse-gpt9"]'), "unknown pair 'reverse-gpt9' in pairs"),
    (('"pg-rkl"]', '"kl"]'), "[dynamic]: unknown loss 'kl'"),
    (("steps = 40", "steps = 0"), "[dynamic]: steps must be ≥ 1"),
    (("steps = 40", 'steps = "40"'), "[dynamic]: steps must be a number, got '40'"),
    (("seeds = [0, 1, 2]", "seeds = []"), "seeds must be a non-empty list"),
    (('name = "tiny"', 'name = "tiny"\nsweep = 1'), "unknown key 'sweep'"),
    (("prompts = \"p.txt\"", ""), "[static]: give exactly one prompt source"),
    (("lrs = [1e-3]", 'lrs = ["abc"]'), "[dynamic]: lrs holds 'abc', not a number"),
    (("seeds = [0, 1, 2]", 'seeds = [0, "a"]'), "[dynamic]: seeds holds 'a', not an integer"),
    (("seeds = [0, 1]", "seeds = [0.5]"), "[static]: seeds holds 0.5, not an integer"),
    (('"reverse-qwen3"]', '"nope.toml"]'), "[dynamic]: pairs: pair file not found: nope.toml"),
    (("max_prompts = 2", 'max_prompts = 2\ntexts = "hi"'), "[static]: texts must be a list of strings"),
    (("[dynamic.settings]\nsteps = 40\nbatch_size = 64", "settings = 3"), "[dynamic].settings must be a table"),
    (('prompts = "p.txt"', 'prompts = "nofile.txt"'), "[static]: prompts file not found: nofile.txt"),
    # one rollout under two names would train twice and be reported as two levels
    (('"stale:2"]', '"stale:2", "fp8-e4m3:channel"]'), "[dynamic]: rollouts 'fp8-e4m3' and 'fp8-e4m3:channel' are "
                                                         "the same rollout: list it once"),
    (('"int4"]', '"int4", "int4:group128"]'), "[static]: rollouts 'int4' and 'int4:group128' are the same"),
    (("seeds = [0, 1, 2]", "seeds = [0, 1, 2]\nmax_seeds = 2"), "[dynamic]: max_seeds 2 is fewer than the 3 seeds"),
])
def test_bad_studies_are_one_line_errors_naming_file_and_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(STUDY.replace(*edit))
    (tmp_path / "p.txt").write_text("one\n")
    with pytest.raises(InputError) as info:
        load_study(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text and message in text, text


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(InputError, match="study file not found"):
        load_study(tmp_path / "none.toml")
    (tmp_path / "x.toml").write_text("[static\n")
    with pytest.raises(InputError, match="is not valid TOML"):
        load_study(tmp_path / "x.toml")
    with pytest.raises(InputError, match="needs a \\[static\\] or a \\[dynamic\\] table"):
        plan_study({"name": "empty"})
    with pytest.raises(InputError, match="plans no run"):
        plan_study({"name": "empty", "static": [], "dynamic": []})
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe name")
    with pytest.raises(InputError, match="is not UTF-8 text"):
        load_study(tmp_path / "bin.toml")


def test_a_rollout_that_trains_exactly_as_clean_is_planned_as_the_clean_run():
    plan = plan_study({"dynamic": {"pairs": ["sort-gpt2"], "rollouts": ["none", "reuse:1", "stale:0", "fp8-e4m3"]}})
    assert [c.rollout for c in plan.opd] == ["none", "fp8-e4m3"]


def test_runs_that_differ_only_in_the_rollout_scope_or_length_have_different_labels():
    """A recipe level (int4 on some blocks) and the same format on every linear are two tasks: the
    sweep's progress and dry-run tables name the scope, so the two are not listed as one run twice."""
    from mismatch.sweep import task_label

    plan = plan_study({"dynamic": [{"pairs": ["sort-gpt2"], "rollouts": ["int4:group32"]},
                                   {"pairs": ["sort-gpt2"], "rollouts": ["int4:group32"],
                                    "settings": {"layers": "1"}}]})
    levels = [c for c in plan.opd if c.rollout != "none"]
    assert [c.layers for c in levels] == ["linear", "1"]
    labels = [task_label(c) for c in levels]
    assert len(set(labels)) == 2 and "[1]" in labels[1] and "[" not in labels[0]
    rungs = plan_study({"dynamic": [{"pairs": ["sort-gpt2"], "rollouts": ["none"], "settings": {"max_new_tokens": n}}
                                    for n in (8, 32)]})  # a length ladder's rungs: one task each
    assert [task_label(c) for c in rungs.opd] == [f"opd sort-gpt2 none full-rkl lr 0.001 tis None {n} tokens seed 0"
                                                   for n in (8, 32)]


def test_cli_dry_run_lists_the_plan_and_bad_files_are_one_line(study, tmp_path):
    from typer.testing import CliRunner

    from mismatch.cli.app import app
    from mismatch.sweep import task_label

    res = CliRunner().invoke(app, ["sweep", str(study.path), "--out", str(tmp_path / "o"), "--dry-run"],
                             terminal_width=200)
    assert res.exit_code == 0, res.output
    for task in [*study.plan.probes, *study.plan.opd]:
        assert task_label(task) in res.output
    assert not (tmp_path / "o").exists()  # nothing ran
    (tmp_path / "bad.toml").write_text(STUDY.replace('"pg-rkl"]', '"kl"]'))
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "unknown loss 'kl'" in res.output
    res = CliRunner().invoke(app, ["sweep", str(study.path), "--out", str(tmp_path / "r.parquet")])
    assert res.exit_code == 2 and "not a file" in res.output and not (tmp_path / "r.parquet").exists()


def test_several_dynamic_blocks_are_one_plan_with_shared_baselines_once():
    cfg = {"dynamic": [
        {"name": "formats", "pairs": ["sort-gpt2"], "rollouts": ["fp8-e4m3", "int4:group128"], "seeds": [0, 1]},
        {"name": "momentum", "pairs": ["sort-gpt2"], "rollouts": ["stale:1"], "seeds": [0],
         "settings": {"adam_beta1": 0.0}},
        {"name": "lag", "pairs": ["sort-gpt2"], "rollouts": ["stale:1", "reuse:2"], "seeds": [0]},
    ]}
    plan = plan_study(cfg)
    labels = [(r.rollout, r.seed, r.adam_beta1) for r in plan.opd]
    assert labels == [("none", 0, 0.9), ("fp8-e4m3", 0, 0.9), ("int4:group128", 0, 0.9), ("none", 1, 0.9),
                      ("fp8-e4m3", 1, 0.9), ("int4:group128", 1, 0.9), ("none", 0, 0.0), ("stale:1", 0, 0.0),
                      ("stale:1", 0, 0.9), ("reuse:2", 0, 0.9)]  # the β1 = 0.9 seed-0 clean run only once
    bad = {"dynamic": [cfg["dynamic"][0], {"name": "oops", "pairs": ["sort-gpt2"], "rollout": ["x"]}]}
    with pytest.raises(InputError, match=r"\[\[dynamic\]\] 'oops'.*unknown key 'rollout'"):
        plan_study(bad)


def test_threads_is_a_study_setting_defaulting_to_one(tmp_path):
    """fp32 sums depend on torch's thread count, so the count is part of the study, not of the machine."""
    path = tmp_path / "s.toml"
    body = '[dynamic]\npairs = ["sort-gpt2"]\nrollouts = ["fp8-e4m3"]\n'
    path.write_text(body)
    assert load_study(path).threads == 1
    path.write_text("threads = 2\n" + body)
    assert load_study(path).threads == 2
    for bad in ("0", '"2"', "true", "1.5"):
        path.write_text(f"threads = {bad}\n" + body)
        with pytest.raises(InputError, match="threads must be a whole number"):
            load_study(path)


def test_a_clean_form_beside_none_is_one_run_not_an_alias_error(tmp_path):
    """`stale:0` and `reuse:1` train exactly as clean (stored as `none`): listed beside `none` they plan the one
    clean run, as before, rather than an error."""
    path = tmp_path / "ok.toml"
    path.write_text(STUDY.replace('"stale:2"]', '"stale:2", "stale:0", "reuse:1"]'))
    (tmp_path / "p.txt").write_text("one\n")
    plain = tmp_path / "plain.toml"
    plain.write_text(STUDY)
    assert load_study(path).plan.opd == load_study(plain).plan.opd


def test_a_seed_cap_below_the_planned_seeds_is_refused_before_anything_runs(tmp_path):
    from mismatch.sweep import run_study, with_rounds

    path = tmp_path / "s.toml"
    path.write_text(STUDY)
    (tmp_path / "p.txt").write_text("one\n")
    study = load_study(path)  # 3 seeds a level
    for call in (lambda: run_study(study, tmp_path / "out", decide=True, max_seeds=2),
                 lambda: with_rounds(study, tmp_path / "out", max_seeds=2)):
        with pytest.raises(InputError, match=r"max_seeds 2 is fewer than the 3 seeds the study lists for "
                                             r"sort-gpt2 fp8-e4m3: raise it or list fewer seeds"):
            call()
    assert not (tmp_path / "out").exists()
