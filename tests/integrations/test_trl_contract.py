"""What `mismatch.integrations.trl` needs of TRL, checked where it can break: the private hooks it overrides
(their signatures, at import), the private attributes it reads (at construction), the parameter sharding it
refuses (FSDP, DeepSpeed ZeRO-3) and the positions a run needs (prompt + completion)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

import mismatch
from mismatch.errors import InputError

trl = pytest.importorskip("trl", reason="the trl extra is not installed (make test installs it)")
from accelerate.utils import DeepSpeedPlugin  # noqa: E402
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

from mismatch.integrations import trl as integration  # noqa: E402
from tests.trl_runs import trl_trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pair():
    return mismatch.load_pair("sort-gpt2")


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# -- the hooks, at import -----------------------------------------------------------------------------------

def test_the_guard_passes_the_installed_trl_and_its_range_is_pyprojects():
    integration.check_trl()  # what the import ran
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trl"]
    (declared,) = [Requirement(r).specifier for r in extra if Requirement(r).name == "trl"]
    assert declared == integration.TESTED_TRL
    assert Version(trl.__version__) in declared



def test_a_trl_outside_the_range_whose_hooks_match_warns_in_one_line(monkeypatch, caplog):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with caplog.at_level(logging.WARNING, logger="mismatch"):
        integration.check_trl()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "trl 1.17.0 is outside the tested" in line and "\n" not in line


def test_a_hook_of_another_signature_fails_in_one_line_naming_trl_and_the_hook(monkeypatch):
    def changed(self, prompt_ids, images, multimodal_fields):  # a TRL whose hook lost a parameter
        return []

    monkeypatch.setattr(trl.DistillationTrainer, "_generate_single_turn", changed)
    with pytest.raises(integration.TRLVersionError) as err:
        integration.check_trl()
    message = _one_line(err)
    assert f"trl {trl.__version__}" in message and "DistillationTrainer._generate_single_turn" in message
    assert "(self, prompt_ids, images, multimodal_fields)" in message  # what this TRL has
    assert "expects (self, prompt_ids, images, multimodal_fields, has_tool_images=False)" in message
    assert str(integration.TESTED_TRL) in message


def test_a_fake_signature_table_and_a_missing_hook_fail_too(monkeypatch):
    hooks = {**integration.HOOKS, "_generate_and_score_completions": ("self", "inputs", "mode")}
    with pytest.raises(integration.TRLVersionError, match=r"_generate_and_score_completions takes \(self, inputs\)"):
        integration.check_trl(hooks=hooks)
    monkeypatch.delattr(trl.DistillationTrainer, "_get_last_hidden_state")
    with pytest.raises(integration.TRLVersionError, match="has no _get_last_hidden_state") as err:
        integration.check_trl()
    assert f"trl {trl.__version__}" in _one_line(err)


def test_importing_the_integration_over_a_changed_trl_fails_at_import():
    # a fresh interpreter whose TRL hook changed before the integration is imported: the import itself refuses
    code = ("import trl; trl.DistillationTrainer._generate_and_score_completions = lambda self, inputs, mode: {}; "
            "import mismatch.integrations.trl")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mismatch.integrations.trl.TRLVersionError: trl ")
    assert "DistillationTrainer._generate_and_score_completions takes (self, inputs, mode)" in last


# -- the attributes, at construction ------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [("_is_vlm", None), ("_tokenizer", None), ("model_wrapped", None),
                                         ("_metrics", {"train": {}, "eval": {}}),
                                         ("_metrics", {"train": defaultdict(list)}), ("beta", None),
                                         ("beta", "1.0")])
def test_a_trl_without_the_attributes_read_fails_at_construction(pair, tmp_path, monkeypatch, name, value):
    init = trl.DistillationTrainer.__init__

    def changed(self, *args, **kwargs):  # a TRL whose trainer no longer sets `name` (or sets it otherwise)
        init(self, *args, **kwargs)
        if value is None:
            delattr(self, name)
        else:
            setattr(self, name, value)

    monkeypatch.setattr(trl.DistillationTrainer, "__init__", changed)
    with pytest.raises(integration.TRLVersionError) as err:
        trl_trainer(pair, tmp_path)
    message = _one_line(err)
    assert f"trl {trl.__version__}" in message and f"DistillationTrainer.{name}" in message


# -- sharding -----------------------------------------------------------------------------------------------

def test_fsdp_is_refused_in_one_line_from_the_arguments_and_from_accelerates_launcher(pair, tmp_path, monkeypatch):
    # TrainingArguments' own `fsdp`, as a user passes it: refused before transformers' "only works in distributed"
    with pytest.raises(InputError, match="FSDP") as err:
        trl_trainer(pair, tmp_path, config=dict(fsdp="full_shard"))
    assert "not supported" in _one_line(err)
    # `accelerate launch --use_fsdp` sets this variable (accelerate/utils/launch.py) for its state to read
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(InputError, match="FSDP") as err:
        trl_trainer(pair, tmp_path)
    _one_line(err)


def test_deepspeed_zero3_is_refused_and_zero2_is_not(pair):
    # accelerate's own plugin, from the DeepSpeed config a user writes; TrainingArguments holds it as
    # `deepspeed_plugin` (transformers training_args.py, `deepspeed=`), where TRL reads its `zero_stage`
    args = trl.DistillationConfig(output_dir="/tmp/unused", use_cpu=True, report_to="none")
    args.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3},
                                                          "train_micro_batch_size_per_gpu": 1})
    assert integration.sharding_of(args) == "DeepSpeed ZeRO-3"
    with pytest.raises(InputError, match="DeepSpeed ZeRO-3") as err:
        integration.MismatchDistillationTrainer(model=pair.student.model, teacher_model=pair.teacher.model, args=args)
    _one_line(err)
    args.deepspeed_plugin = DeepSpeedPlugin(zero_stage=2)
    assert integration.sharding_of(args) is None
    args.deepspeed_plugin = None
    assert integration.sharding_of(args) is None


# -- lengths ------------------------------------------------------------------------------------------------

def test_trls_default_completion_length_on_a_64_position_model_is_refused_in_one_line(pair, tmp_path):
    # TRL's default max_completion_length (512) would die in `generate`: IndexError: index out of range in self
    with pytest.raises(InputError) as err:
        trl_trainer(pair, tmp_path, config=dict(max_completion_length=None))
    message = _one_line(err)
    assert "max_completion_length 512" in message and "64 positions" in message


@pytest.mark.parametrize("multiple", [None, 5])
def test_the_longest_prompt_plus_the_completion_may_fill_the_positions_exactly(pair, tmp_path, multiple):
    # independent: the longest of the run's prompts as the tokenizer encodes them (plain-text prompts), and the
    # largest completion whose padded row (each part rounded up to `multiple`, as TRL pads) fits 64 positions
    longest = max(len(pair.student.tokenizer(p)["input_ids"]) for p in pair.prompts("train", 64, seed=0))
    positions = pair.student.model.config.n_positions
    step = multiple or 1
    fit = max(c for c in range(1, positions) if math.ceil(longest / step) * step + math.ceil(c / step) * step
              <= positions)
    trl_trainer(pair, tmp_path, config=dict(max_completion_length=fit, pad_to_multiple_of=multiple))
    with pytest.raises(InputError, match=f"longest prompt \\({longest} tokens\\)") as err:
        trl_trainer(pair, tmp_path, config=dict(max_completion_length=fit + 1, pad_to_multiple_of=multiple))
    assert f"max_completion_length ≤ {fit}" in _one_line(err)
