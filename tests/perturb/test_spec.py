"""Spec strings parse into frozen configs and back; bad specs are one clear line."""

import dataclasses

import pytest

from mismatch.errors import InputError
from mismatch.perturb.spec import KINDS, parse_spec

CANONICAL = ["fp8-e4m3:tensor", "fp8-e4m3:channel", "fp8-e4m3:block128", "fp8-e4m3:channel,w8a8",
             "fp8-e5m2:block128,w8a8", "int8:channel", "int4:group128", "int4:group32", "dtype:bf16",
             "dtype:fp16", "noise:0", "noise:0.03", "bnb-int8", "bnb-nf4", "bnb-fp4", "quanto-int8",
             "quanto-int4", "quanto-fp8:a8", "stale:4"]


@pytest.mark.parametrize("spec", CANONICAL)
def test_round_trip(spec):
    config = parse_spec(spec)
    assert str(config) == spec
    assert parse_spec(str(config)) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, next(iter(dataclasses.asdict(config))), None)
    assert dataclasses.asdict(config)  # flattens to result columns


def test_aliases_and_defaults():
    assert str(parse_spec("quanto-int8,a8")) == "quanto-int8:a8"  # DESIGN.md's spelling
    assert str(parse_spec("fp8-e4m3")) == "fp8-e4m3:channel"
    assert str(parse_spec("int4")) == "int4:group128"
    assert str(parse_spec("int8")) == "int8:channel"


@pytest.mark.parametrize("spec,message", [
    ("fp9", "valid kinds: fp8-e4m3"), ("fp8-e4m3:row", "valid: tensor, channel, block128"),
    ("noise:abc", "noise:0.01"), ("noise:-1", "≥ 0"), ("int4:group0", "groupN"),
    ("dtype:fp64", "valid: bf16, fp16"), ("bnb-int8:x", "takes no options"),
    ("quanto-int2", "valid kinds"), ("quanto-int8:w8", "only the option a8"), ("stale:-1", "≥ 0"),
    ("", "valid kinds"), ("fp8-e4m3:tensor,channel", "one scale"),
])
def test_bad_specs(spec, message):
    with pytest.raises(InputError, match=message) as info:
        parse_spec(spec)
    assert "\n" not in str(info.value)


def test_every_kind_is_documented():
    assert set(KINDS) == {"fp8-e4m3", "fp8-e5m2", "int8", "int4", "dtype", "noise", "bnb-int8", "bnb-nf4",
                          "bnb-fp4", "quanto-int8", "quanto-int4", "quanto-fp8", "stale"}
