"""Spec strings parse into frozen configs and back; bad specs are one clear line."""

import dataclasses

import pytest

from mismatch.errors import InputError
from mismatch.perturb.spec import KINDS, parse_spec

# canonical spec -> the result columns its config flattens to (written out by hand)
CANONICAL = {
    "fp8-e4m3:tensor": {"fmt": "e4m3", "granularity": "tensor", "w8a8": False, "scaled_mm": False},
    "fp8-e4m3:channel": {"fmt": "e4m3", "granularity": "channel", "w8a8": False, "scaled_mm": False},
    "fp8-e4m3:block128": {"fmt": "e4m3", "granularity": "block128", "w8a8": False, "scaled_mm": False},
    "fp8-e4m3:channel,w8a8": {"fmt": "e4m3", "granularity": "channel", "w8a8": True, "scaled_mm": False},
    "fp8-e5m2:block128,w8a8": {"fmt": "e5m2", "granularity": "block128", "w8a8": True, "scaled_mm": False},
    "fp8-e4m3:block128,w8a8,scaled_mm": {"fmt": "e4m3", "granularity": "block128", "w8a8": True, "scaled_mm": True},
    "int8:channel": {"bits": 8, "granularity": "channel"},
    "int4:group128": {"bits": 4, "granularity": "group128"},
    "int4:group32": {"bits": 4, "granularity": "group32"},
    "int3:group32": {"bits": 3, "granularity": "group32"},
    "int2:channel": {"bits": 2, "granularity": "channel"},
    "dtype:bf16": {"dtype": "bf16"},
    "dtype:fp16": {"dtype": "fp16"},
    "noise:0": {"sigma": 0.0},
    "noise:0.03": {"sigma": 0.03},
    "bnb-int8": {"method": "int8"},
    "bnb-nf4": {"method": "nf4"},
    "bnb-fp4": {"method": "fp4"},
    "quanto-int8": {"weights": "int8", "activations": False},
    "quanto-int4": {"weights": "int4", "activations": False},
    "quanto-fp8:a8": {"weights": "fp8", "activations": True},
}


@pytest.mark.parametrize("spec,columns", CANONICAL.items())
def test_round_trip(spec, columns):
    config = parse_spec(spec)
    assert str(config) == spec
    assert parse_spec(str(config)) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, next(iter(dataclasses.asdict(config))), None)
    assert dataclasses.asdict(config) == columns  # flattens to exactly these result columns
    assert type(config)(**columns) == config  # and is rebuilt from them


def test_aliases_and_defaults():
    assert str(parse_spec("quanto-int8,a8")) == "quanto-int8:a8"  # docs/design.md's spelling
    assert str(parse_spec("fp8-e4m3")) == "fp8-e4m3:channel"
    assert str(parse_spec("int4")) == "int4:group128"
    assert str(parse_spec("int8")) == "int8:channel"


@pytest.mark.parametrize("spec,message", [
    ("fp9", "valid kinds: fp8-e4m3"), ("fp8-e4m3:row", "valid: tensor, channel, block128"),
    ("noise:abc", "noise:0.01"), ("noise:-1", "≥ 0"), ("int4:group0", "groupN"),
    ("dtype:fp64", "valid: bf16, fp16"), ("bnb-int8:x", "takes no options"),
    ("quanto-int2", "valid kinds"), ("quanto-int8:w8", "only the option a8"), ("stale:1", "'stale' is not a perturbation kind: weights K steps old"),
    ("", "valid kinds"), ("fp8-e4m3:tensor,channel", "one scale"),
    ("engine:llama.cpp", "'engine' is not a perturbation kind: another engine"),
])
def test_bad_specs(spec, message):
    with pytest.raises(InputError, match=message) as info:
        parse_spec(spec)
    assert "\n" not in str(info.value)


def test_every_kind_is_registered_in_order():
    assert KINDS == ("fp8-e4m3", "fp8-e5m2", "int8", "int4", "int3", "int2", "dtype", "noise", "bnb-int8", "bnb-nf4",
                     "bnb-fp4", "quanto-int8", "quanto-int4", "quanto-fp8")
    assert {spec.partition(":")[0] for spec in CANONICAL} == set(KINDS)
