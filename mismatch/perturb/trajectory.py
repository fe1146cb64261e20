"""Perturbation kinds that exist only inside an OPD trajectory: `stale:K` (room for `reuse:R`).

They parse like every other kind, so a rollout spec is validated at the edge, but cannot be
applied to a model in place: the OPD rollout copy (`mismatch.opd.ring`) realises staleness by
serving weights K optimizer steps old. Their handler is a clear error pointing there.
"""

from __future__ import annotations

from torch import nn

from mismatch.errors import InputError
from mismatch.perturb.configs import StaleConfig
from mismatch.perturb.registry import ApplyContext, Backend, Kind, register_kind
from mismatch.perturb.snapshot import Snapshot


def _refuse_stale(config: StaleConfig, model: nn.Module, names: list[str], snap: Snapshot,
                  ctx: ApplyContext) -> None:
    raise InputError(f"{config} exists only inside an OPD trajectory (weights K optimizer steps old); "
                     "use it as the rollout spec of an OPD run")


register_kind(Kind(
    names=("stale",), config=StaleConfig, parse=StaleConfig.from_spec, apply=_refuse_stale,
    backend=Backend.OPD, usage=("stale:K",),
    description="parsed here; weights K optimizer steps old exist only inside an OPD run (the rollout copy's ring)",
    examples=("stale:0", "stale:4")))
