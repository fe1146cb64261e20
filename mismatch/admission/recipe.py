r"""Mixed-precision rollout recipes: the fewest modules to keep in high precision so that a rejected
rollout format passes the admission check, and their export to vLLM and llm-compressor.

Search (on the check's own calibration batch and reference pass):
1. the isolation map: the format applied to one decoder block at a time, each block's exact
   KL(rollout ‖ model) per token (`kl_rev_mean` of `mismatch.probe`);
2. within the worst blocks (the fewest holding half the summed isolated KL, at most `MAX_REFINED`),
   each module group on its own. A group is what an engine fuses into one matrix and must quantize
   alike: q/k/v projections, gate/up projections, a block's MoE experts module (vLLM's one `FusedMoE`
   layer: every expert of the block), every other linear (or router) alone;
3. units (a refined group, or a whole other block) are kept greedily by isolated KL per parameter
   kept, until the KL predicted for the rest (the full format's KL scaled by the share of summed
   isolated KL left) falls to `TARGET_SHARE` of the limit;
4. the recipe is verified by running the whole check again with the format on the remaining modules
   (fresh samples from that rollout copy): the verification decides. While it does not admit, the
   prediction is rescaled to the verified value, units are kept until it reaches the target again
   (at least one more), and the check runs again.

Exports name modules as each tool does. vLLM's `ignored_layers` holds module prefixes of vLLM's own
model: a `FusedMoE` layer `model.layers.i.mlp.experts` is skipped when an ignored name containing
`experts` contains its prefix (`quant_utils.is_layer_skipped`), and Mixtral's vLLM model keeps the
checkpoint's `block_sparse_moe` where transformers ≥ 5 says `mlp` (`VLLM_RENAMES`). llm-compressor
matches names of the transformers model (`compressed_tensors` `match_name`: exact, or `re:` with
`re.match`); its MoE calibration unfuses each experts module into per-expert `nn.Linear`s
(`…experts.<e>.gate_proj`), so a kept experts module is `re:<name>(\.|$)`. Routers stay in full
precision unless the scope quantizes them: both lists name them then too (llm-compressor as its MoE
examples do, `re:.*mlp\.gate$`; vLLM builds Qwen3-MoE's and Mixtral's routers unquantized anyway).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from mismatch.model.layout import model_layout
from mismatch.model.loader import LM
from mismatch.model.moe import moe_blocks
from mismatch.perturb import parse_spec, select
from mismatch.perturb.scope import block_modules, head_name
from mismatch.perturb.snapshot import weight_names
from mismatch.probes.runs import probe_candidates
from mismatch.model.generate import Batch

FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"), ("query", "key", "value"))
MAX_REFINED = 4  # blocks whose module groups are measured one by one
TARGET_SHARE = 0.5  # keep units until the predicted KL is this share of the limit
MAX_VERIFICATIONS = 8
HIGH_PRECISION_BITS = 16.0  # what an engine keeps an unquantized layer in (bf16)
# transformers ≥ 5 module name → vLLM's, by `config.model_type` (vLLM's Mixtral keeps the checkpoint's
# `block_sparse_moe`; transformers' conversion mapping renames it `mlp`)
VLLM_RENAMES = {"mixtral": ((".mlp.", ".block_sparse_moe."),)}


@dataclass
class Recipe:
    """Modules kept in high precision, how to reproduce the rollout copy, and its exports."""

    spec: str
    kept: list[str]  # module names kept in high precision (fused groups whole)
    layers: str | None  # the mismatch layer scope (regex) of the quantized modules: `perturbed(model, spec,
    # layers=…)`; None when every module is kept (nothing is quantized: roll out with the model itself)
    vllm_ignored_layers: list[str]
    llmcompressor_ignore: list[str]
    kept_fraction: float  # share of the scope's linear weights kept in high precision
    bits_per_weight: float  # effective stored bits per linear weight of the scope
    verified_status: str  # the check's status with the recipe applied
    verified_value: float  # the gate statistic with the recipe applied
    isolation: dict[str, float] = field(default_factory=dict)  # block or group -> isolated kl_rev_mean
    verifications: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


Say = Callable[[str], None]  # a progress line


def _silent(_message: str) -> None:
    pass


def module_groups(names: list[str]) -> list[list[str]]:
    """`names` (module order) grouped as an engine fuses them: q/k/v together, gate/up together."""
    groups: dict[str, list[str]] = {}
    for name in names:
        parent, _, leaf = name.rpartition(".")
        fused = next((f for f in FUSED if leaf in f), None)
        key = f"{parent}.{'+'.join(fused)}" if fused else name
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def exact_scope(names: list[str]) -> str:
    """A layer-scope regex selecting exactly `names`."""
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$"


def _params(model, names: list[str]) -> int:
    """Weight elements of the modules `names` (every expert of an experts module)."""
    modules = dict(model.named_modules())
    return sum(getattr(modules[n], a).numel() for n in names for a in weight_names(modules[n]))


def vllm_name(model, name: str) -> str:
    """The module `name` as vLLM's model names it (`VLLM_RENAMES`)."""
    for old, new in VLLM_RENAMES.get(getattr(model.config, "model_type", ""), ()):
        name = name.replace(old, new)
    return name


