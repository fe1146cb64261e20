"""Mismatch sources: perturbation specs and their kind registry, layer scopes, torch-native
rounding, bitsandbytes and optimum-quanto modules, noise; applied in place and restored exactly
(see `apply`)."""

from mismatch.perturb.apply import Snapshot, active_perturbations, is_perturbed, perturb_, perturbed, restore_
from mismatch.perturb.registry import render_spec_table
from mismatch.perturb.scope import select
from mismatch.perturb.spec import KINDS, PerturbConfig, parse_spec

__all__ = ["Snapshot", "perturb_", "perturbed", "restore_", "select", "KINDS", "PerturbConfig", "parse_spec",
           "active_perturbations", "is_perturbed", "render_spec_table"]
