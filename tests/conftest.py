"""Shared fixtures: tiny random-init models of three dense and two MoE families and the real SmolLM2."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

import mismatch  # noqa: E402

FAMILIES = ("tiny-llama", "tiny-qwen3", "tiny-gpt2")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (`/proc/cpuinfo`); empty elsewhere."""
    try:
        text = open("/proc/cpuinfo", encoding="ascii", errors="replace").read()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def flash_attention_refuses(capability: str, flags: frozenset[str]) -> bool:
    """Whether torch 2.13's CPU flash attention refuses half-precision inputs here: on a CPU with AMX
    (`amx_bf16`, Sapphire Rapids class) it packs bf16/fp16 operands for AMX's tiles once a sequence reaches
    64 tokens, and that packing (`pack_vnni2`) raises "only supported when avx512 is supported" when
    `ATEN_CPU_CAPABILITY` forces torch's kernels below AVX-512 (`DEFAULT`, `AVX2`), as CI's scalar-kernel
    pass does. A torch limitation of the forced setting, not of the toolkit: the pass then runs half-precision
    attention on SDPA's math kernel (`_attention_on_math_kernel`), so its point — every other kernel, fp32
    attention included, on scalar or AVX2 code: another summation order — holds (`tests/test_kernels_pass.py`
    pins both halves)."""
    return capability in ("DEFAULT", "AVX2") and "amx_bf16" in flags


@pytest.fixture(scope="session", autouse=True)
def _attention_on_math_kernel():
    """On a CPU where `flash_attention_refuses`, bf16 and fp16 attention in this process runs on SDPA's math
    kernel (`sdpa_kernel(MATH)` around each such call: transformers looks `scaled_dot_product_attention` up on
    `torch.nn.functional` at every call). fp32 attention keeps torch's own choice, so its numbers stay those of
    the subprocesses tests start (CLI runs, Ray workers), which compare bit for bit with this process's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    refuses = flash_attention_refuses(torch.backends.cpu.get_cpu_capability(), cpu_flags())
    own = F.scaled_dot_product_attention

    def routed(query, *args, **kwargs):
        if query.dtype in (torch.bfloat16, torch.float16):
            with sdpa_kernel(SDPBackend.MATH):
                return own(query, *args, **kwargs)
        return own(query, *args, **kwargs)

    if refuses:
        F.scaled_dot_product_attention = routed
    yield refuses
    F.scaled_dot_product_attention = own
MOE_FAMILIES = ("tiny-qwen3-moe", "tiny-mixtral")  # mixture-of-experts: fused 3-D expert tensors


@pytest.fixture(scope="session")
def tiny():
    """`tiny(spec, seed)` -> LM, cached per (spec, seed) for the session; do not mutate."""
    cache = {}

    def get(spec: str, seed: int = 0) -> mismatch.LM:
        if (spec, seed) not in cache:
            cache[spec, seed] = mismatch.load(spec, seed=seed)
        return cache[spec, seed]

    return get


@pytest.fixture(scope="session")
def smollm2():
    return mismatch.load("smollm2-135m")


def random_ids(batch: int, length: int, seed: int = 0, low: int = 3, high: int = 259) -> torch.Tensor:
    return torch.randint(low, high, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- result rows made by hand

STAMP = {"mismatch_version": "0", "torch_version": "t", "transformers_version": "h", "git_sha": "g",
         "timestamp": "2026-01-01T00:00:00+00:00"}  # the provenance of rows no run wrote


def opd_rows(config, metrics: dict[str, dict[int, float]], *, columns=None):
    """An OPD run's tidy rows as `mismatch.opd.runs` writes them — `{"step", "metric", "value"}` per step
    (`trainer.train`'s records), `level="step"`, through `mismatch.results.tidy` — from `{metric: {step:
    value}}`. `columns(config)`: the run's columns (default `dataclasses.asdict`; `mismatch.opd.runs.run_columns`
    adds what a written run carries, such as the pair's digest)."""
    import dataclasses

    import pandas as pd

    from mismatch.results import tidy

    rows = [{"step": s, "metric": m, "value": v} for m, by_step in metrics.items() for s, v in by_step.items()]
    return tidy(pd.DataFrame(rows).assign(level="step"), kind="opd", config=(columns or dataclasses.asdict)(config),
                stamp=STAMP)


# ---------------------------------------------------------------- rounding, the slow way (references of the formats)


def slow_int_round(w_OI, bits, group):
    """Symmetric integer rounding of one matrix, group by group of input columns (slices, not reshapes)."""
    qmax = 2 ** (bits - 1) - 1
    out = torch.empty_like(w_OI)
    g = w_OI.shape[1] if group is None else group
    for c in range(0, w_OI.shape[1], g):
        cols = w_OI[:, c:c + g]
        amax = cols.abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        out[:, c:c + g] = torch.clamp(torch.round(cols / scale), -qmax - 1, qmax) * scale
    return out


def slow_fp8_round(w_OI, fmt, granularity):
    from mismatch.perturb.rounding import FP8_DTYPES, fp8_max

    """FP8 rounding of one matrix, scale by scale: the whole matrix, each row, or each 128×128 tile."""
    fmax = fp8_max(fmt)
    out = torch.empty_like(w_OI)
    R, C = w_OI.shape
    if granularity == "tensor":
        tiles = [(slice(0, R), slice(0, C))]
    elif granularity == "channel":
        tiles = [(slice(r, r + 1), slice(0, C)) for r in range(R)]
    else:
        tiles = [(slice(r, r + 128), slice(c, c + 128)) for r in range(0, R, 128) for c in range(0, C, 128)]
    for rows, cols in tiles:
        tile = w_OI[rows, cols]
        amax = tile.abs().amax()
        scale = amax / fmax if amax > 0 else torch.ones(())
        out[rows, cols] = (tile / scale).clamp(-fmax, fmax).to(FP8_DTYPES[fmt]).float() * scale
    return out
