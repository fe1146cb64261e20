"""The `mismatch` CLI: probe output, result files, one-line errors that keep results."""

import sys

import pytest
from typer.testing import CliRunner

from mismatch.cli.app import app
from mismatch.results import read_results, summaries

runner = CliRunner()


def test_models_lists_builtins():
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 0
    for name in ("smollm2-135m", "tiny-llama", "tiny-qwen3", "tiny-gpt2"):
        assert name in res.output


def test_probe_writes_rows_with_specs_and_matches_api(tmp_path):
    import mismatch
    from mismatch.model.generate import teacher_forced

    out = tmp_path / "r.parquet"
    res = runner.invoke(app, ["probe", "tiny-llama", "tiny-llama", "--cand-dtype", "bf16",
                              "--text", "hello world", "--text", "abc def", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "kl_fwd_mean" in res.output
    summ = summaries(read_results(out)).iloc[0]
    assert (summ["reference"], summ["candidate"], summ["cand_dtype"]) == ("tiny-llama", "tiny-llama", "bf16")
    lm, lm16 = mismatch.load("tiny-llama"), mismatch.load("tiny-llama", dtype="bf16")
    b = teacher_forced(lm, ["hello world", "abc def"])
    api = mismatch.probe(lm, lm16, b.input_ids, b.attention_mask, b.response_mask)
    assert summ["kl_fwd_mean"] == pytest.approx(api.summary["kl_fwd_mean"], rel=1e-12)
    assert summ["kl_fwd_mean"] > 0


def test_generated_responses_are_scored(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("first prompt\nsecond one\n")
    out = tmp_path / "r.csv"
    res = runner.invoke(app, ["probe", "tiny-gpt2", "tiny-gpt2", "--seed", "0", "--prompts", str(prompts),
                              "--max-new-tokens", "6", "--min-new-tokens", "6", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summ = summaries(read_results(out)).iloc[0]
    assert summ["tokens"] == 12 and summ["kl_fwd_max"] == 0  # same spec: exactly zero


@pytest.mark.parametrize("args,message", [
    (["probe", "tiny-llama", "nope", "--text", "a b"], "unknown model 'nope'"),
    (["probe", "tiny-llama", "tiny-llama", "--text", ""], "prompt 0 is empty"),
    (["probe", "tiny-llama", "tiny-llama"], "exactly one prompt source"),
    (["probe", "tiny-llama", "tiny-llama", "--text", "a", "--cand-dtype", "fp7"], "unknown dtype"),
    (["probe", "tiny-llama", "tiny-llama", "--prompts", "/nonexistent.txt"], "not found"),
    (["probe", "tiny-llama", "tiny-llama", "--text", "x" * 200], "longer than"),
    (["probe", "tiny-llama", "tiny-llama", "--text", "a", "--max-new-tokens", "-3"], "must be ≥ 0 (0: score the given text)"),
    (["probe", "tiny-llama", "--perturb", "int8:channel", "--each-layer", "--layers", "attn", "--text", "a"],
     "does not combine with layers 'attn'"),
])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_bad_input_is_one_line_and_keeps_results(tmp_path, args, message, overwrite):
    out = tmp_path / "r.parquet"
    ok = runner.invoke(app, ["probe", "tiny-qwen3", "tiny-qwen3", "--text", "keep me", "--out", str(out)])
    assert ok.exit_code == 0
    before = read_results(out)
    res = runner.invoke(app, [*args, "--out", str(out), *overwrite] if "--out" not in args else [*args, *overwrite])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and message in res.output and res.output.startswith("error:")
    assert read_results(out).equals(before)


@pytest.mark.parametrize("dest", ["ds", "r.parquet"])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_candidate_failing_after_another_was_written_loses_nothing(tmp_path, dest, overwrite):
    """The second candidate's weights overflow (NaN logits) after the first was scored and written:
    one error line, and the destination holds its earlier run and the first new candidate, with or
    without --overwrite (which replaces the earlier content only when the whole command succeeds)."""
    out = tmp_path / dest
    assert runner.invoke(app, ["probe", "tiny-qwen3", "tiny-qwen3", "--text", "keep me", "--out", str(out)]).exit_code == 0
    before = read_results(out)
    res = runner.invoke(app, ["probe", "tiny-llama", "--perturb", "noise:0.1", "--perturb", "noise:1e38",
                              "--text", "hello there", "--out", str(out), *overwrite])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "NaN/Inf logits" in res.output
    after = summaries(read_results(out))
    assert set(before["run_id"]) < set(after["run_id"]) and set(after["perturb"].dropna()) >= {"noise:0.1"}
    kept = read_results(out).query("run_id in @before.run_id").reset_index(drop=True)
    assert kept[before.columns].equals(before)
    if overwrite:  # the same command, succeeding: now the earlier run goes
        assert runner.invoke(app, ["probe", "tiny-llama", "--perturb", "noise:0.1", "--text", "hello there",
                                   "--out", str(out), *overwrite]).exit_code == 0
        assert set(summaries(read_results(out))["perturb"]) == {"noise:0.1"}


def test_report_from_results(tmp_path):
    out = tmp_path / "r.parquet"
    runner.invoke(app, ["probe", "tiny-llama", "tiny-llama", "--cand-dtype", "bf16", "--text", "hello there",
                        "--out", str(out)])
    res = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "rep" / "summary.md").read_text()
    kl = summaries(read_results(out)).iloc[0]["kl_fwd_mean"]
    assert f"{kl:.3e}" in md or f"{kl:.4g}" in md
    assert "layers.2" in md
    import matplotlib.image as mpimg
    for png in ("per_layer.png", "kl_cdf.png"):
        img = mpimg.imread(tmp_path / "rep" / png)
        assert img.shape[0] > 100 and img.shape[1] > 100


@pytest.mark.smollm2
def test_smollm2_against_itself_is_exactly_zero(tmp_path):
    out = tmp_path / "self.parquet"
    res = runner.invoke(app, ["probe", "smollm2-135m", "smollm2-135m", "--text",
                              "The quick brown fox jumps over the lazy dog.", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summ = summaries(read_results(out)).iloc[0]
    for key in ("kl_fwd_mean", "kl_fwd_max", "kl_rev_mean", "tv_mean", "logp_abs_diff_max", "chi2_token"):
        assert summ[key] == 0.0, key
    assert summ["top1_agree"] == 1.0 and summ["tokens"] > 5


def test_perturb_runs_every_spec_against_one_reference(tmp_path):
    import mismatch
    from mismatch.perturb import perturbed
    from mismatch.model.generate import teacher_forced

    out = tmp_path / "p.parquet"
    res = runner.invoke(app, ["probe", "tiny-llama", "--perturb", "fp8-e4m3:channel", "--perturb", "noise:0.01",
                              "--layers", "mlp", "--text", "hello world", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summ = summaries(read_results(out)).set_index("perturb")
    assert list(summ.index) == ["fp8-e4m3:channel", "noise:0.01"] and set(summ["layers"]) == {"mlp"}
    lm = mismatch.load("tiny-llama")
    b = teacher_forced(lm, ["hello world"])
    ref = mismatch.reference(lm, b.input_ids, b.attention_mask, b.response_mask)
    for spec in ("fp8-e4m3:channel", "noise:0.01"):
        with perturbed(lm.model, spec, layers="mlp") as cand:
            with pytest.raises(mismatch.InputError, match="perturbed in place"):
                mismatch.probe(lm, cand, b.input_ids, b.attention_mask, b.response_mask)
            api = mismatch.probe(ref, cand)
        assert summ.loc[spec, "kl_fwd_mean"] == pytest.approx(api.summary["kl_fwd_mean"], rel=1e-12)


def test_each_layer_writes_one_run_per_block(tmp_path):
    """The isolation map into a results directory: one run per block, each equal to probing the model
    with only that block perturbed (the prefix replay changes no number)."""
    import mismatch
    from mismatch.perturb import perturbed
    from mismatch.model.generate import teacher_forced

    out = tmp_path / "map"
    res = runner.invoke(app, ["probe", "tiny-gpt2", "--perturb", "int4:group128", "--each-layer", "--no-per-layer",
                              "--text", "some text here", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summ = summaries(read_results(out)).set_index("layers")
    assert sorted(summ.index) == ["0", "1"] and len(list(out.glob("*.parquet"))) == 2
    lm = mismatch.load("tiny-gpt2")
    b = teacher_forced(lm, ["some text here"])
    ref = mismatch.reference(lm, b.input_ids, b.attention_mask, b.response_mask, per_layer=False)
    for block in ("0", "1"):
        with perturbed(lm.model, "int4:group128", layers=block) as cand:
            api = mismatch.probe(ref, cand, per_layer=False)
        assert summ.loc[block, "kl_fwd_mean"] == api.summary["kl_fwd_mean"] > 0


@pytest.mark.parametrize("args,message", [
    (["--perturb", "fp9"], "unknown perturbation kind 'fp9'"),
    (["--perturb", "int4", "--layers", "7"], "out of range"),
    (["--perturb", "int4", "--layers", "zzz"], "selects no linear module"),
    (["--perturb", "stale:2"], "OPD"),
    (["tiny-llama", "--each-layer"], "isolation map needs at least one perturbation spec"),
])
def test_bad_perturb_input(args, message):
    res = runner.invoke(app, ["probe", "tiny-llama", *args, "--text", "a b c"])
    assert res.exit_code == 2 and message in res.output and res.output.count("\n") == 1


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """Files a new user hands the CLI, each wrong in one way: {name: path}."""
    import mismatch
    from mismatch.dumps import DumpRecord, score_rollouts, write_rollouts

    root = tmp_path_factory.mktemp("bad")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    lm = mismatch.load("tiny-llama")
    for name in ("badjson", "notok"):
        lm.model.save_pretrained(root / name)
    (root / "badjson" / "config.json").write_text('{"model_type": "llama",')  # cut short
    good = root / "ds"
    assert runner.invoke(app, ["probe", "tiny-llama", "tiny-llama", "--text", "keep", "--out", str(good)]).exit_code == 0
    part = next(good.glob("*.parquet"))
    part.write_bytes(part.read_bytes()[: len(part.read_bytes()) // 2])  # a truncated part
    ids = lm.tokenizer("hello there")["input_ids"]
    dump = write_rollouts(root / "d.jsonl", [DumpRecord(tuple(ids[:2]), tuple(ids[2:]), (-1.0,) * (len(ids) - 2))])
    score_rollouts(lm, dump, out=root / "per_token.parquet", check_text=False)
    return root


@pytest.mark.parametrize("args,message", [
    (["probe", "tiny-llama", "tiny-llama", "--prompts", "{root}/latin1.txt"], "is not UTF-8 text (byte 3 is 0xe9)"),
    (["probe", "{root}/badjson", "tiny-llama", "--text", "hi"], "config.json is not valid JSON"),
    (["probe", "{root}/notok", "tiny-llama", "--text", "hi"], "has no tokenizer"),
    (["report", "{root}/ds", "--out", "{root}/rep1"], "is not a readable parquet file"),
    (["report", "{root}/per_token.parquet", "--out", "{root}/rep2"], "per-token table `score-rollouts --out` writes"),
    (["report", "{root}/ds", "--out", "{root}/latin1.txt"], "is a file, not a folder"),
    (["probe", "tiny-llama", "tiny-llama", "--text", "a", "--out", "{root}/latin1.txt/r"], "latin1.txt is a file"),
    (["probe", "tiny-llama", "tiny-llama", "--text", "a", "--out", "/proc/mismatch-x/r"], "does not take new files"),
    (["opd", "--pair", "sort-gpt2", "--steps", "2", "--save", "{root}/latin1.txt"], "is a file, not a folder"),
])
def test_every_file_problem_is_one_line(bad_files, args, message):
    res = runner.invoke(app, [a.format(root=bad_files) for a in args])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("error:") and message in res.output, res.output


def _main(monkeypatch, capsys, *argv):
    """The console script `mismatch ARGV…` in this process: (exit code, stderr)."""
    from mismatch.cli.app import main

    monkeypatch.setattr(sys, "argv", ["mismatch", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    return done.value.code, capsys.readouterr().err


def test_a_usage_error_is_the_same_one_error_line(monkeypatch, capsys):
    code, err = _main(monkeypatch, capsys, "probe", "tiny-llama", "--max-new-tokens", "abc")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: Invalid value for '--max-new-tokens':") and "valid integer" in err
    assert err.rstrip().endswith("(see `mismatch probe --help`)")
    code, err = _main(monkeypatch, capsys, "probe", "tiny-llama", "--no-such-option")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: No such option: --no-such-option")
    assert _main(monkeypatch, capsys, "models")[0] == 0


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_an_interrupt_says_in_one_line_what_was_kept(tmp_path, monkeypatch, overwrite):
    """Ctrl-C (KeyboardInterrupt, what SIGINT raises) after the first new candidate was written:
    exit 130, one line naming what the destination keeps; with --overwrite the earlier runs are all
    still there."""
    from mismatch.results import ResultsWriter

    out = tmp_path / "ds"
    assert runner.invoke(app, ["probe", "tiny-qwen3", "tiny-qwen3", "--text", "keep me", "--out", str(out)]).exit_code == 0
    before = read_results(out)
    finish = ResultsWriter.finish

    def finish_then_interrupt(self, kind, rid):
        finish(self, kind, rid)
        raise KeyboardInterrupt

    monkeypatch.setattr(ResultsWriter, "finish", finish_then_interrupt)
    res = runner.invoke(app, ["probe", "tiny-llama", "--perturb", "noise:0.1", "--perturb", "int4:group32",
                              "--text", "hello there", "--out", str(out), *overwrite])
    assert res.exit_code == 130 and res.output.count("\n") == 1 and res.output.startswith(f"interrupted: {out} keeps")
    assert ("--overwrite removed nothing" in res.output) == bool(overwrite)
    after = summaries(read_results(out))
    assert set(before["run_id"]) < set(after["run_id"]) and set(after["perturb"].dropna()) == {"none", "noise:0.1"}


@pytest.mark.parametrize("args", [
    ["probe", "tiny-llama", "--perturb", "engine:llama.cpp,f32", "--text", "hi", "--max-new-tokens", "4"],
    ["opd", "--pair", "sort-gpt2", "--rollout", "engine:llama.cpp,f32", "--baseline", "--steps", "2"],
])
def test_a_missing_engine_is_found_before_any_model_runs(monkeypatch, tmp_path, args):
    """Without llama.cpp installed (its module not found), probe and opd stop at once with one line —
    not after generating the responses or training the clean baseline."""
    import importlib.util

    from mismatch.results import ResultsWriter

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    monkeypatch.setattr(ResultsWriter, "write", lambda *a: pytest.fail("a run was written"))
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "ds")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "llama.cpp is not installed" in res.output


# Config fields the CLI does not expose as options, each with its reason. A study file's `[static]` /
# `[dynamic.settings]` tables (`mismatch sweep`) set every field.
HIDDEN = {
    "probe": {"texts": "given as --text (repeatable)", "prompts": "given as --prompts FILE",
              "candidate": "the CANDIDATE argument"},
    "opd": {name: "set in a study's [dynamic.settings] (`mismatch sweep`)" for name in (
        "rollout",  # given as --rollout (repeatable: one run per spec)
        "warmup_steps", "decay", "final_lr_frac", "weight_decay", "adam_beta1", "grad_clip", "max_new_tokens",
        "train_prompts", "eval_greedy", "eval_probe", "clip", "chunk_tokens")},
    "check": {"chat": "decided by the tokenizer (a chat template means chat), as the study's calibration was",
              "trainer": "its fields are options of their own (--lr, --adam-beta1, --loss, --tis-cap)"},
    "monitor": {},
}
RENAMED = {"probe": {"text": "texts"}}  # CLI option → config field
# Options whose help is not their config field's on purpose: why
HELP_DIFFERS = {"opd": {"rollout": "repeatable: each rollout is a run of its own",
                        "device": "the shared --device of every command that computes"}}
# Options whose CLI default differs from the field's on purpose: (the CLI's default, why)
CLI_DEFAULTS = {"opd": {"device": ("auto", "the command uses a GPU where one is present; the API stays on the CPU, "
                                           "so results made without a device keep their ids")}}


@pytest.mark.parametrize("command, config", [("probe", "mismatch.probes.runs:ProbeConfig"),
                                             ("opd", "mismatch.opd.config:OPDConfig"),
                                             ("check", "mismatch.admission.calibration:CalibrationSettings"),
                                             ("check", "mismatch.admission.checker:Pipeline"),
                                             ("check", "mismatch.admission.lagged:TrainerSettings"),
                                             ("monitor", "mismatch.monitor.settings:MonitorSettings")])
def test_every_config_field_is_an_option_with_the_config_default_or_hidden_with_a_reason(command, config):
    """Defaults and help live on the config fields: each CLI option that sets a field has the field's default,
    and every field is an option or listed in HIDDEN with why (so a new field cannot be forgotten)."""
    import dataclasses
    import importlib

    import typer.main

    from mismatch.cli.app import app

    module, name = config.split(":")
    fields = {f.name: f for f in dataclasses.fields(getattr(importlib.import_module(module), name))}
    params = {RENAMED.get(command, {}).get(p.name, p.name): p for p in typer.main.get_command(app).commands[command].params}
    assert len(params) >= 5  # the premise: the command's options are read (monitor has the fewest: 6)
    missing = [f for f in fields if f not in params and f not in HIDDEN[command]]
    assert missing == [], f"{command}: fields neither exposed nor hidden with a reason: {missing}"
    stale = [f for f in HIDDEN[command] if f not in fields and command != "check"]  # check: two configs
    assert stale == [], f"{command}: HIDDEN names fields that no longer exist: {stale}"
    for field_name, param in params.items():
        if field_name not in fields or field_name in HIDDEN[command]:
            continue
        want = fields[field_name].default
        if field_name in CLI_DEFAULTS.get(command, {}):
            want = CLI_DEFAULTS[command][field_name][0]
        if want is dataclasses.MISSING:  # a required field: a required argument or option
            assert param.required, (command, field_name)
            continue
        got = param.default
        if isinstance(want, tuple):
            want, got = list(want), list(got or [])
        assert got == want, f"{command} --{param.name.replace('_', '-')}: CLI default {got!r}, config default {want!r}"
        field_help = fields[field_name].metadata.get("help")  # help written once, on the field
        if field_help is not None and field_name not in HELP_DIFFERS.get(command, {}):
            assert param.help == field_help, f"{command} --{param.name.replace('_', '-')}: help not the field's"


def test_help_and_models_import_no_torch():
    """`mismatch --help` and `mismatch models` need no model: they cost typer's start-up, not torch's
    (the timing is benchmarks/bench_cli.py's; this pins the cause)."""
    import subprocess
    import sys

    for argv in (["--help"], ["models"]):
        code = ("import sys; sys.argv = ['mismatch', *sys.argv[1:]]\nfrom mismatch.cli.app import main\n"
                "try:\n    main()\nexcept SystemExit:\n    pass\n"
                "print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))")
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
        assert "built-in models" in done.stdout or "Usage" in done.stdout
        assert done.stdout.strip().splitlines()[-1] == "[]", (argv, done.stdout[-200:])


@pytest.mark.parametrize("argv, message", [
    (["check", "smollm2-135m", "--rollout", "int4:nope"], "error: unknown integer granularity 'nope'"),
    (["check", "no-such-model", "--rollout", "int4"], "error: unknown model 'no-such-model'"),
    (["probe", "smollm2-135m", "--perturb", "fp9", "--text", "hi"], "error: unknown perturbation kind 'fp9'"),
    (["opd", "--pair", "sort-gpt2", "--rollout", "stale:x"], "error: stale needs an integer number of steps"),
    (["check", "tiny-llama", "--prompts", "/nonexistent/p.txt"], "error: prompts file not found: /nonexistent/p.txt"),
    (["score-rollouts", "/nonexistent/r.jsonl"], "error: rollouts file not found: /nonexistent/r.jsonl"),
    (["monitor", "/nonexistent/log.jsonl"], "error: no log at /nonexistent/log.jsonl"),
])
def test_a_typo_is_answered_before_torch_loads(argv, message):
    """What needs no model is checked before the library is imported (each command imported torch and
    transformers first: 8–10 s before any of these lines): in a fresh interpreter, the one line, exit 2, and
    torch never imported."""
    import subprocess

    code = ("import sys\nfrom mismatch.cli.app import main\nsys.argv = ['mismatch', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr)
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_an_unforeseen_error_is_one_line_exit_2_and_its_traceback_only_with_debug(monkeypatch):
    """Exit 1 is `check`'s reject and `monitor`'s crossed: a crash that exited 1 read as a verdict. Any exception
    the toolkit did not foresee is now one `error:` line and exit 2; `mismatch --debug` adds the traceback. (Here
    a failure injected into the check's library call, as a bug would raise it.)"""
    import mismatch.admission as admission

    def crash(*args, **kwargs):
        raise RuntimeError("an internal failure\nwith a second line")

    monkeypatch.setattr(admission, "check", crash)
    monkeypatch.delenv("MISMATCH_DEBUG", raising=False)
    res = runner.invoke(app, ["check", "tiny-llama", "--rollout", "int8:channel"])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1] == ("error: RuntimeError: an internal failure (`mismatch --debug …` or "
                                                   "MISMATCH_DEBUG=1 prints the traceback)")
    debug = runner.invoke(app, ["--debug", "check", "tiny-llama", "--rollout", "int8:channel"])
    monkeypatch.delenv("MISMATCH_DEBUG", raising=False)  # --debug set it in this process
    assert debug.exit_code == 2 and "Traceback (most recent call last)" in debug.stderr
    assert "error: RuntimeError: an internal failure" in debug.stderr


def test_threads_sets_the_commands_torch_threads(tmp_path, monkeypatch):
    import torch

    before = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, str(before))  # monkeypatch restores what the command sets
    try:
        seen = {}
        import mismatch.report as report_lib

        monkeypatch.setattr(report_lib, "report", lambda *a, **k: [] if seen.setdefault("threads", torch.get_num_threads()) else [])
        res = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r"), "--threads", "1"])
        assert seen.get("threads") == 1, res.output
        bad = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r"), "--threads", "0"])
        assert bad.exit_code == 2 and bad.stderr.strip() == "error: --threads must be ≥ 1, got 0"
    finally:
        torch.set_num_threads(before)


def test_check_offload_flag_reaches_the_check_and_changes_no_number():
    import json as _json

    from typer.testing import CliRunner

    from mismatch.cli.app import app

    argv = ["check", "tiny-llama", "--rollout", "int4:group128", "--max-prompts", "2", "--max-new-tokens", "4",
            "--no-recipe", "--json", "--device", "cpu"]
    runs = [CliRunner().invoke(app, [*argv, flag]) for flag in ("--offload", "--no-offload")]
    assert all(r.exit_code in (0, 1, 3) for r in runs), [r.output[-300:] for r in runs]
    one, two = (_json.loads(r.stdout) for r in runs)
    assert one["metrics"] == two["metrics"] and one["status"] == two["status"]


def test_json_is_the_result_on_stdout_alone(tmp_path):
    """`--json` prints the command's result as strict JSON on stdout — the probe's summaries (equal to the rows
    it wrote), the thresholds (the file it wrote) — and nothing else there; what was written goes to stderr."""
    import json

    out = tmp_path / "p.parquet"
    res = runner.invoke(app, ["probe", "tiny-llama", "--perturb", "noise:0.01", "--text", "hello world", "--out",
                              str(out), "--json"])
    assert res.exit_code == 0, res.output
    (got,) = json.loads(res.stdout)
    summ = summaries(read_results(out)).iloc[0]
    assert got["perturb"] == "noise:0.01" and got["summary"]["kl_fwd_mean"] == summ["kl_fwd_mean"]
    assert "wrote" not in res.stdout and "wrote" in res.stderr

    from tests.admission.test_thresholds import study_rows  # a small study with clean twins and decided levels

    study_rows().to_parquet(tmp_path / "study.parquet")
    fitted = tmp_path / "t.json"
    res = runner.invoke(app, ["thresholds", str(tmp_path / "study.parquet"), "--out", str(fitted), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads(fitted.read_text())
