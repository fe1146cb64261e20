"""The perturbation kind run by another inference engine: `engine:llama.cpp[,WEIGHTS][,kv-f32]`.

It parses like every other kind, so probe and OPD specs are validated at the edge, but it cannot be
applied to a PyTorch model in place: the model is exported to the engine (`mismatch.engines`), whose
logits enter the probes as a candidate (`mismatch.probes.core.ExternalLM`) and whose samples enter OPD as
the rollout copy. Its handler is a clear error pointing there.
"""

from __future__ import annotations

import importlib.util

from torch import nn

from mismatch.errors import InputError, ModelNotAvailableError
from mismatch.perturb.configs import EngineConfig
from mismatch.perturb.registry import ApplyContext, Backend, Kind, register_kind
from mismatch.perturb.snapshot import Snapshot


LLAMA_CPP_MISSING = ("llama.cpp is not installed: `make engines` (or pip install 'mismatch[engines]') builds "
                     "llama-cpp-python, ~10 minutes")


def require_engines(specs) -> None:
    """Fail now, before any model runs, when an `engine:` spec among `specs` (strings) names an engine
    that is not installed (looked up, not imported). A config stays valid without it (reports read
    engine runs anywhere); the verbs that would run one call this first. Raises `ModelNotAvailableError`."""
    for spec in specs:
        if spec and spec.partition(":")[0].strip() == "engine" and importlib.util.find_spec("llama_cpp") is None:
            raise ModelNotAvailableError(f"{spec}: {LLAMA_CPP_MISSING}")


def _refuse(config: EngineConfig, model: nn.Module, names: list[str], snap: Snapshot, ctx: ApplyContext) -> None:
    raise InputError(f"{config} runs the model in {config.engine}, outside PyTorch; use it as a probe spec "
                     "(mismatch probe … --perturb) or as an OPD rollout spec")


register_kind(Kind(
    names=("engine",), config=EngineConfig, parse=EngineConfig.from_spec, apply=_refuse,
    backend=Backend.ENGINE, usage=("engine:llama.cpp[,f32|f16|q8_0|q5_0|q5_1|q4_0|q4_1|gguf][,kv-f32]",),
    description="the model exported to GGUF (or its own GGUF file: `gguf`) and run by llama.cpp's CPU kernels, "
                "KV cache f16 unless kv-f32 (needs `make engines`)",
    examples=("engine:llama.cpp,f32", "engine:llama.cpp,q8_0,kv-f32")))
