"""Rollout cost of a configuration relative to synchronous rollouts in the model's own precision.

Each factor is shown on its own; all are *analytic* (computed from the model's shapes and the
format's stored bits, not timed):

* `weight_bytes`: bytes of weights read per decoded token (decoding is memory-bound: every weight is
  read once per step), the rollout copy's ÷ the model's. Quantized linears count their format's
  stored bits per weight (scales included); everything else (norms, embeddings, the output head
  unless quantized, modules a recipe keeps) stays at the model's precision. The input embedding
  reads one row per token and is left out of both sides. A mixture-of-experts block reads only the
  experts its router picks: top-k of E, so each experts module counts k/E of its tensors (quantized
  or not), and its router in full.
* `matmul_cost`: linear-layer FLOPs weighted by the precision they run at, ÷ the model's: formats that
  quantize activations too (`fp8-…,w8a8`, `quanto-…:a8`, `bnb-int8`) multiply at 8 bits, lower float
  dtypes at their width, weight-only formats de-quantize and multiply at the model's precision; the
  cost of a FLOP is taken proportional to its bit width (the tensor-core peak ratio of current GPUs).
  Experts count their active share k/E of FLOPs, routers their full matmul.
* `rollouts_generated`: with `reuse:R` a batch is trained on R times, so 1/R of the steps generate.
* `staleness`: a lag of K ≥ 1 lets generation overlap training. It saves wall clock, not FLOPs or
  bytes: a step takes max(rollout, rest) instead of rollout + rest, for a given `rollout_share` of
  the synchronous step (default 0.51: SmolLM2-135M OPD here, rollout 10.9 s of 21.3 s).

Totals: `rollout_cost` = weight_bytes × rollouts_generated (decode time per trained step, memory-bound);
`step_wall` = the synchronous step's wall time with that rollout cost and the overlap staleness allows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from typing import TYPE_CHECKING

from mismatch.errors import InputError
from mismatch.perturb import parse_spec
from mismatch.perturb.configs import BnbConfig, DtypeConfig, FP8Config, QuantoConfig
from mismatch.rollout.spec import RolloutSpec

if TYPE_CHECKING:
    from torch import nn

ROLLOUT_SHARE = 0.51  # SmolLM2-135M OPD step here: rollout 10.9 s of 21.3 s (benchmarks/bench_opd.py)


@dataclass
class Cost:
    """Analytic rollout-cost factors (module docstring); every factor is relative to 1 = synchronous
    rollouts in the model's own precision."""

    spec: str
    reference_bits: float
    weight_bytes: float
    matmul_cost: float
    rollouts_generated: float
    staleness: int
    rollout_share: float
    rollout_cost: float
    step_wall: float
    label: str = "analytic"

    def to_dict(self) -> dict:
        return asdict(self)


def matmul_bits(config, reference_bits: float) -> float:
    """The bit width a format's linear layers multiply at (module docstring)."""
    if isinstance(config, FP8Config) and config.w8a8 or isinstance(config, QuantoConfig) and config.activations:
        return 8.0
    if isinstance(config, BnbConfig) and config.method == "int8":
        return 8.0
    if isinstance(config, DtypeConfig):
        return 16.0
    return reference_bits


def rollout_cost(model: nn.Module, spec: str | None, layers: str = "linear", *, kept: list[str] | tuple[str, ...] = (),
                 staleness: int = 0, reuse: int = 1, rollout_share: float = ROLLOUT_SHARE) -> Cost:
    """Analytic cost of rollouts from `model` under `spec` on `layers` minus the `kept` modules.

    Args:
        model: the policy (its parameters' dtype is the reference precision).
        spec, layers: the rollout format and its scope (None, `none` or `noise:…`: a full-precision
            copy, weight bytes ×1); `kept`: modules a recipe keeps in high precision.
        staleness, reuse: the pipeline's lag K and reuse R.
        rollout_share: share of a synchronous OPD step spent generating (0 < share < 1).

    Returns:
        A `Cost` (factors relative to synchronous rollouts in the model's precision).
    """
    if spec is not None and RolloutSpec.parse(spec).source in ("stale", "reuse"):
        raise InputError(f"{spec}: give staleness and reuse as staleness=K / reuse=R")
    config = parse_spec(spec) if spec not in (None, "none", "") else None
    bits = getattr(config, "weight_bits", None)  # None: full-precision weights (clean, noise)
    if not 0 < rollout_share < 1:
        raise InputError(f"rollout_share must lie in (0, 1), got {rollout_share}")
    if staleness < 0 or reuse < 1:
        raise InputError(f"need staleness ≥ 0 and reuse ≥ 1, got {staleness}, {reuse}")
    ref_bits = float(next(model.parameters()).element_size() * 8)
    if bits is None:
        return assemble_cost(str(config) if config else "none", ref_bits, 1.0, 1.0, staleness, reuse, rollout_share)
    from mismatch.model.moe import moe_blocks  # reading a model's modules needs torch; costing a row does not
    from mismatch.perturb import select
    from mismatch.perturb.scope import head_name
    from mismatch.perturb.snapshot import weight_names

    modules = dict(model.named_modules())
    quantized = [n for n in select(model, layers) if n not in set(kept)]
    moes = moe_blocks(model)
    matmuls = [*select(model, "all"), *(moe.router for moe in moes)]  # every weight a decoded token multiplies
    active = {moe.experts: moe.top_k / moe.num_experts for moe in moes}  # share of an experts module a token reads
    embed = model.get_input_embeddings()
    head = modules[head_name(model)]
    tied = head.weight is embed.weight
    # every parameter once (a tied head is the embedding); an untied input embedding reads one row per token;
    # the experts a token's router does not pick are not read
    total = sum(p.numel() for p in model.parameters() if tied or p is not embed.weight)
    total -= sum((1 - share) * sum(p.numel() for p in modules[n].parameters()) for n, share in active.items())

    def per_token(name: str) -> float:
        """Weight elements of module `name` a decoded token reads (and multiplies)."""
        return sum(getattr(modules[name], a).numel() for a in weight_names(modules[name])) * active.get(name, 1)

    q_params = sum(per_token(n) for n in quantized)
    ref_bytes = total * ref_bits / 8
    cand_bytes = (total - q_params) * ref_bits / 8 + q_params * bits / 8
    flops_params = {n: per_token(n) for n in matmuls}
    mm_bits = matmul_bits(config, ref_bits)
    all_flops = sum(flops_params.values())
    matmul = (sum(v for n, v in flops_params.items() if n not in quantized)
              + sum(flops_params[n] for n in quantized) * mm_bits / ref_bits) / all_flops
    return assemble_cost(str(config), ref_bits, cand_bytes / ref_bytes, matmul, staleness, reuse, rollout_share)


