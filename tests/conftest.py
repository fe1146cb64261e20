"""Shared fixtures: tiny random-init models of three dense and two MoE families and the real SmolLM2."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

import mismatch  # noqa: E402

FAMILIES = ("tiny-llama", "tiny-qwen3", "tiny-gpt2")
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
