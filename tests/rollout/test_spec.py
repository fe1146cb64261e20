"""RolloutSpec: one parse of a rollout string, one definition of clean, labels and sources as the reports use them."""

import pytest

from mismatch.errors import InputError, ModelNotAvailableError
from mismatch.opd.config import OPDConfig
from mismatch.perturb import parse_spec
from mismatch.rollout.spec import EngineConfig, RolloutSpec, parse_candidate, render_rollout_table, require_engines


@pytest.mark.parametrize("rollout, staleness, want", [
    # text, staleness → (perturbation, engine, K, R, label, source, level, clean)
    ("none", 0, (None, None, 0, 1, "clean", "clean", 0, True)),
    ("", 0, (None, None, 0, 1, "clean", "clean", 0, True)),
    ("none", 2, (None, None, 2, 1, "stale:2", "stale", 2, False)),
    ("stale:4", 0, (None, None, 4, 1, "stale:4", "stale", 4, False)),
    ("stale:0", 0, (None, None, 0, 1, "clean", "clean", 0, True)),  # trains exactly as clean: clean
    ("reuse:1", 0, (None, None, 0, 1, "clean", "clean", 0, True)),
    ("reuse:4", 2, (None, None, 2, 4, "reuse:4 + stale:2", "reuse", "4 + stale:2", False)),
    ("resample:1", 0, (None, None, 0, 1, "resample:1", "A/A", 0, False)),  # other samples: not clean
    ("resample:0", 0, (None, None, 0, 1, "clean", "clean", 0, True)),  # the run's own stream
    ("fp8-e4m3", 0, ("fp8-e4m3:channel", None, 0, 1, "fp8-e4m3", "format", "fp8-e4m3:channel", False)),
    ("int4:group128", 2, ("int4:group128", None, 2, 1, "int4:group128 + stale:2", "format", "int4:group128 + stale:2",
                          False)),
    ("noise:0.3", 0, ("noise:0.3", None, 0, 1, "noise:0.3", "noise", 0.3, False)),
    ("engine:llama.cpp,q8_0", 1, (None, "engine:llama.cpp,q8_0", 1, 1, "engine:llama.cpp,q8_0 + stale:1", "engine",
                                  "engine:llama.cpp,q8_0 + stale:1", False)),
])
def test_parse_gives_one_value_with_its_label_source_and_level(rollout, staleness, want):
    spec = RolloutSpec.parse(rollout, staleness)
    got = (spec.perturbation_spec, None if spec.engine is None else str(spec.engine), spec.staleness, spec.reuse,
           spec.label, spec.source, spec.level, spec.is_clean)
    assert got == want
    config = OPDConfig(pair="sort-gpt2", rollout=rollout or "none", staleness=0 if rollout.startswith("stale") else staleness)
    assert config.is_clean == spec.is_clean  # the config asks the spec: one definition
    assert config.rollout_spec.label == spec.label
    if spec.is_clean:  # stored as the clean run itself: one run, one id
        assert (config.rollout, config.staleness) == ("none", 0) and config == OPDConfig(pair="sort-gpt2")


@pytest.mark.parametrize("rollout, staleness, match", [
    ("stale:4", 2, "disagree"), ("stale:x", 0, "integer"), ("reuse:0", 0, "≥ 1"), ("none", -1, "≥ 0"),
    ("resample:-1", 0, "≥ 0"), ("resample:a", 0, "integer"),
    ("fp9", 0, "unknown perturbation kind"), ("engine:vllm", 0, "unknown engine"),
])
def test_bad_rollouts_are_one_line_input_errors(rollout, staleness, match):
    with pytest.raises(InputError, match=match):
        RolloutSpec.parse(rollout, staleness)


def test_only_perturbations_are_perturbation_kinds():
    """parse_spec returns only what perturb_ can apply: the rollout-only forms are not kinds."""
    for text in ("stale:1", "reuse:2", "resample:1", "engine:llama.cpp"):
        with pytest.raises(InputError, match="is not a perturbation kind"):
            parse_spec(text)
    assert isinstance(parse_candidate("engine:llama.cpp"), EngineConfig)
    assert str(parse_candidate("fp8-e4m3")) == "fp8-e4m3:channel"
    for text in ("stale:1", "resample:1"):
        with pytest.raises(InputError, match="only inside an OPD trajectory"):
            parse_candidate(text)


def test_weight_bits_of_formats_and_engines():
    assert RolloutSpec.parse("int4:group128").weight_bits == parse_spec("int4:group128").weight_bits
    assert RolloutSpec.parse("engine:llama.cpp,q8_0").weight_bits == 8.5
    assert RolloutSpec.parse("stale:2").weight_bits != RolloutSpec.parse("stale:2").weight_bits  # NaN: no format


def test_require_engines_names_the_missing_engine(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    require_engines(["fp8-e4m3", "stale:1", None])  # nothing to run elsewhere: fine
    with pytest.raises(ModelNotAvailableError, match="engine:llama.cpp,f16: llama.cpp is not installed"):
        require_engines(["engine:llama.cpp,f16"])


def test_rollout_table_lists_every_rollout_only_form():
    table = render_rollout_table().splitlines()
    assert len(table) == 2 + 5 and all(row.count(" | ") == 1 for row in table[2:])  # escaped | inside forms


@pytest.mark.parametrize("spec, columns", [
    ("engine:llama.cpp,f32", {"engine": "llama.cpp", "weights": "f32", "kv": "f16"}),
    ("engine:llama.cpp,q4_1,kv-f32", {"engine": "llama.cpp", "weights": "q4_1", "kv": "f32"}),
])
def test_engine_specs_round_trip(spec, columns):
    import dataclasses

    engine = RolloutSpec.parse(spec).engine
    assert str(engine) == spec and dataclasses.asdict(engine) == columns and EngineConfig(**columns) == engine


@pytest.mark.parametrize("spec, message", [
    ("engine", "needs a name"), ("engine:vllm", "unknown engine 'vllm'"), ("engine:llama.cpp,q3_k", "valid: f32"),
    ("engine:llama.cpp,f16,q8_0", "at most one weight type"), ("engine:llama.cpp,kv-q8", "unknown KV cache type"),
    ("stale:-1", "≥ 0"), ("reuse:x", "reuse:4"),
])
def test_bad_rollout_forms(spec, message):
    with pytest.raises(InputError, match=message) as info:
        RolloutSpec.parse(spec)
    assert "\n" not in str(info.value)


def test_the_docs_rollout_table_is_the_rendered_forms():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text(encoding="utf-8")
    assert text.count("<!-- rollout-table -->") == 1 and text.count("<!-- /rollout-table -->") == 1  # the premise
    table = text.split("<!-- rollout-table -->", 1)[1].split("<!-- /rollout-table -->", 1)[0]
    assert table.strip("\n") == render_rollout_table()
