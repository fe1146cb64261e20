"""The registry of perturbation kinds: spec names → config class → handler, registered once each.

Modelled on torchao's `register_quantize_module_handler` (config type → module handler) and
lm-eval's `api/registry.py`. A `Kind` bundles everything about one kind: its spec name(s), frozen
config class, parser, apply handler, backend and a one-line description. `parse_spec`, the
unknown-kind error, `perturb_`'s dispatch and the docs' spec table (docs/design.md) (`render_spec_table`) all read
it, so adding a kind is one `register_kind` call (the built-in kinds' are in `mismatch.perturb.kinds`).

The grammar side (names, config, parser) imports no torch: a handler may be named as `"module:function"`
and is imported only when a perturbation is applied (`Kind.handler`), so a spec is validated — and a CLI
typo answered — before torch and transformers load.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from mismatch.errors import InputError
from mismatch.perturb.configs import PerturbConfig, SpecText

if TYPE_CHECKING:  # the grammar never needs torch; handlers do, and import it themselves
    import torch
    from torch import nn

    from mismatch.perturb.snapshot import Snapshot


class Backend(StrEnum):
    """What runs a kind."""

    TORCH = "torch"
    BITSANDBYTES = "bitsandbytes"
    QUANTO = "optimum-quanto"


@dataclass(frozen=True, kw_only=True)
class ApplyContext:
    """What a handler may need beyond the config: `seed` of the noise generator, and `[B, T]`
    token ids `calibration_ids` to calibrate static activation scales (`quanto-…:a8`)."""

    seed: int = 0
    calibration_ids: torch.Tensor | None = None


# handler(config, model, selected module names, snapshot to record originals in, context)
Handler = Callable[[Any, "nn.Module", list[str], "Snapshot", ApplyContext], None]


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One registered perturbation kind.

    Attributes:
        names: the `KIND` part(s) of its specs, e.g. `("bnb-int8", "bnb-nf4", "bnb-fp4")`.
        config: its frozen config class; `perturb_` dispatches on `type(config)`.
        parse: `SpecText` → config (raises `InputError` naming the valid options).
        apply: the handler, or its `"module:function"` name (imported on first use: `handler`); it
            perturbs the selected modules in place, recording originals.
        backend: what runs it.
        usage: the spec forms shown in the docs table (`|` separates alternatives).
        description: one line for the docs table.
        examples: canonical specs (each round-trips through `parse_spec`; tests use them).
    """

    names: tuple[str, ...]
    config: type
    parse: Callable[[SpecText], PerturbConfig]
    apply: Handler | str
    backend: Backend
    usage: tuple[str, ...]
    description: str
    examples: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names or not self.examples or not self.usage:
            raise ValueError(f"kind {self.config.__name__}: names, usage and examples must not be empty")
        if "\n" in self.description or not self.description.strip():
            raise ValueError(f"kind {self.names[0]}: the description must be one non-empty line")
        if isinstance(self.apply, str) and self.apply.count(":") != 1:
            raise ValueError(f"kind {self.names[0]}: a handler name is 'module:function', got {self.apply!r}")

    @property
    def handler(self) -> Handler:
        """The apply handler (a named one imported now: torch and the backend's library load here)."""
        if not isinstance(self.apply, str):
            return self.apply
        module, _, name = self.apply.partition(":")
        return getattr(importlib.import_module(module), name)


# rollout forms that are not perturbations (`mismatch.rollout.spec` parses them): what realises each
ROLLOUT_ONLY = {"stale": "weights K steps old exist only inside an OPD run (its rollout copy's ring)",
                "reuse": "one batch trained on for R steps exists only inside an OPD run",
                "resample": "another sampling stream of the student itself exists only inside an OPD run",
                "engine": "another engine runs the model (a probe candidate or an OPD rollout source)"}

_BY_NAME: dict[str, Kind] = {}
_BY_CONFIG: dict[type, Kind] = {}


def register_kind(kind: Kind) -> Kind:
    """Register `kind` under each of its names and its config class; returns it.

    Raises:
        ValueError: one of its names or its config class is already registered.
    """
    taken = [name for name in kind.names if name in _BY_NAME]
    if taken:
        raise ValueError(f"perturbation kind {taken[0]!r} is already registered "
                         f"(config {_BY_NAME[taken[0]].config.__name__})")
    if kind.config in _BY_CONFIG:
        raise ValueError(f"config {kind.config.__name__} is already registered "
                         f"(kind {_BY_CONFIG[kind.config].names[0]!r})")
    for name in kind.names:
        _BY_NAME[name] = kind
    _BY_CONFIG[kind.config] = kind
    return kind


def registered_kinds() -> tuple[Kind, ...]:
    """Every registered kind once: by backend (in `Backend`'s order), then in registration order
    (so the order does not depend on which implementing module was imported first)."""
    backends = list(Backend)
    return tuple(sorted(_BY_CONFIG.values(), key=lambda kind: backends.index(kind.backend)))


def kind_names() -> tuple[str, ...]:
    """Every registered spec name, in the order of `registered_kinds()`."""
    return tuple(name for kind in registered_kinds() for name in kind.names)


def valid_kinds() -> str:
    """The registered spec names as one comma-separated line, for error messages."""
    return ", ".join(kind_names())


def kind_named(name: str) -> Kind:
    """The kind registered under spec name `name`.

    Raises:
        InputError: no such kind; the message lists the valid ones.
    """
    if name in ROLLOUT_ONLY:
        raise InputError(f"{name!r} is not a perturbation kind: {ROLLOUT_ONLY[name]}, outside PyTorch's model in "
                         f"place (a rollout form, `mismatch.rollout.spec`); valid kinds: {valid_kinds()}")
    if name not in _BY_NAME:
        raise InputError(f"unknown perturbation kind {name!r}; valid kinds: {valid_kinds()}")
    return _BY_NAME[name]


def kind_of(config: object) -> Kind:
    """The kind whose config class is exactly `type(config)`.

    Raises:
        TypeError: `config` is not a registered perturbation config.
    """
    try:
        return _BY_CONFIG[type(config)]
    except KeyError:
        raise TypeError(f"{type(config).__name__} is not a registered perturbation config; "
                        f"registered: {', '.join(c.__name__ for c in _BY_CONFIG)}") from None


def render_spec_table() -> str:
    """The docs' perturbation spec table (docs/design.md) (markdown, one row per registered kind), from the registry.

    Returns:
        The table's lines joined by newlines, without a trailing newline.
    """
    lines = ["| spec | backend | what runs |", "|---|---|---|"]
    for kind in registered_kinds():
        forms = ", ".join(f"`{form}`".replace("|", "\\|") for form in kind.usage)
        lines.append(f"| {forms} | {kind.backend} | {kind.description} |")
    return "\n".join(lines)
