"""Probes: per-token and per-layer divergence of a candidate against a reference (`core`), and probe runs
as a library verb, one reference against many candidates written to a results dataset (`runs`)."""

from mismatch.model.external import ExternalLM
from mismatch.probes.core import ProbeResult, Reference, probe, reference

__all__ = ["ExternalLM", "ProbeResult", "Reference", "probe", "reference"]
