"""Perturbation specs: `KIND[:OPT[,OPT…]]` strings parsed into frozen configs through the registry.

`parse_spec` splits a spec, looks its kind up in `mismatch.perturb.registry` and lets that kind's
config class parse the options; `str(config)` round-trips and `dataclasses.asdict(config)` gives
result columns. The built-in kinds are registered in `kinds` (imported here; torch-free, their handlers
in `native` and `backends` load on first use). Every kind can
be applied to a model in place; what cannot (staleness, reuse, another engine) is a rollout form
(`mismatch.rollout.spec`). `render_spec_table()` lists the kinds (the docs' spec table).
"""

from __future__ import annotations

from mismatch.errors import InputError
from mismatch.perturb import kinds  # noqa: F401  (importing it registers the built-in kinds)
from mismatch.perturb.configs import (
    FP8_GRANULARITIES,
    BnbConfig,
    DtypeConfig,
    FP8Config,
    IntConfig,
    NoiseConfig,
    PerturbConfig,
    QuantoConfig,
    SpecText,
)
from mismatch.perturb.registry import kind_named, kind_names, valid_kinds

__all__ = ["FP8_GRANULARITIES", "KINDS", "BnbConfig", "DtypeConfig", "FP8Config", "IntConfig", "NoiseConfig",
           "PerturbConfig", "QuantoConfig", "parse_spec"]

KINDS: tuple[str, ...] = kind_names()  # the spec names registered above, in registration order


def parse_spec(spec: str) -> PerturbConfig:
    """Parse a perturbation spec string into its frozen config.

    Args:
        spec: `KIND[:OPT[,OPT…]]`, e.g. `fp8-e4m3:block128,w8a8` (see `render_spec_table()`).

    Returns:
        The kind's frozen config; `str()` of it is the canonical spec.

    Raises:
        InputError: empty spec, unknown kind or option (one line, naming the valid ones).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"empty perturbation spec; valid kinds: {valid_kinds()}")
    text = SpecText.split(spec)
    return kind_named(text.kind).parse(text)
