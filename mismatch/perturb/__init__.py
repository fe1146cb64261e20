"""Mismatch sources: perturbation specs and their kind registry, layer scopes, torch-native
rounding, bitsandbytes and optimum-quanto modules, noise; applied in place and restored exactly
(see `apply`).

The names below load on first use (PEP 562), so `mismatch.perturb.spec` — the grammar every command
validates its arguments with — imports without torch; `perturb_`, `select` and the rest bring it in."""

from __future__ import annotations

import importlib

_HOMES = {"Snapshot": "apply", "active_perturbations": "apply", "is_perturbed": "apply", "perturb_": "apply",
          "perturbed": "apply", "restore_": "apply", "render_spec_table": "registry", "select": "scope",
          "KINDS": "spec", "PerturbConfig": "spec", "parse_spec": "spec"}

__all__ = ["Snapshot", "perturb_", "perturbed", "restore_", "select", "KINDS", "PerturbConfig", "parse_spec",
           "active_perturbations", "is_perturbed", "render_spec_table"]


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(f"mismatch.perturb.{_HOMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mismatch.perturb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
