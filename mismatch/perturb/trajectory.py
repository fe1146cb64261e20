"""Perturbation kinds that exist only inside an OPD trajectory: `stale:K` and `reuse:R`.

They parse like every other kind, so a rollout spec is validated at the edge, but cannot be
applied to a model in place: the OPD rollout copy (`mismatch.opd.ring`) realises staleness by
serving weights K optimizer steps old, and the OPD loop (`mismatch.opd.trainer`) realises reuse by
training on one rollout batch for R consecutive steps. Their handler is a clear error pointing there.
"""

from __future__ import annotations

from torch import nn

from mismatch.errors import InputError
from mismatch.perturb.configs import ReuseConfig, StaleConfig
from mismatch.perturb.registry import ApplyContext, Backend, Kind, register_kind
from mismatch.perturb.snapshot import Snapshot


def _refuse(config: StaleConfig | ReuseConfig, model: nn.Module, names: list[str], snap: Snapshot,
            ctx: ApplyContext) -> None:
    what = ("weights K optimizer steps old" if isinstance(config, StaleConfig)
            else "one rollout batch trained on for R optimizer steps")
    raise InputError(f"{config} exists only inside an OPD trajectory ({what}); use it as the rollout spec of an OPD run")


register_kind(Kind(
    names=("stale",), config=StaleConfig, parse=StaleConfig.from_spec, apply=_refuse,
    backend=Backend.OPD, usage=("stale:K",),
    description="parsed here; weights K optimizer steps old exist only inside an OPD run (the rollout copy's ring)",
    examples=("stale:0", "stale:4")))
register_kind(Kind(
    names=("reuse",), config=ReuseConfig, parse=ReuseConfig.from_spec, apply=_refuse,
    backend=Backend.OPD, usage=("reuse:R",),
    description="parsed here; one rollout batch trained on for R consecutive optimizer steps (R = 1: clean) "
                "exists only inside an OPD run",
    examples=("reuse:1", "reuse:4")))