def exports(model, kept: list[str], quantized: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """`(vllm_ignored_layers, llmcompressor_ignore)` for modules kept in high precision, plus the MoE
    routers outside `quantized` (the modules the rollout format is on), in each tool's spelling (module
    docstring). vLLM gets exact names (it matches a fused layer's prefix only when all its shards are
    listed, which the fused groups guarantee); llm-compressor's list always holds the output head, which
    it never quantizes."""
    head, moes = head_name(model), moe_blocks(model)
    experts = {moe.experts for moe in moes}
    full = [moe for moe in moes if moe.router not in set(quantized) and moe.router not in set(kept)]
    vllm = [vllm_name(model, n) for n in [*kept, *(moe.router for moe in full)]]
    if full and len(full) == len(moes):  # every router in full precision: one pattern per path in a block
        paths = dict.fromkeys(moe.router.split(f".{moe.index}.", 1)[1] for moe in full)  # e.g. mlp.gate
        llmc_routers = [f"re:.*{re.escape(p)}$" for p in paths]
    else:
        llmc_routers = [moe.router for moe in full]
    llmc_kept = [f"re:{re.escape(n)}(\\.|$)" if n in experts else n for n in kept if n != head]
    return vllm, [head, *llmc_routers, *llmc_kept]


def _units(lm: LM, spec: str, batch: Batch, by_block: dict[int, list[str]], seed: int, say: Say = _silent
           ) -> tuple[list[tuple[float, list[str]]], dict[str, float]]:
    """Steps 1–2: `(units, isolation)`: every unit (a module group of the worst blocks, or a whole
    other block) with its isolated KL, and the isolation numbers by block / group."""
    block_ids = sorted(by_block)
    say(f"recipe: {spec} on each of {len(block_ids)} blocks alone")
    iso = [r.result.summary["kl_rev_mean"] for r in probe_candidates(
        lm, batch, [spec], [exact_scope(by_block[b]) for b in block_ids], per_layer=False, seed=seed)]
    isolation = {f"block {b}": e for b, e in zip(block_ids, iso)}
    total, refined, acc = sum(max(e, 0.0) for e in iso), [], 0.0
    for i in sorted(range(len(block_ids)), key=lambda i: -iso[i])[:MAX_REFINED]:
        if acc >= 0.5 * total and refined:
            break
        refined.append(block_ids[i])
        acc += max(iso[i], 0.0)
    units: list[tuple[float, list[str]]] = []
    for b, e in zip(block_ids, iso):
        if b not in refined:
            units.append((e, by_block[b]))
            continue
        groups = module_groups(by_block[b])
        say(f"recipe: {spec} on each module group of block {b} alone")
        res = probe_candidates(lm, batch, [spec], [exact_scope(g) for g in groups], per_layer=False, seed=seed)
        for g, r in zip(groups, res):
            units.append((r.result.summary["kl_rev_mean"], g))
            isolation[" + ".join(g)] = r.result.summary["kl_rev_mean"]
    return units, isolation


def _keep_and_verify(names: list[str], units: list[tuple[float, list[str]]], full_kl: float, limit: float,
                     verify, say: Say = _silent) -> tuple[list[str], str, float, int]:
    """Steps 3–4: `(kept, status, value, verifications)` (units sorted by priority)."""
    unit_total = sum(max(e, 0.0) for e, _ in units) or 1.0
    kept: list[str] = []
    state = {"left": unit_total, "i": 0, "scale": full_kl / unit_total}  # predicted KL per unit of isolated KL left

    def keep_next() -> None:
        state["left"] -= max(units[state["i"]][0], 0.0)
        kept.extend(units[state["i"]][1])
        state["i"] += 1

    def keep_until(target: float) -> None:
        while state["i"] < len(units) and state["scale"] * state["left"] > target:
            keep_next()

    keep_until(TARGET_SHARE * limit)
    status, value, tries = "uncertain", math.nan, 0
    while True:
        rest = [n for n in names if n not in kept]
        if not rest:
            return kept, "admit", 0.0, tries  # everything kept: the reference itself
        say(f"recipe: verification {tries + 1} (at most {MAX_VERIFICATIONS}), {len(kept)} modules kept")
        status, value = verify(exact_scope(rest))
        tries += 1
        if status == "admit" or state["i"] >= len(units) or tries >= MAX_VERIFICATIONS:
            return kept, status, value, tries
        if state["left"] > 0 and value > 0:  # rescale the prediction to what was verified
            state["scale"] = value / state["left"]
        keep_next()
        keep_until(TARGET_SHARE * limit)


def search_recipe(lm: LM, spec: str, batch: Batch, scope: str, limit: float, verify, *, seed: int = 0,
                  baseline: tuple[str, float] | None = None, progress: Say | None = None) -> Recipe:
    """Search the modules to keep in high precision (module docstring).

    Args:
        lm: the model (reference precision); `batch`: the check's calibration batch.
        spec, scope: the rollout format and its layer scope.
        limit: the gate's limit (nats per token for `mismatch_kl`).
        verify: `verify(layers) -> (status, value)`: the check with the format on `layers`.
        baseline: the check's own `(status, value)` for the whole scope; when given and the format's
            KL already lies under the target, nothing is mapped or kept and it is the verification.
        progress: `progress(message)` at each stage of the search (the blocks isolated, a verification).

    Returns:
        The verified `Recipe` (`verified_status` is the check's status of the last verification).
    """
    say = progress or _silent
    model, spec = lm.model, str(parse_spec(spec))
    names = select(model, scope)
    blocks, n_blocks = block_modules(model), len(model_layout(model).layers)
    by_block: dict[int, list[str]] = {}
    for n in names:
        by_block.setdefault(blocks[n][0] if n in blocks else n_blocks, []).append(n)
    full_kl = probe_candidates(lm, batch, [spec], [exact_scope(names)], per_layer=False,
                               seed=seed)[0].result.summary["kl_rev_mean"]
    units, isolation = [], {}
    if full_kl > TARGET_SHARE * limit or baseline is None:  # something may have to stay: map it
        units, isolation = _units(lm, spec, batch, by_block, seed, say)
        units.sort(key=lambda u: -max(u[0], 0.0) / _params(model, u[1]))
    if units or baseline is None:
        kept, status, value, tries = _keep_and_verify(names, units, full_kl, limit, verify, say)
    else:  # the format as given already sits far under the limit: the check itself was the verification
        (status, value), kept, tries = baseline, [], 0
    kept = [n for n in names if n in set(kept)]  # model order
    rest = [n for n in names if n not in set(kept)]
    frac = _params(model, kept) / _params(model, names)
    bits = getattr(parse_spec(spec), "weight_bits", math.nan)
    vllm, llmc = exports(model, kept, rest)
    layers = scope if not kept else exact_scope(rest) if rest else None
    return Recipe(spec=spec, kept=kept, layers=layers, vllm_ignored_layers=vllm,
                  llmcompressor_ignore=llmc, kept_fraction=frac,
                  bits_per_weight=frac * HIGH_PRECISION_BITS + (1 - frac) * bits, verified_status=status,
                  verified_value=value, isolation=isolation, verifications=tries)
