"""The perturbation kind registry: every kind parses, round-trips, is listed, documented and
dispatched to its own handler; names and config classes are registered once."""

import dataclasses
from pathlib import Path

import pytest

from mismatch.errors import InputError
from mismatch.perturb import (
    KINDS,
    active_perturbations,
    is_perturbed,
    parse_spec,
    perturb_,
    perturbed,
    registry,
    render_spec_table,
    restore_,
    select,
)
from mismatch.perturb.apply import ACTIVE_PERTURBATIONS_KEY
from mismatch.perturb.configs import IntConfig, SpecText
from mismatch.perturb.registry import Backend, Kind, kind_named, kind_names, kind_of, register_kind
from tests.conftest import random_ids

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
EXAMPLES = [(kind, spec) for kind in registry.registered_kinds() for spec in kind.examples]


@pytest.mark.parametrize("kind,spec", EXAMPLES, ids=[spec for _, spec in EXAMPLES])
def test_every_registered_example_parses_and_round_trips(kind, spec):
    config = parse_spec(spec)
    assert type(config) is kind.config
    assert kind_of(config) is kind
    assert spec.partition(":")[0] in kind.names
    assert str(config) == spec
    assert parse_spec(str(config)) == config
    assert type(config)(**dataclasses.asdict(config)) == config


def test_every_name_is_registered_once_and_listed_in_the_unknown_kind_error():
    kinds = registry.registered_kinds()
    assert kind_names() == KINDS == tuple(name for kind in kinds for name in kind.names)
    assert len(set(KINDS)) == len(KINDS)
    assert len({kind.config for kind in kinds}) == len(kinds)
    for kind in kinds:
        for name in kind.names:
            assert kind_named(name) is kind
            assert any(spec.partition(":")[0] == name for spec in kind.examples), name
    with pytest.raises(InputError) as info:
        parse_spec("nope:1")
    listed = str(info.value).split("valid kinds: ", 1)[1].split(", ")
    assert listed == list(KINDS)


def test_the_docs_spec_table_is_the_rendered_registry():
    text = DESIGN.read_text(encoding="utf-8")
    assert text.count("<!-- spec-table -->") == 1 and text.count("<!-- /spec-table -->") == 1  # the premise
    table = text.split("<!-- spec-table -->", 1)[1].split("<!-- /spec-table -->", 1)[0]
    assert table.strip("\n") == render_spec_table()


def test_rendered_table_has_one_row_per_kind_naming_every_spec_name():
    rows = render_spec_table().splitlines()[2:]
    kinds = registry.registered_kinds()
    assert len(rows) == len(kinds)
    for row, kind in zip(rows, kinds):
        assert row.count(" | ") == 2 and kind.description in row and f"| {kind.backend} |" in row
        for name in kind.names:
            assert f"`{name}:" in row or f"`{name}`" in row, name


@pytest.mark.parametrize("kind", registry.registered_kinds(), ids=lambda k: k.names[0])
def test_perturb_dispatches_to_the_kinds_handler(tiny, monkeypatch, kind):
    model = tiny("tiny-llama").model
    calls = []

    def spy(config, model_, names, snap, ctx):
        calls.append((config, model_, names, snap, ctx))

    monkeypatch.setitem(registry._BY_CONFIG, kind.config, dataclasses.replace(kind, apply=spy))
    ids = random_ids(1, 4)
    spec = kind.examples[-1]
    snap = perturb_(model, spec, layers="mlp", seed=3, calibration_ids=ids)
    try:
        assert len(calls) == 1
        config, model_, names, snap_, ctx = calls[0]
        assert config == parse_spec(spec) and model_ is model and snap_ is snap
        assert names == select(model, "mlp") == snap.names
        assert ctx.seed == 3 and ctx.calibration_ids is ids
    finally:
        restore_(model, snap)


def test_registering_a_taken_name_or_config_is_an_error():
    kind = kind_named("int8")

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class OtherConfig:
        bits: int

    with pytest.raises(ValueError, match="'int8' is already registered"):
        register_kind(dataclasses.replace(kind, names=("int5", "int8"), config=OtherConfig))
    with pytest.raises(ValueError, match="IntConfig is already registered"):
        register_kind(dataclasses.replace(kind, names=("int5",)))
    assert "int5" not in kind_names()  # nothing half-registered
    assert kind_of(IntConfig(bits=8, granularity="channel")) is kind
    with pytest.raises(TypeError, match="not a registered perturbation config"):
        kind_of(OtherConfig(bits=3))
    with pytest.raises(ValueError, match="one non-empty line"):
        dataclasses.replace(kind, description="two\nlines")


def test_a_new_kind_is_parsed_listed_rendered_and_applied(tiny, monkeypatch):
    """One `register_kind` call is all a new kind needs (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "_BY_NAME", dict(registry._BY_NAME))
    monkeypatch.setattr(registry, "_BY_CONFIG", dict(registry._BY_CONFIG))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class RepeatConfig:
        steps: int

        @classmethod
        def from_spec(cls, text: SpecText) -> "RepeatConfig":
            return cls(steps=int(text.options[0]))

        def __str__(self) -> str:
            return f"repeat:{self.steps}"

    applied = []
    register_kind(Kind(names=("repeat",), config=RepeatConfig, parse=RepeatConfig.from_spec,
                       apply=lambda config, *_: applied.append(config), backend=Backend.TORCH,
                       usage=("repeat:R",), description="one rollout batch, R optimizer steps", examples=("repeat:2",)))
    assert parse_spec("repeat:2") == RepeatConfig(steps=2)
    assert "repeat" in registry.valid_kinds()
    names = registry.kind_names()  # by backend, then in registration order: after torch's last kind, before bnb's
    assert names.index("repeat") == names.index("noise") + 1 and names[names.index("repeat") + 1] == "bnb-int8"
    rows = render_spec_table().splitlines()
    row = rows.index("| `repeat:R` | torch | one rollout batch, R optimizer steps |")  # one row per kind
    assert rows[row + 1].startswith("| `bnb-int8`")
    model = tiny("tiny-llama").model
    with perturbed(model, "repeat:2"):
        assert applied == [RepeatConfig(steps=2)]


def test_is_perturbed_reads_without_creating_state(tiny):
    model = tiny("tiny-gpt2").model
    assert not is_perturbed(model) and active_perturbations(model) == ()
    assert ACTIVE_PERTURBATIONS_KEY not in model.__dict__  # the query left nothing behind
    with perturbed(model, "int8:channel", layers="0") as cand:
        outer = active_perturbations(cand)
        assert is_perturbed(cand) and [s.spec for s in outer] == ["int8:channel"]
        inner = perturb_(model, "noise:0.1", layers="1")
        assert active_perturbations(model) == (*outer, inner)
        restore_(model, inner)
        restore_(model, inner)  # idempotent
        assert active_perturbations(model) == outer
    assert not is_perturbed(model)
    assert ACTIVE_PERTURBATIONS_KEY not in model.__dict__


def test_a_failing_handler_leaves_the_model_unperturbed(tiny):
    model = tiny("tiny-llama").model
    with pytest.raises(InputError, match="calibration_ids"):  # quanto's a8 handler refuses without data
        perturb_(model, "quanto-int8:a8")
    assert not is_perturbed(model)