def assemble_cost(spec: str, ref_bits: float, weight_bytes: float, matmul: float, staleness: int, reuse: int,
                  rollout_share: float) -> Cost:
    """The totals from the model-dependent factors (`weight_bytes`, `matmul` relative to the model's
    precision of `ref_bits`) and the pipeline's lag, reuse and rollout share (module docstring)."""
    generated = 1.0 / reuse
    cost = weight_bytes * generated
    rollout, rest = rollout_share * cost, 1.0 - rollout_share
    wall = max(rollout, rest) if staleness >= 1 else rollout + rest
    return Cost(spec=spec, reference_bits=ref_bits, weight_bytes=weight_bytes, matmul_cost=matmul,
                rollouts_generated=generated, staleness=staleness, rollout_share=rollout_share,
                rollout_cost=cost, step_wall=wall)


# what an OPD run's rows carry so that reports cost it without a model (written beside the provenance)
COST_FACTOR_COLUMNS = ("cost_reference_bits", "cost_weight_bytes", "cost_matmul")


def cost_factors(model: nn.Module, spec: str | None, layers: str = "linear") -> dict[str, float]:
    """The model-dependent factors of `rollout_cost` (`COST_FACTOR_COLUMNS`) for a rollout copy under the
    perturbation `spec` on `layers` (None: the student's own weights): what `assemble_cost` needs besides
    the pipeline's lag, reuse and rollout share. `model` may be on the meta device (shapes only)."""
    c = rollout_cost(model, spec, layers)
    return dict(zip(COST_FACTOR_COLUMNS, (c.reference_bits, c.weight_bytes, c.matmul_cost)))


REAL_KERNELS = (BnbConfig, QuantoConfig)  # formats with kernels of their own; torch-native ones run fake-quantized


def has_real_kernels(config) -> bool:
    """The format runs kernels of its own (bitsandbytes, optimum-quanto, FP8 on `torch._scaled_mm`), so its
    generation speed says something about an engine's; a fake-quantized one runs the reference's kernels."""
    return isinstance(config, REAL_KERNELS) or isinstance(config, FP8Config) and config.scaled_mm


def generation_speed(lm, spec: str | None, prompts: list[str], *, max_new_tokens: int = 64, layers: str = "linear",
                     seed: int = 0, device: str = "cuda") -> dict[str, float]:
    """Measured generation speed of `lm` (under `spec`, None: as it is) on `device`: `tokens` generated
    (response tokens, EOS included), `seconds` of `generate` (after one warm-up call), `tokens_per_s`.

    Only formats with kernels of their own (`has_real_kernels`: bitsandbytes, optimum-quanto, `…,scaled_mm`) say anything
    about a real engine's speed; torch-native formats here are fake-quantized and run the reference's
    kernels. The model is moved to `device` and back.
    """
    import contextlib
    import time

    import torch

    from mismatch.model.device import model_device
    from mismatch.model.loader import LM
    from mismatch.perturb import perturbed
    from mismatch.model.generate import generate

    home = model_device(lm.model)
    lm.model.to(device)
    try:
        ctx = perturbed(lm.model, spec, layers=layers, seed=seed) if spec else contextlib.nullcontext(lm.model)
        with ctx as model:
            cand = LM(model, lm.tokenizer, lm.name)
            generate(cand, prompts[:1], max_new_tokens=4, temperature=1.0, seed=seed)  # warm-up
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            batch = generate(cand, prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
    finally:
        lm.model.to(home)
    return {"tokens": float(batch.response_tokens), "seconds": seconds, "tokens_per_s": batch.response_tokens / seconds}


def measured_cost(lm, spec: str, prompts: list[str], *, layers: str = "linear", seed: int = 0) -> dict | None:
    """Where CUDA is present and `spec` has kernels of its own: measured generation tokens/s of the
    model and of its rollout copy, and their ratio as the measured `rollout_cost` factor (label
    `measured`); None otherwise."""
    import torch

    if not torch.cuda.is_available() or not has_real_kernels(parse_spec(spec)):
        return None
    ref = generation_speed(lm, None, prompts, layers=layers, seed=seed)
    cand = generation_speed(lm, spec, prompts, layers=layers, seed=seed)
    return {"label": "measured", "device": torch.cuda.get_device_name(), "reference_tokens_per_s": ref["tokens_per_s"],
            "rollout_tokens_per_s": cand["tokens_per_s"], "rollout_cost": ref["tokens_per_s"] / cand["tokens_per_s"]}
